"""The speed stage's worker: this package and TRL's ``SFTTrainer`` (its defaults, then its fastest documented
settings) on the same model, chats and learning rate, one shape after another in one process, each timed by
``step_timing.StepTimer`` (steady-state rates, per-step breakdown, a profiler summary of the profiled steps).

Shapes: ``chats`` is today's launch-bound run (Qwen2.5-0.5B, 16 padded chats a step, up to 1,024 tokens);
``0.5b-packed`` and ``1.5b-packed`` are compute-bound (4 packed rows of 2,048 tokens a step). TRL's fastest settings
are padding-free batches (``chats``) or BFD packing (packed shapes), with FlashAttention-2 where flash-attn is
installed; its loss (TRL 1.16) is already chunked over the vocabulary (``nll``: no full logits). On packed shapes
TRL's default pads as many chats a step as the package's packed rows hold tokens, so each step does the same work.
Neither trainer checkpoints activations (run_sft's default; TRL's is on) and neither saves.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import import_module
from pathlib import Path
from traceback import format_exc
from typing import Any

import torch
from step_timing import StepTimer, Windows, profile_summary, profiled_events

__all__ = [
    "SpeedShape",
    "GPU_SHAPES",
    "TINY_SHAPES",
    "GPU_WINDOWS",
    "TINY_WINDOWS",
    "VARIANTS",
    "VARIANT_SHAPES",
    "speed_worker",
    "shape_row",
    "variant_skips",
]


@dataclass(frozen=True)
class SpeedShape:
    name: str
    model: str  # folder under the work folder (the build stage writes it)
    chats: str  # file under the work folder
    batch: int  # rows a step: padded chats, or packed rows
    max_length: int
    packed: bool


GPU_SHAPES = (
    SpeedShape("chats", "qwen", "chats.jsonl", 16, 1024, packed=False),
    SpeedShape("0.5b-packed", "qwen", "long_chats.jsonl", 4, 2048, packed=True),
    SpeedShape("1.5b-packed", "qwen-1.5b", "long_chats.jsonl", 4, 2048, packed=True),
)
# The dry run: one shape, the packed one (it takes every path the others do but TRL's padding-free without packing),
# on the tiny body with few tokens a step, since TRL's default logits (every position x 151,936 in fp32) take seconds
# a step on a shared CPU core: the suite pays for each run.
TINY_SHAPES = (SpeedShape("0.5b-packed", "qwen", "long_chats.jsonl", 1, 128, packed=True),)
GPU_WINDOWS = Windows(warmup=4, timed=12, profiled=3)
TINY_WINDOWS = Windows(warmup=1, timed=1, profiled=1)
TRAINERS = ("hf_lora_ds", "trl_default", "trl_fastest")
# The package's default run with one kernel choice changed each (the issue keeps a choice only where it wins), and
# whether it needs CUDA: torch's FlashAttention-2 varlen kernel for padding-free/packed rows; Liger's RMSNorm, SwiGLU
# and RoPE with the package's fused head; the same with Liger's fused linear cross-entropy for the loss instead;
# the decoder layers compiled (hf_lora_ds.training.compile); PEFT's form of the LoRA update instead of the package's
# one addmm (hf_lora_ds.training.lora_update: no flag, the trainer's list of layers emptied by TRAINER_CHANGES).
VARIANTS = {
    "hf_lora_ds_varlen": (["--attn_implementation", "varlen_attn"], True),
    "hf_lora_ds_liger": (
        ["--use_liger_kernel", "true", "--liger_kernel_config", '{"fused_linear_cross_entropy":false}'],
        True,
    ),
    "hf_lora_ds_liger_flce": (["--use_liger_kernel", "true"], True),
    "hf_lora_ds_compile": (["--torch_compile", "true"], False),
    "hf_lora_ds_peft_update": ([], False),
    # Not a kernel: whether the default dropout (0.05) is worth its copies of every adapted input (LLaMA-Factory's and
    # Unsloth's default is 0); last, so a deadline cuts it before the kernels.
    "hf_lora_ds_no_dropout": (["--lora_dropout", "0"], False),
}
TRAINER_CHANGES: dict[str, Callable[[Any], None]] = {
    "hf_lora_ds_peft_update": lambda trainer: setattr(trainer, "one_matmul_layers", []),
}
# Run by run_acceptance.py's variants stage, after the stages the goals read, so a deadline cuts variants,
# never the comparison with TRL or the planner's check: on two shapes (chats and the 1.5B packed rows), fewer steps.
VARIANT_SHAPES = ("chats", "1.5b-packed")
VARIANT_WINDOWS = Windows(warmup=3, timed=6, profiled=1)


def best_attention(on_cpu: bool) -> str:
    """FlashAttention-2 where flash-attn is installed on CUDA (TRL's documented padding-free kernel), else sdpa."""
    return "flash_attention_2" if not on_cpu and importlib.util.find_spec("flash_attn") else "sdpa"


@functools.cache
def _tokenizer(model_dir: Path) -> Any:
    """One load per model folder and process: Qwen2.5's 151,646-token vocabulary takes seconds to read."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@functools.cache
def _peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """The MFU denominator, once per process (on a CPU it is a matmul measurement)."""
    from hf_lora_ds.callbacks.throughput import peak_flops_per_device

    return peak_flops_per_device(device, dtype)


def mean_chat_tokens(model_dir: Path, chats: Path, max_length: int) -> float:
    """Mean tokenized length of the chats (truncated at ``max_length``), for TRL's default batch on packed shapes."""
    tokenizer = _tokenizer(model_dir)
    lengths = [
        min(
            len(
                tokenizer.apply_chat_template(json.loads(line)["messages"], tokenize=True, return_dict=True)[
                    "input_ids"
                ]
            ),
            max_length,
        )
        for line in chats.read_text(encoding="utf-8").splitlines()
    ]
    return sum(lengths) / len(lengths)


class _Run:
    """One trainer's run of one shape: the timer, the profile file, memory figures."""

    def __init__(self, out: Path, label: str, windows: Windows, on_cpu: bool) -> None:
        from hf_lora_ds.callbacks.throughput import _TokenCounter  # the counting the package's rates use

        self.out, self.label, self.on_cpu = out, label, on_cpu
        self.profile: dict = {}
        self.timer = StepTimer(windows, _TokenCounter, on_cuda=not on_cpu, profile=self._save_profile)

    def _save_profile(self, profiler: Any, wall_s: float) -> None:
        """The summary into profiles.json and the op table into profiles.txt, one entry per run: the device tool
        brings back at most 8 files, so every run shares these two."""
        steps = self.timer.windows.profiled
        self.profile = profile_summary(profiled_events(profiler), steps, wall_s)
        sort = "self_cpu_time_total" if self.on_cpu else "self_device_time_total"
        table = profiler.key_averages().table(sort_by=sort, row_limit=30, max_name_column_width=80)
        with open(self.out / "profiles.txt", "a", encoding="utf-8") as tables:
            tables.write(f"\n===== {self.label}: {steps} steps, {wall_s:.3f} s\n{table}\n")
        summaries = self.out / "profiles.json"
        found = json.loads(summaries.read_text(encoding="utf-8")) if summaries.is_file() else {}
        found[self.label] = self.profile
        summaries.write_text(json.dumps(found, indent=1) + "\n", encoding="utf-8")

    def measure(self, trainer: Any) -> dict:
        """Train under the timer; the steady-state figures, MFU, peak memory and the profile summary."""
        from hf_lora_ds.callbacks.throughput import flops_per_token, flops_shape

        self.timer.attach(trainer)
        model = trainer.model
        if not self.on_cpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        trainer.train()
        device = trainer.args.device
        figures = self.timer.result(device)
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point() and not p.requires_grad)
        peak, source = _peak_flops(device, dtype)
        per_token = flops_per_token(flops_shape(model), figures.get("mean_row_tokens", 0))
        figures["mfu"] = figures.get("tokens_per_second", 0) * per_token / peak
        figures["peak_tflops"], figures["peak_source"] = peak / 1e12, source
        if not self.on_cpu:
            figures["peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
            figures["peak_reserved_mib"] = torch.cuda.max_memory_reserved() / 2**20
        figures["steps"] = trainer.state.global_step
        figures["profile"] = self.profile
        return figures


def run_hf_lora_ds(
    shape: SpeedShape,
    work: Path,
    run: _Run,
    windows: Windows,
    change: tuple[str, ...] = (),
    trainer_change: Callable[[Any], None] | None = None,
) -> dict:
    """The package as run_sft runs it (its callbacks, its defaults; ``change``: a variant's flags, ``trainer_change``
    what it changes on the built trainer), built in-process so the timer can attach."""
    from hf_lora_ds import LoraSFTTrainer
    from hf_lora_ds.cli.log import configure_logging
    from hf_lora_ds.cli.run import parse_args

    configure_logging()
    argv = [
        *common_args(shape, work, windows),
        *(["--batching", "packed"] if shape.packed else []),
        "--output_dir",
        str(work / f"speed-{run.label}"),
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--save_strategy",
        "no",
        *(["--use_cpu", "true"] if run.on_cpu else []),
        *change,
    ]
    args = parse_args(argv)
    trainer = LoraSFTTrainer(args.model_name_or_path, args)
    if trainer_change is not None:
        trainer_change(trainer)
    figures = run.measure(trainer)
    merged: dict = {}
    for entry in trainer.state.log_history:
        merged.update(entry)
    kind = "cpu" if run.on_cpu else "gpu"  # the memory callback's peak, as the planner is compared with it
    figures["peak_memory_mib"] = merged.get(f"memory/train/{kind}_total_peak_mib_max")
    figures["attention"] = args.attn_implementation or "sdpa"
    figures["batching"] = args.batching
    figures["kernels"] = next((entry["kernels"] for entry in trainer.state.log_history if "kernels" in entry), None)
    return figures


def common_args(shape: SpeedShape, work: Path, windows: Windows) -> list[str]:
    """run_sft's flags for the shape: also what TRL's config is built from."""
    return [
        "--model_name_or_path",
        str(work / shape.model),
        "--train_file",
        str(work / shape.chats),
        "--eval_file",
        "",
        "--max_steps",
        str(windows.total),
        "--per_device_train_batch_size",
        str(shape.batch),
        "--max_length",
        str(shape.max_length),
        "--learning_rate",
        "1e-4",
        "--warmup_steps",
        "0",
        "--logging_steps",
        "10",
        "--seed",
        "0",
    ]


def run_trl(shape: SpeedShape, work: Path, run: _Run, windows: Windows, fastest: bool) -> dict:
    """TRL's SFTTrainer on the same chats (prompt/completion: the answer supervised, as run_sft does)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from hf_lora_ds.cli.run import parse_args
    from hf_lora_ds.model.lora import lora_config_from_args

    args = parse_args([*common_args(shape, work, windows), "--output_dir", str(work / "trl-args")])
    batch = shape.batch
    if shape.packed and not fastest:  # as many padded chats a step as the packed rows hold tokens
        batch = max(
            1,
            round(
                shape.batch
                * shape.max_length
                / mean_chat_tokens(work / shape.model, work / shape.chats, shape.max_length)
            ),
        )
    attention = best_attention(run.on_cpu) if fastest else "sdpa"
    dtype = torch.float32 if run.on_cpu else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(work / shape.model, dtype=dtype, attn_implementation=attention)
    rows = []
    for line in (work / shape.chats).read_text(encoding="utf-8").splitlines():
        messages = json.loads(line)["messages"]
        rows.append({"prompt": messages[:-1], "completion": messages[-1:]})
    config = SFTConfig(
        output_dir=str(work / f"speed-{run.label}"),
        max_steps=windows.total,
        per_device_train_batch_size=batch,
        learning_rate=args.learning_rate,
        warmup_steps=0,
        lr_scheduler_type=args.lr_scheduler_type,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        bf16=not run.on_cpu,
        use_cpu=run.on_cpu,
        gradient_checkpointing=False,
        # Padding-free without packing truncates nothing, and TRL refuses a max_length it would not enforce: the
        # chats are shorter than it (up to ~450 tokens against 1,024), so both settings see the same tokens.
        max_length=None if fastest and not shape.packed else shape.max_length,
        packing=fastest and shape.packed,
        padding_free=fastest,
    )
    trainer = SFTTrainer(
        model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=_tokenizer(work / shape.model),
        peft_config=lora_config_from_args(args),
    )
    figures = run.measure(trainer)
    figures.update(attention=attention, batch=batch, packing=config.packing, padding_free=config.padding_free)
    return figures


def shape_row(results: dict[str, dict]) -> dict:
    """One result row: each trainer's (and each variant's run) steady supervised tokens/s, MFU and device busy
    fraction, the package's ratios to TRL's default and fastest settings, and each variant's to the default."""
    row: dict[str, Any] = {}
    for trainer in (*TRAINERS, *(variant for variant in VARIANTS if variant in results)):
        figures = results.get(trainer, {})
        row[trainer] = {
            "supervised_tokens_per_second": figures.get("supervised_tokens_per_second"),
            "mfu": figures.get("mfu"),
            "device_busy_fraction": figures.get("profile", {}).get("device_busy_fraction"),
            "step_ms": figures.get("step_ms"),
        }
    ours = row["hf_lora_ds"]["supervised_tokens_per_second"]
    for trainer, key in (("trl_default", "over_trl_default"), ("trl_fastest", "over_trl_fastest")):
        theirs = row[trainer]["supervised_tokens_per_second"]
        row[key] = ours / theirs if ours and theirs else None
    for variant in (variant for variant in VARIANTS if variant in results):
        figures = row[variant]
        theirs = figures["supervised_tokens_per_second"]
        figures["over_hf_lora_ds"] = theirs / ours if ours and theirs else None
        for trainer in ("trl_default", "trl_fastest"):
            trl = row[trainer]["supervised_tokens_per_second"]
            figures[f"over_{trainer}"] = theirs / trl if theirs and trl else None
    return row


def _released() -> None:
    """What one trainer left on the device goes before the next starts."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_shape(shape: SpeedShape, work: Path, out: Path, windows: Windows, on_cpu: bool) -> dict:
    """The shape's three runs, one after another; a run that fails is recorded (its traceback's tail included) and
    the next one runs."""
    runs: dict[str, Callable[[_Run], dict]] = {
        "hf_lora_ds": lambda run: run_hf_lora_ds(shape, work, run, windows),
        "trl_default": lambda run: run_trl(shape, work, run, windows, fastest=False),
        "trl_fastest": lambda run: run_trl(shape, work, run, windows, fastest=True),
    }
    return _run_each(shape, runs, out, windows, on_cpu)


def run_variants(shape: SpeedShape, work: Path, out: Path, on_cpu: bool) -> dict:
    """The variants' runs of the shape, with fewer steps (``VARIANT_WINDOWS``); one that needs CUDA is recorded as
    skipped on the CPU."""
    runs = {
        variant: lambda run, change=change, variant=variant: run_hf_lora_ds(
            shape, work, run, VARIANT_WINDOWS, tuple(change), TRAINER_CHANGES.get(variant)
        )
        for variant, (change, needs_cuda) in VARIANTS.items()
        if not (needs_cuda and on_cpu)
    }
    return _run_each(shape, runs, out, VARIANT_WINDOWS, on_cpu)


def variant_skips(on_cpu: bool, tiny: bool) -> dict[str, dict]:
    """Why a variant has no run here: CUDA-only kernels on the CPU; the others on the dry run, where inductor's
    compile of the layers alone takes longer than the whole stage's other runs."""
    if not (on_cpu or tiny):
        return {}
    reasons = {variant: "needs CUDA" for variant, (_, needs_cuda) in VARIANTS.items() if needs_cuda and on_cpu}
    return {variant: {"skipped": reasons.get(variant, "not on the dry run (its time)")} for variant in VARIANTS}


def _run_each(shape: SpeedShape, runs: dict[str, Callable[[_Run], dict]], out: Path, windows: Windows, on_cpu: bool):
    found: dict = {"shape": asdict(shape)}
    for trainer, runner in runs.items():
        started = time.monotonic()
        try:
            found[trainer] = runner(_Run(out, f"{shape.name}-{trainer}", windows, on_cpu))
        except Exception as err:  # noqa: BLE001  (recorded; the next trainer still runs)
            found[trainer] = {"error": f"{type(err).__name__}: {err}"[-3000:], "traceback": format_exc()[-3000:]}
        found[trainer]["seconds"] = round(time.monotonic() - started, 1)
        print(f"speed {shape.name} {trainer}: {json.dumps(found[trainer], default=str)[:400]}", file=sys.stderr)
        _released()
    found["row"] = shape_row(found)
    return found


def _import_as_a_command() -> None:
    """Both trainers' modules imported as run_sft's process imports its own (hf_lora_ds.command_process): PEFT
    without bitsandbytes, then everything imported kept out of the collector's walks. Both trainers then run in the
    same process, on the same footing."""
    from hf_lora_ds.command_process import command_imports

    with command_imports():
        import_module("trl")
        import_module("datasets")
        import_module("hf_lora_ds.cli.run")


def speed_worker(
    work: Path, out: Path, shape_names: list[str], tiny: bool, on_cpu: bool, variants: bool = False
) -> dict:
    """The named shapes' runs in this process: the three trainers', or (``variants``) the variants'."""
    _import_as_a_command()
    shapes = {shape.name: shape for shape in (TINY_SHAPES if tiny else GPU_SHAPES)}
    windows = VARIANT_WINDOWS if variants else TINY_WINDOWS if tiny else GPU_WINDOWS
    if variants:
        found = {name: run_variants(shapes[name], work, out, on_cpu) for name in shape_names}
    else:
        found = {name: run_shape(shapes[name], work, out, windows, on_cpu) for name in shape_names}
    return {"windows": asdict(windows), "shapes": found}
