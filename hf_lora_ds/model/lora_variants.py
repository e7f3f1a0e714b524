"""LoRA variants: how the adapter starts (``--lora_init``) and how it is optimised (``--lora_optimizer``), checked
before anything loads, and described where the run shows its adapters (the coverage table, the audit).

Each PEFT init asks something different of a run: from nothing (``default``, ``gaussian``, ``orthogonal``); from the
base weights (``pissa``, ``olora``, ``corda``: the base keeps a rewritten residual, so the adapter is converted back at
the end, hf_lora_ds.model.adapter_conversion); from data (``eva``, ``corda``: a pass over training samples before step
1, hf_lora_ds.training.lora_init); ``loftq`` fits the 4-bit quantisation error, so it needs ``--load_in_4bit`` and its
adapter is saved for that 4-bit base, as any QLoRA adapter (bench/README.md says why not converted).
"""

from __future__ import annotations

import math
from pathlib import Path

from peft import LoraConfig

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.lora_init import DataPass, lora_init_from_peft
from hf_lora_ds.errors import UserError

__all__ = [
    "DEFAULT_LORAPLUS_RATIO",
    "LORA_OPTIMIZERS",
    "check_lora_variant",
    "check_lora_optimizer_engine",
    "variant_line",
]

LORA_OPTIMIZERS = ("adamw", "loraplus", "lorafa")
DEFAULT_LORAPLUS_RATIO = 16.0  # the LoRA+ paper's recommendation (2^4) for decoder LLMs


def check_lora_variant(args: SFTTrainingArguments) -> None:
    """Combinations that cannot work, refused from the flags alone (before anything loads) with one line."""
    init = args.lora_start
    quantized = "--load_in_4bit" if args.load_in_4bit else "--load_in_8bit" if args.load_in_8bit else None
    if init.loftq and not args.load_in_4bit:
        raise UserError(
            "--lora_init loftq fits the adapter to the 4-bit quantisation error of the base: add "
            "--load_in_4bit, or choose another --lora_init for a full-precision base"
        )
    if init.loftq and _no_full_precision_weights(args):
        raise UserError(
            f"--lora_init loftq reads the full-precision weights from the base's safetensors files, and "
            f"{args.model_name_or_path} has none; use a safetensors checkpoint of the base"
        )
    if init.rewrites_base and quantized:
        raise UserError(
            f"--lora_init {init.name} with {quantized}: {init.family} rewrites the base weights to their "
            "residual, which a quantized base would have to quantize again, and the adapter converted for "
            "the original base would then miss that error; use --lora_init loftq with --load_in_4bit"
        )
    if init.needs_even_rank and args.lora_rank % 2:
        raise UserError(f"--lora_init {init.name} needs an even --lora_rank, got {args.lora_rank}")
    if init.rewrites_base and args.fsdp:
        raise UserError(
            f"--lora_init {init.name} with --fsdp: the adapter's start is kept whole to convert the saved "
            "adapter and FSDP shards it; use DeepSpeed ZeRO-3 (--deepspeed stage3) to shard the run"
        )
    if args.use_dora and init.rewrites_base:
        raise UserError(
            f"--lora_init {init.name} with --use_dora: the adapter is converted at the end into its "
            "difference from the start, which DoRA's magnitude vectors cannot express; drop one"
        )
    if args.lora_init_samples < 1:
        raise UserError(f"--lora_init_samples must be a positive integer, got {args.lora_init_samples}")
    _check_lora_optimizer(args)


def _no_full_precision_weights(args: SFTTrainingArguments) -> bool:
    """A GGUF base, or a local directory without safetensors (a Hub id is looked up in the Hub cache later)."""
    source = Path(str(args.model_name_or_path))
    if args.gguf_file or source.suffix == ".gguf":
        return True
    return source.is_dir() and not any(source.glob("*.safetensors"))


def _check_lora_optimizer(args: SFTTrainingArguments) -> None:
    if args.lora_optimizer not in LORA_OPTIMIZERS:
        raise UserError(f"--lora_optimizer {args.lora_optimizer}: unknown; use one of {', '.join(LORA_OPTIMIZERS)}")
    ratio = args.loraplus_lr_ratio
    if ratio is not None and args.lora_optimizer != "loraplus":
        raise UserError(
            f"--loraplus_lr_ratio {ratio} has no effect with --lora_optimizer {args.lora_optimizer}: "
            "add --lora_optimizer loraplus or drop the ratio"
        )
    if ratio is not None and not 1 <= ratio < math.inf:  # nan fails both comparisons
        raise UserError(
            f"--loraplus_lr_ratio must be a finite number of at least 1 (B learns faster than A), got {ratio}"
        )
    if args.lora_optimizer == "lorafa" and args.use_dora:
        raise UserError(
            "--lora_optimizer lorafa with --use_dora: LoRA-FA pairs each module's lora_A with its lora_B "
            "and has no update for DoRA's magnitude vectors; drop one"
        )


def check_lora_optimizer_engine(
    args: SFTTrainingArguments, zero_stage: int | None, has_optimizer_section: bool, source: str
) -> None:
    """The LoRA optimizers against the engine: DeepSpeed must take our optimizer as its client optimizer (a config
    with its own ``optimizer`` section replaces it, and with it LoRA+'s parameter groups), and LoRA-FA updates each
    B from the whole of its A, which ZeRO's partitioned optimizer (stages 1-3) and FSDP's shards never hold."""
    if args.lora_optimizer == "adamw":
        return
    flag = f"--lora_optimizer {args.lora_optimizer}"
    if has_optimizer_section:
        raise UserError(
            f'{flag} with {source}: its "optimizer" section makes DeepSpeed build its own optimizer '
            "and drop this one's parameter groups; remove the section (Trainer's optimizer is used)"
        )
    if args.lora_optimizer == "lorafa" and (args.fsdp or (zero_stage or 0) >= 1):
        engine = "FSDP" if args.fsdp else f"ZeRO stage {zero_stage} ({source})"
        raise UserError(
            f"{flag} with {engine}: LoRA-FA projects each lora_B gradient through the whole lora_A, "
            "which a partitioned optimizer never holds; use ZeRO stage 0, DDP or one process, or "
            "--lora_optimizer loraplus"
        )


def variant_line(config: LoraConfig, args: SFTTrainingArguments | None = None) -> str | None:
    """One line on what the variant does to this run, shown under the coverage table; None for plain LoRA. ``args``:
    the run's flags (``lora_init``, ``lora_init_samples``, ``lora_optimizer``, ``loraplus_lr_ratio``); without them,
    what ``config`` says (an adapter built elsewhere)."""
    if args is None:
        init, optimizer = lora_init_from_peft(config.init_lora_weights), "adamw"
    else:
        init, optimizer = args.lora_start, args.lora_optimizer
    if init.plain and not config.use_dora and optimizer == "adamw":
        return None
    parts = [f"LoRA init {init.name}"]
    if init.data_pass is not None:
        samples = args.lora_init_samples if args is not None else None
        parts.append(f"a pass over {samples or 'the'} training samples before step 1")
    if init.rewrites_base:
        parts.append(f"adapter converted at the end to plain LoRA of rank {2 * config.r} for the original base")
    if init.rewrites_base and config.lora_dropout:
        # The adapter now carries the weights' principal part: dropout on its input drops that too (PiSSA's and
        # CorDA's authors train without it), so the training forward is not the base even at step 0.
        parts.append(
            f"--lora_dropout {config.lora_dropout:g} also drops the principal part the adapter holds (0 "
            "keeps the training forward at the base at the start)"
        )
    if init.data_pass is DataPass.EVA and config.rank_pattern:
        ranks = sorted({*config.rank_pattern.values(), config.r})
        parts.append(f"ranks after the data pass {ranks[0]}-{ranks[-1]} (budget r {config.r} a module)")
    if config.use_dora:
        parts.append("DoRA: + a magnitude vector per adapted module")
    if optimizer == "loraplus":
        ratio = args.loraplus_lr_ratio or DEFAULT_LORAPLUS_RATIO
        parts.append(f"LoRA+: B at {ratio:g}x the learning rate of A")
    elif optimizer == "lorafa":
        parts.append("LoRA-FA: A frozen, only B trains")
    return "; ".join(parts)
