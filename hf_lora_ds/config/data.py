"""The data fields: sources, formats, truncation, batching, caching; and their checks from the values alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["DataArguments", "check_data_fields", "join_sources"]


@dataclass
class DataArguments:
    """What the run trains on and how samples become batches."""

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
        default=None,
        metadata={"help": "Held-out data from the same kinds of source, scored by --eval_task before and after."},
    )
    columns: str | None = field(
        default=None,
        metadata={
            "help": "Read other column names as the known fields, e.g. 'prompt=question,response=answer' "
            "(prompt/query: instruction, response: output; also system, input, messages, conversations, tools)."
        },
    )
    sharegpt_roles: str | None = field(
        default=None,
        metadata={
            "help": "Extra or changed ShareGPT 'from' names, e.g. 'bot=assistant,person=user' (roles: user, "
            "assistant, system, tool, function_call). Defaults: human/user, gpt/assistant, system, function_call, "
            "observation/tool."
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
        metadata={
            "help": "A sample that truncation leaves with no supervised token is dropped (and counted) or an error."
        },
    )
    batching: Literal["auto", "padded", "padding_free", "packed"] = field(
        default="auto",
        metadata={
            "help": "'padded': pad each batch to its longest sample. 'padding_free': flatten the batch with "
            "position_ids (needs an attention that supports it). 'packed': samples packed best-fit-decreasing into "
            "rows of --max_length (never split), position_ids restarting per sample so no sample attends to another; "
            "--per_device_train_batch_size counts rows. 'auto': padding-free with flash attention, where no token is "
            "padding and the kernel skips attention across samples; padded otherwise, since sdpa and eager build a "
            "full mask for flattened batches (measurements: bench/README.md)."
        },
    )
    # Redeclared for its default and help text: length-grouped padded batches waste the least padding.
    train_sampling_strategy: str = field(
        default="group_by_length",
        metadata={
            "help": "Training sample order. 'group_by_length' (default): random mega-batches of 50 batches, each "
            "sorted by length, so padded batches hold similar lengths and little padding (bench/README.md); no effect "
            "on speed with padding-free batches. "
            "The price: batches are less mixed (long ones and short ones alternate, so the per-step loss is noisier). "
            "'random': plain shuffling. Also 'sequential' and 'batch_rebalance' (transformers' samplers).",
            "choices": ["random", "sequential", "group_by_length", "batch_rebalance"],
        },
    )
    pad_to_multiple_of: int | None = field(
        default=None,
        metadata={"help": "Round padded batch lengths up to a multiple of this (e.g. 8 for tensor cores)."},
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
            "process only. Each worker adds memory and helps only with an idle core to run on (bench/README.md)."
        },
    )


def check_data_fields(args: SFTTrainingArguments) -> None:
    """The data and batching flags consistent (``args`` also carries ``use_cache``)."""
    if args.preprocessing_num_workers is not None and args.preprocessing_num_workers < 1:
        raise UserError(f"--preprocessing_num_workers must be a positive integer, got {args.preprocessing_num_workers}")
    if args.max_length < 2:
        raise UserError(f"--max_length must be at least 2 tokens, got {args.max_length}")
    if args.batching == "padding_free" and args.pad_to_multiple_of:
        raise UserError("--pad_to_multiple_of has no effect with --batching padding_free; drop one of them")
    if args.batching in ("padding_free", "packed") and args.use_cache:
        # transformers only detects packed sequences when no KV cache is built; with one, samples attend to each other.
        raise UserError(
            f"--batching {args.batching} needs --use_cache False (a KV cache hides the sequence boundaries)"
        )
    if args.pad_to_multiple_of is not None and args.pad_to_multiple_of < 1:
        raise UserError(f"--pad_to_multiple_of must be a positive integer, got {args.pad_to_multiple_of}")


def join_sources(args: SFTTrainingArguments) -> None:
    """A YAML list of sources for --train_file/--eval_file becomes the comma-separated flag text."""
    for flag in ("train_file", "eval_file"):
        spec = getattr(args, flag)
        if isinstance(spec, list):
            setattr(args, flag, ",".join(_source_text(entry) for entry in spec))


def _source_text(entry: str | dict) -> str:
    """One YAML source entry (``"a.jsonl:0.7"`` or ``{path: a.jsonl, weight: 0.7}``) as flag text."""
    if isinstance(entry, dict):
        return f"{entry.get('path', '')}:{entry['weight']}" if "weight" in entry else str(entry.get("path", ""))
    return str(entry)
