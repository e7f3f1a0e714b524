"""``SFTTrainingArguments``: TrainingArguments plus the model, data and LoRA fields of a LoRA SFT run.

One dataclass (rather than three) because DeepSpeed's "auto" values, the precision choice and the batch checks all
need to see the training fields and ours together. Invalid combinations fail in ``__post_init__``, before any model
is loaded, with a message that says which flag to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

import torch
import yaml
from transformers import TrainingArguments

from hf_lora_ds.config.batching import resolve_batching
from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.thinking import ThinkingOptions
from hf_lora_ds.devices import auto_dtype
from hf_lora_ds.distributed import launcher_world_size
from hf_lora_ds.errors import MissingPathError, UserError, one_line
from hf_lora_ds.launch.accelerate_launch import fsdp_settings
from hf_lora_ds.launch.checks import check_fields, check_sequence_parallel, check_training_flags
from hf_lora_ds.launch.deepspeed_config import (
    check_deepspeed_config,
    deepspeed_config_path,
    load_deepspeed_config,
)
from hf_lora_ds.model.lora_variants import check_lora_optimizer_engine
from hf_lora_ds.training.sequence_parallel import data_parallel_size, deepspeed_gradient_divisor, parallelism_config

__all__ = ["SFTTrainingArguments", "pinned_memory_helps", "read_arguments_file"]


@dataclass
class SFTTrainingArguments(TrainingArguments):
    # ---- model ----
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Base model: a local directory or a hub id (any causal LM with a chat template)."}
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = field(
        default="auto",
        metadata={
            "help": "Dtype to load the base weights in. 'auto': bfloat16 on a GPU that supports it (and bf16 training), "
            "float32 elsewhere, since bf16 LoRA training on CPUs ran ~20x slower than fp32."
        },
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow the model's own Python code from its repository to run. Off by default."}
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "Attention kernel: 'sdpa', 'eager' or 'flash_attention_2'. None: transformers' pick."}
    )
    gguf_file: str | None = field(
        default=None,
        metadata={
            "help": "A GGUF base (llama.cpp, Ollama): the file's name inside --model_name_or_path DIR (or pass the "
            ".gguf path as --model_name_or_path). Loaded dequantized to --dtype, with its tokenizer and chat "
            "template; needs the gguf package (pip install 'hf_lora_ds[gguf]')."
        },
    )
    # ---- quantized base (QLoRA) ----
    load_in_4bit: bool = field(
        default=False,
        metadata={"help": "QLoRA: load the base in 4 bits with bitsandbytes (~1/4 of bf16 memory); LoRA trains on top."},
    )
    bnb_4bit_quant_type: Literal["nf4", "fp4"] = field(
        default="nf4", metadata={"help": "4-bit data type: 'nf4' (NormalFloat, the QLoRA paper's) or 'fp4'."}
    )
    bnb_4bit_use_double_quant: bool = field(
        default=True, metadata={"help": "Quantize the 4-bit scales too (~0.4 bits/weight less, same accuracy)."}
    )
    load_in_8bit: bool = field(
        default=False, metadata={"help": "Load the base in 8 bits (LLM.int8) with bitsandbytes: ~1/2 of bf16 memory."}
    )
    # ---- data ----
    train_file: str | None = field(
        default=None,
        metadata={
            "help": "Training data: a .json/.jsonl/.parquet file, a datasets.save_to_disk directory, a folder of such "
            "files, or a Hub dataset id (name, name:config, name@split); several mixed by weight as "
            "'a.jsonl:0.7,b_dir:0.3' (or a list in the YAML file); LLaMA-Factory's dataset_info.json with --dataset. "
            "Records: alpaca (with history), messages (with tool calls), ShareGPT, TRL prompt/completion and text."
        },
    )
    dataset: str | None = field(
        default=None,
        metadata={
            "help": "With --train_file path/to/dataset_info.json (LLaMA-Factory's, or its folder): the entries to "
            "train on, 'NAME[,NAME]', each read with its own formatting, columns and tags, concatenated."
        },
    )
    eval_file: str | None = field(
        default=None, metadata={"help": "Held-out data from the same kinds of source, scored by --eval_task before and after."}
    )
    columns: str | None = field(
        default=None,
        metadata={
            "help": "Read other column names as the known fields, e.g. 'prompt=question,response=answer' (prompt/query: "
            "instruction, response: output; also system, input, messages, conversations, tools)."
        },
    )
    sharegpt_roles: str | None = field(
        default=None,
        metadata={
            "help": "Extra or changed ShareGPT 'from' names, e.g. 'bot=assistant,person=user' (roles: user, assistant, "
            "system, tool, function_call). Defaults: human/user, gpt/assistant, system, function_call, observation/tool."
        },
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System turn added to records without one. None keeps the chat template's own default."},
    )
    max_length: int = field(default=2048, metadata={"help": "Samples longer than this many tokens are truncated."})
    assistant_turns: Literal["all", "last"] = field(
        default="all", metadata={"help": "Train on every assistant turn of a conversation, or on the last one only."}
    )
    train_reasoning: bool = field(
        default=True,
        metadata={
            "help": "Thinking models: train the reasoning of assistant turns that carry it (reasoning_content, <think> "
            "in the content, alpaca 'reasoning'), or mask it and train the answer after it only."
        },
    )
    empty_think: Literal["train", "mask"] = field(
        default="mask",
        metadata={
            "help": "Thinking models: the empty <think></think> block the template writes for a turn without "
            "reasoning. mask (default): kept in the input, as in the enable_thinking=False prompt at inference, but "
            "not learnt, so answers without reasoning do not teach a thinking model to stop thinking; train: the "
            "model learns to write it, i.e. to answer without thinking unless asked."
        },
    )
    on_empty_labels: Literal["drop", "error"] = field(
        default="drop",
        metadata={"help": "A sample that truncation leaves with no supervised token is dropped (and counted) or an error."},
    )
    batching: Literal["auto", "padded", "padding_free", "packed"] = field(
        default="auto",
        metadata={
            "help": "'padded': pad each batch to its longest sample. 'padding_free': flatten the batch with position_ids "
            "(needs an attention that supports it). 'packed': samples packed best-fit-decreasing into rows of "
            "--max_length (never split), position_ids restarting per sample so no sample attends to another; "
            "--per_device_train_batch_size counts rows. 'auto': padding-free with flash attention, where no token is "
            "padding and the kernel skips attention across samples; padded otherwise, since sdpa and eager build a "
            "full mask for flattened batches: on the CPU padded + group_by_length ran 1.78x and padding-free 0.60x the "
            "supervised tokens/s of pad-to-max_length (bench/padding.py)."
        },
    )
    sequence_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Split each sequence over this many ranks (DeepSpeed Ulysses sequence parallelism, through "
            "accelerate's ParallelismConfig): each rank keeps 1/N of the activations, for sequences one device cannot "
            "hold. Needs --deepspeed (ZeRO 1-3), a world size divisible by N, attention heads divisible by N and sdpa "
            "or flash attention. The ranks of a group train the same batch: the global batch is per device x "
            "accumulation x world size / N. Gradients equal one process's on that global batch."
        },
    )
    # Redeclared for its default and help text: length-grouped padded batches were the fastest on the CPU.
    train_sampling_strategy: str = field(
        default="group_by_length",
        metadata={
            "help": "Training sample order. 'group_by_length' (default): random mega-batches of 50 batches, each sorted "
            "by length, so padded batches hold similar lengths: 1.78x the supervised tokens/s of pad-to-max_length "
            "on the CPU against 1.21x for 'random' (bench/padding.py); no effect on speed with padding-free batches. "
            "The price: batches are less mixed (long ones and short ones alternate, so the per-step loss is noisier). "
            "'random': plain shuffling. Also 'sequential' and 'batch_rebalance' (transformers' samplers).",
            "choices": ["random", "sequential", "group_by_length", "batch_rebalance"],
        },
    )
    pad_to_multiple_of: int | None = field(
        default=None, metadata={"help": "Round padded batch lengths up to a multiple of this (e.g. 8 for tensor cores)."}
    )
    supervised_logits_only: bool = field(
        default=True,
        metadata={
            "help": "Apply the LM head and the fp32 cross-entropy only at positions whose label is trained (not -100): "
            "the same loss and gradients as full logits, without the vocabulary-sized logits of every prompt, padding "
            "and user token. False: full logits, as transformers computes them. Needs a model whose forward takes a "
            "boolean logits_to_keep mask (others, --use_liger_kernel, label smoothing and compute_loss_func use the "
            "full path, said once at start). Evaluations whose metrics read logits always get full logits."
        },
    )
    dataset_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "Where the records read from data files (Arrow) and the tokenized samples are cached, keyed on the "
            "file, the tokenizer and the settings, so a second run reads them instead of tokenizing again. None: the "
            "datasets library's cache (HF_DATASETS_CACHE/hf_lora_ds)."
        },
    )
    preprocessing_num_workers: int | None = field(
        default=None,
        metadata={
            "help": "Processes that validate and tokenize the records (num_proc of datasets' map). None: the main "
            "process only. Each worker adds ~0.3 GiB (PSS) and helps only with an idle core to run on: on a 2-core CPU "
            "busy with other jobs, 2 workers gave 368-523 samples/s against 509 for 1 (bench/data_scale.py)."
        },
    )
    # ---- LoRA ----
    lora_rank: int = field(default=8, metadata={"help": "LoRA rank r."})
    lora_alpha: float = field(default=16, metadata={"help": "LoRA scaling numerator (scale = alpha / r, or / sqrt(r))."})
    lora_dropout: float = field(default=0.05, metadata={"help": "Dropout on the LoRA input, in [0, 1)."})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "Comma-separated module names to adapt, or 'all-linear' for every linear layer but the head."},
    )
    lora_allow_partial: bool = field(
        default=False,
        metadata={
            "help": "Train even when the LoRA targets leave whole decoder layers, or the experts most layers have, "
            "without an adapter (the coverage table printed at start shows where the adapters are)."
        },
    )
    use_rslora: bool = field(default=False, metadata={"help": "Rank-stabilised LoRA: scale by alpha / sqrt(r)."})
    use_dora: bool = field(default=False, metadata={"help": "Weight-decomposed LoRA (DoRA)."})
    lora_init: str = field(
        default="default",
        metadata={
            "help": "How the adapter starts (PEFT's init_lora_weights; trade-offs in hf_lora_ds.model.lora_variants "
            "and the README): default (B zero: the base exactly), gaussian, pissa / pissa_niter_N (top singular "
            "vectors of each weight; the base keeps the residual), olora (QR of each weight), eva (SVD of each "
            "layer's inputs over --lora_init_samples training samples; ranks redistributed), corda (SVD weighted "
            "by those inputs' covariance), loftq (--load_in_4bit only: fits the 4-bit quantisation error), "
            "orthogonal (even rank). pissa/olora/corda rewrite the base to its residual: their adapter is saved "
            "converted to plain LoRA of twice the rank for the original base."
        },
    )
    lora_init_samples: int = field(
        default=256,
        metadata={
            "help": "Training samples EVA and CorDA run through the base before step 1 (the same ones on every "
            "rank, so the start does not depend on the rank count). More: a steadier start, a longer pass."
        },
    )
    lora_optimizer: Literal["adamw", "loraplus", "lorafa"] = field(
        default="adamw",
        metadata={
            "help": "adamw: Trainer's optimizer (--optim). loraplus: the same optimizer with B at "
            "--loraplus_lr_ratio x the learning rate of A (LoRA+, peft.optimizers). lorafa: A frozen at its init, "
            "B's gradient projected (LoRA-FA, its own AdamW): no gradients or Adam moments for A; one process, "
            "DDP or ZeRO-0 only."
        },
    )
    loraplus_lr_ratio: float | None = field(
        default=None,
        metadata={"help": "LoRA+: learning rate of B over that of A (>= 1; default 16, the LoRA+ paper's choice)."},
    )
    # ---- memory plan (hf_lora_ds.plan) ----
    device_memory: str | None = field(
        default=None,
        metadata={
            "help": "Memory per device for the memory plan, e.g. 24GiB or 80GB. Default: the accelerator's; on a "
            "CPU-only machine the host memory, shared by the ranks."
        },
    )
    check_memory_plan: bool = field(
        default=True,
        metadata={
            "help": "On an accelerator, stop before loading the model when the memory plan says the run will not fit "
            "(with the configurations that would). False: print the plan line and try anyway."
        },
    )
    # ---- answer-accuracy eval ----
    eval_task: str = field(
        default="sum_to_x", metadata={"help": "Task that scores generated answers on --eval_file (see hf_lora_ds.eval)."}
    )

    # Redeclared for its help text: "auto" is resolved from the command line by the memory plan (hf_lora_ds.launch.cli).
    deepspeed: dict | str | None = field(
        default=None,
        metadata={
            "help": "A DeepSpeed JSON config (e.g. ds_configs/stage3.json), a shipped config by its short name "
            "(stage0, stage1, stage2, stage2_offload, stage3, stage3_offload), or 'auto': the first shipped config "
            "the memory plan says fits (python -m hf_lora_ds.plan shows the whole table). Under accelerate launch "
            "with a DeepSpeed config, that config is used (and must agree with this one when both are given)."
        },
    )

    # ---- logging ----
    # Redeclared only for their help text: hf_lora_ds.callbacks.swanlab picks the SwanLab names they leave open.
    project: str = field(
        default="huggingface",
        metadata={
            "help": "SwanLab (and Trackio) project. Left at 'huggingface' (transformers' default), SwanLab's is "
            "'<model basename>-lora-sft', e.g. Qwen2.5-0.5B-Instruct-lora-sft, unless SWANLAB_PROJ_NAME is set."
        },
    )
    run_name: str | None = field(
        default=None,
        metadata={
            "help": "Name of the run in SwanLab (and wandb, mlflow, ...). None: SwanLab's run is named after "
            "--output_dir's last folder, unless SWANLAB_EXP_NAME is set."
        },
    )

    # ---- reliability ----
    on_nonfinite: Literal["stop", "skip"] = field(
        default="stop",
        metadata={
            "help": "A NaN or infinite training loss or gradient norm: 'stop' the run before its update, naming the "
            "step, the samples of the batch and the last complete checkpoint; or 'skip' the step (no update from "
            "that batch on any rank) and go on, counting skips as nonfinite_skipped in the training logs."
        },
    )

    on_divergence: Literal["warn", "stop"] = field(
        default="warn",
        metadata={
            "help": "A training loss over 3x its running median, or a gradient norm of exactly 0 after non-zero "
            "ones (a finite run diverging, hf_lora_ds.callbacks.divergence): 'warn' prints one line with the step, 'stop' ends "
            "the run there (exit code 2). The step is recorded as divergence_step in the training logs."
        },
    )

    # Redeclared only for its help text: run_sft and LoraSFTTrainer.train resolve "auto" (hf_lora_ds.training.checkpoints).
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint-N directory to resume from, or 'auto' for the latest checkpoint in --output_dir "
            "that every rank finished writing (a fresh start when there is none)."
        },
    )

    def __post_init__(self) -> None:
        """The checks of the fields, alone and together, before TrainingArguments builds anything from them; then the
        values TrainingArguments needs resolved first (``--dtype auto`` and the mixed precision that goes with it).
        Resolving the run around them (``--deepspeed auto``, an ``accelerate launch`` config, the launcher's
        environment, the world-size agreement with DeepSpeed) is hf_lora_ds.launch.cli.parse_run_arguments' work."""
        check_fields(self)
        check_training_flags(self)
        check_sequence_parallel(self, launcher_world_size())
        deepspeed = self._check_deepspeed_config()
        config, source = deepspeed or ({}, "")
        stage = ZeroSettings.of(config).stage if deepspeed else None
        check_lora_optimizer_engine(self, stage, "optimizer" in config, source)
        self._check_fsdp()
        self._check_quantization(deepspeed)
        self._resolve_precision()
        self.batching = resolve_batching(self.batching, self.attn_implementation)  # what the planner and trainer read
        if self.sequence_parallel_size > 1:  # the kernel is pinned again once the model is loaded (LoraSFTTrainer)
            self.parallelism_config = parallelism_config(self.sequence_parallel_size, self.attn_implementation or "sdpa")
        if not pinned_memory_helps(self.use_cpu):
            self.dataloader_pin_memory = False  # else every DataLoader warns that pinning did nothing
        super().__post_init__()

    @property
    def format_options(self) -> FormatOptions:
        return FormatOptions.from_flags(self.columns, self.sharegpt_roles)

    @property
    def thinking_options(self) -> ThinkingOptions:
        return ThinkingOptions(self.train_reasoning, self.empty_think)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    def _check_deepspeed_config(self) -> tuple[dict, str] | None:
        """The DeepSpeed config, loaded once and checked before transformers parses it (its errors come later and
        name neither the key nor the flag to change); a shipped config's short name (``stage3``) becomes its path.
        ``auto`` must have been resolved by the memory planner already (hf_lora_ds.launch.cli)."""
        if self.deepspeed == "auto":
            raise UserError("--deepspeed auto is resolved from the command line by hf_lora_ds.launch.cli.parse_run_arguments; "
                            "pass a DeepSpeed config (e.g. ds_configs/stage3.json) when building the arguments in code")
        if self.deepspeed and self.fsdp:
            raise UserError(f"--fsdp and --deepspeed {self.deepspeed}: choose one of FSDP and DeepSpeed")
        if not self.deepspeed:
            return None
        if isinstance(self.deepspeed, str):
            self.deepspeed = deepspeed_config_path(self.deepspeed)
        config, source = load_deepspeed_config(self.deepspeed)
        check_deepspeed_config(
            config,
            source,
            micro_batch=self.per_device_train_batch_size,
            accumulation=self.gradient_accumulation_steps,
            world_size=data_parallel_size(launcher_world_size(), self.sequence_parallel_size),
        )
        if self.sequence_parallel_size > 1:
            deepspeed_gradient_divisor(config, launcher_world_size(), self.sequence_parallel_size)  # refuses what it cannot scale
        return config, source

    def _check_fsdp(self) -> None:
        """FSDP2 only (transformers' own default); parameter offload only where there is an accelerator to offload
        from (on a CPU-only machine torch's CPUOffloadPolicy fails after loading: no accelerator device)."""
        if not self.fsdp:
            return
        settings = fsdp_settings(self.fsdp_config)
        if str(settings.get("version", 2)) != "2":
            raise UserError(f"--fsdp_config version {settings['version']}: hf_lora_ds runs FSDP2 (version 2) only")
        if settings.get("cpu_offload") and torch.accelerator.current_accelerator() is None:
            raise UserError("FSDP cpu_offload moves parameters from an accelerator to host memory, and this machine "
                            "has none: drop cpu_offload (fsdp_configs/fsdp2.json)")  # fmt: skip

    def _check_quantization(self, deepspeed: tuple[dict, str] | None) -> None:
        """Combinations that fail (or silently do nothing) with a bitsandbytes base, refused before loading;
        ``deepspeed`` is the run's DeepSpeed config and its name (None without DeepSpeed)."""
        if not (self.load_in_4bit or self.load_in_8bit):
            return
        if self.load_in_4bit and self.load_in_8bit:
            raise ValueError("--load_in_4bit and --load_in_8bit: choose one")
        flag = "--load_in_4bit" if self.load_in_4bit else "--load_in_8bit"
        if self.fsdp:
            # FSDP2's fully_shard needs every parameter as a plain tensor it can split into DTensor shards; the
            # bitsandbytes Params4bit/Int8Params subclasses and their quantization state do not survive that.
            raise ValueError(f"{flag} with FSDP: bitsandbytes' quantized weights cannot be sharded by FSDP2's "
                             "fully_shard; use DeepSpeed ZeRO-3 (--deepspeed stage3) for a sharded QLoRA run")
        config, source = deepspeed or ({}, "")
        if ZeroSettings.of(config).offloads_params:
            # Observed: a 4-bit base under ds_configs/stage3_offload.json trains, then hangs in the final save. And a
            # base quantized to fit the GPU gains nothing from being moved to CPU memory.
            named = "" if source == "--deepspeed" else f" in {source}"  # a dict: adopted from accelerate launch
            zero = ZeroSettings.of(config).describe()
            raise ValueError(f"{flag} with a DeepSpeed config that offloads parameters (DeepSpeed {zero})"
                             f"{named}: use ds_configs/stage3.json (or stage2_offload.json to offload the optimizer "
                             "state only)")

    def _resolve_precision(self) -> None:
        """Weights dtype and mixed precision must agree, or DeepSpeed and autocast disagree about every tensor."""
        if self.dtype == "auto":
            self.dtype = auto_dtype(on_accelerator=torch.cuda.is_available() and not self.use_cpu, fp16=self.fp16)
        if self.dtype == "bfloat16" and self.fp16:
            raise UserError("--dtype bfloat16 with --fp16: use --bf16 (or --dtype float16 with --fp16)")
        if self.dtype == "float16" and self.bf16:
            raise UserError("--dtype float16 with --bf16: use --fp16 (or --dtype bfloat16 with --bf16)")
        if self.dtype == "bfloat16":
            self.bf16 = True
        elif self.dtype == "float16":
            self.fp16 = True


def pinned_memory_helps(use_cpu: bool) -> bool:
    """Pinned host memory only speeds copies to an accelerator: with none (or ``--use_cpu``) it does nothing."""
    return not use_cpu and torch.accelerator.current_accelerator() is not None


def read_arguments_file(path: Path) -> dict:
    """The file's keys, refused by name when one is not an argument (a typo would otherwise be ignored)."""
    if not path.is_file():
        raise MissingPathError(f"{path}: no such config file; pass a YAML/JSON file of arguments, or flags")
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a readable YAML/JSON file ({one_line(str(err))})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: expected a mapping of argument names to values, got {type(config).__name__}")
    unknown = sorted(set(config) - {known.name for known in fields(SFTTrainingArguments)})
    if unknown:
        raise UserError(f"{path}: unknown argument(s) {unknown}; see python run_sft.py --help")
    return config
