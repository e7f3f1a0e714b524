"""LoRA variants: how the adapter starts (``--lora_init``) and how it is optimised (``--lora_optimizer``), checked
before anything loads, and described where the run shows its adapters (the coverage table, the audit).

PEFT 0.21 starts an adapter in one of three ways, and each asks something different of a run:

- from nothing: ``default`` (B zero, so the model starts exactly at the base), ``gaussian``, ``orthogonal``;
- from the base weights: ``pissa`` (and ``pissa_niter_N``, a randomized SVD), ``olora`` (QR), ``corda`` (an SVD
  weighted by the covariance of each layer's inputs). The adapter takes the weight's principal part and the base
  keeps the residual, so the base is rewritten: the adapter only means something on that residual until it is
  converted back into a plain LoRA adapter for the original base (PEFT's ``subtract_mutated_init``, done by
  hf_lora_ds.model.adapter_conversion at the end of the run);
- from data: ``eva`` (A from the SVD of each layer's input activations; ranks redistributed by explained variance)
  and ``corda`` run the base over training samples before step 1 (hf_lora_ds.training.lora_init).

``loftq`` fits the adapter to the 4-bit quantisation error of each weight (so it needs ``--load_in_4bit``): the model
starts nearer the full-precision base than the 4-bit one does. The trained model is the 4-bit base plus the adapter,
so the adapter is saved as trained, for that base, as any QLoRA adapter; converted for the full-precision base it
would still miss what rank r cannot hold of the quantisation error (measured on the demo model: further from the
trained model's logits than the unconverted adapter on that base, 9.2 against 8.0).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from peft import LoraConfig

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import UserError

__all__ = [
    "DEFAULT_LORAPLUS_RATIO",
    "INITS",
    "LORA_OPTIMIZERS",
    "check_lora_variant",
    "check_lora_optimizer_engine",
    "converted_at_save",
    "init_family",
    "needs_data_pass",
    "peft_init_lora_weights",
    "variant_line",
]

# --lora_init -> what it costs and gives, one line each (the flag's help and the README table say the same).
INITS: dict[str, str] = {
    "default": "A random, B zero: starts exactly at the base (Microsoft's LoRA)",
    "gaussian": "as default with A drawn from N(0, 1/r)",
    "pissa": "A, B from each weight's top-r singular vectors, the base keeps the residual: one SVD per weight at start",
    "pissa_niter_N": "PiSSA with a randomized SVD of N subspace iterations: seconds instead of minutes on big weights",
    "olora": "A, B from each weight's QR decomposition, the base keeps the residual",
    "eva": "A from the SVD of each layer's inputs over --lora_init_samples training samples, ranks redistributed",
    "corda": "A, B from each weight's SVD weighted by its inputs' covariance over --lora_init_samples samples",
    "loftq": "--load_in_4bit only: A, B fit to each weight's 4-bit quantisation error (rank r of it)",
    "orthogonal": "A, B random orthogonal (even rank): not zero, so the model starts slightly off the base",
}
LORA_OPTIMIZERS = ("adamw", "loraplus", "lorafa")
DEFAULT_LORAPLUS_RATIO = 16.0  # the LoRA+ paper's recommendation (2^4) for decoder LLMs
_PISSA_NITER = re.compile(r"pissa_niter_(\d+)")
_REWRITE_BASE = ("pissa", "olora", "corda")
_NEED_DATA = ("eva", "corda")


def init_family(init: str) -> str:
    """``pissa_niter_16`` -> ``pissa``; every other name is its own family. Unknown names are refused first."""
    return "pissa" if _PISSA_NITER.fullmatch(init) else init


def peft_init_lora_weights(init: str) -> bool | str:
    """PEFT's ``init_lora_weights`` for ``--lora_init``. LoftQ starts as default LoRA: PEFT's own LoftQ quantizes a
    full-precision base itself on a CUDA device, so the fit to a 4-bit base is done after wrapping
    (hf_lora_ds.model.quantization.fit_loftq)."""
    return True if init in ("default", "loftq") else init


def converted_at_save(init: str) -> bool:
    """Whether PEFT rewrites the base weights to their residual: the saved adapter is then rewritten as its
    difference from the start, a plain LoRA adapter of twice the rank for the original base; and switching the
    adapter off leaves a model nobody started from, while setting it back to its start gives the original base."""
    return init_family(init) in _REWRITE_BASE


def needs_data_pass(init: str) -> bool:
    return init in _NEED_DATA


def check_lora_variant(args: SFTTrainingArguments) -> None:
    """Combinations that cannot work, refused from the flags alone (before anything loads) with one line."""
    init = args.lora_init
    if init.startswith("pissa_niter_") and not _PISSA_NITER.fullmatch(init):
        raise UserError(f"--lora_init {init}: N in pissa_niter_N is the number of subspace iterations, a whole "
                        "number such as pissa_niter_4")  # fmt: skip
    if init not in INITS and not _PISSA_NITER.fullmatch(init):
        raise UserError(f"--lora_init {init}: unknown; use one of {', '.join(INITS)} (N: subspace iterations)")
    family = init_family(init)
    quantized = "--load_in_4bit" if args.load_in_4bit else "--load_in_8bit" if args.load_in_8bit else None
    if family == "loftq" and not args.load_in_4bit:
        raise UserError("--lora_init loftq fits the adapter to the 4-bit quantisation error of the base: add "
                        "--load_in_4bit, or choose another --lora_init for a full-precision base")  # fmt: skip
    if family == "loftq" and _no_full_precision_weights(args):
        raise UserError(f"--lora_init loftq reads the full-precision weights from the base's safetensors files, and "
                        f"{args.model_name_or_path} has none; use a safetensors checkpoint of the base")  # fmt: skip
    if family in _REWRITE_BASE and quantized:
        raise UserError(f"--lora_init {init} with {quantized}: {family} rewrites the base weights to their residual, "
                        "which a quantized base would have to quantize again, and the adapter converted for the "
                        "original base would then miss that error; use --lora_init loftq with --load_in_4bit")  # fmt: skip
    if family == "orthogonal" and args.lora_rank % 2:
        raise UserError(f"--lora_init orthogonal needs an even --lora_rank, got {args.lora_rank}")
    if converted_at_save(init) and getattr(args, "fsdp", None):
        raise UserError(f"--lora_init {init} with --fsdp: the adapter's start is kept whole to convert the saved "
                        "adapter and FSDP shards it; use DeepSpeed ZeRO-3 (--deepspeed stage3) to shard the run")  # fmt: skip
    if args.use_dora and converted_at_save(init):
        raise UserError(f"--lora_init {init} with --use_dora: the adapter is converted at the end into its "
                        "difference from the start, which DoRA's magnitude vectors cannot express; drop one")  # fmt: skip
    if args.lora_init_samples < 1:
        raise UserError(f"--lora_init_samples must be a positive integer, got {args.lora_init_samples}")
    _check_lora_optimizer(args)


def _no_full_precision_weights(args: SFTTrainingArguments) -> bool:
    """A GGUF base, or a local directory without safetensors (a Hub id is looked up in the Hub cache later)."""
    source = Path(str(args.model_name_or_path))
    if getattr(args, "gguf_file", None) or source.suffix == ".gguf":
        return True
    return source.is_dir() and not any(source.glob("*.safetensors"))


def _check_lora_optimizer(args: SFTTrainingArguments) -> None:
    if args.lora_optimizer not in LORA_OPTIMIZERS:
        raise UserError(f"--lora_optimizer {args.lora_optimizer}: unknown; use one of {', '.join(LORA_OPTIMIZERS)}")
    ratio = args.loraplus_lr_ratio
    if ratio is not None and args.lora_optimizer != "loraplus":
        raise UserError(f"--loraplus_lr_ratio {ratio} has no effect with --lora_optimizer {args.lora_optimizer}: "
                        "add --lora_optimizer loraplus or drop the ratio")  # fmt: skip
    if ratio is not None and not 1 <= ratio < math.inf:  # nan fails both comparisons
        raise UserError(f"--loraplus_lr_ratio must be a finite number of at least 1 (B learns faster than A), "
                        f"got {ratio}")  # fmt: skip
    if args.lora_optimizer == "lorafa" and args.use_dora:
        raise UserError("--lora_optimizer lorafa with --use_dora: LoRA-FA pairs each module's lora_A with its lora_B "
                        "and has no update for DoRA's magnitude vectors; drop one")  # fmt: skip


def check_lora_optimizer_engine(args: SFTTrainingArguments, zero_stage: int | None, has_optimizer_section: bool, source: str) -> None:
    """The LoRA optimizers against the engine: DeepSpeed must take our optimizer as its client optimizer (a config
    with its own ``optimizer`` section replaces it, and with it LoRA+'s parameter groups), and LoRA-FA updates each
    B from the whole of its A, which ZeRO's partitioned optimizer (stages 1-3) and FSDP's shards never hold."""
    if args.lora_optimizer == "adamw":
        return
    flag = f"--lora_optimizer {args.lora_optimizer}"
    if has_optimizer_section:
        raise UserError(f"{flag} with {source}: its \"optimizer\" section makes DeepSpeed build its own optimizer "
                        "and drop this one's parameter groups; remove the section (Trainer's optimizer is used)")  # fmt: skip
    if args.lora_optimizer == "lorafa" and (args.fsdp or (zero_stage or 0) >= 1):
        engine = "FSDP" if args.fsdp else f"ZeRO stage {zero_stage} ({source})"
        raise UserError(f"{flag} with {engine}: LoRA-FA projects each lora_B gradient through the whole lora_A, "
                        "which a partitioned optimizer never holds; use ZeRO stage 0, DDP or one process, or "
                        "--lora_optimizer loraplus")  # fmt: skip


def variant_line(config: LoraConfig, args: SFTTrainingArguments | None = None) -> str | None:
    """One line on what the variant does to this run, shown under the coverage table; None for plain LoRA. ``args``:
    the run's flags (``lora_init``, ``lora_init_samples``, ``lora_optimizer``, ``loraplus_lr_ratio``); without them,
    what ``config`` says (an adapter built elsewhere)."""
    init = getattr(args, "lora_init", None) or ("default" if config.init_lora_weights is True else str(config.init_lora_weights))
    optimizer = getattr(args, "lora_optimizer", "adamw")
    if init == "default" and not config.use_dora and optimizer == "adamw":
        return None
    parts = [f"LoRA init {init}"]
    if needs_data_pass(init):
        samples = getattr(args, "lora_init_samples", None)
        parts.append(f"a pass over {samples or 'the'} training samples before step 1")
    if converted_at_save(init):
        parts.append(f"adapter converted at the end to plain LoRA of rank {2 * config.r} for the original base")
    if converted_at_save(init) and config.lora_dropout:
        # The adapter now carries the weights' principal part: dropout on its input drops that too (PiSSA's and
        # CorDA's authors train without it), so the training forward is not the base even at step 0.
        parts.append(f"--lora_dropout {config.lora_dropout:g} also drops the principal part the adapter holds (0 "
                     "keeps the training forward at the base at the start)")  # fmt: skip
    if init == "eva" and config.rank_pattern:
        ranks = sorted({*config.rank_pattern.values(), config.r})
        parts.append(f"ranks after the data pass {ranks[0]}-{ranks[-1]} (budget r {config.r} a module)")
    if config.use_dora:
        parts.append("DoRA: + a magnitude vector per adapted module")
    if optimizer == "loraplus":
        parts.append(f"LoRA+: B at {getattr(args, 'loraplus_lr_ratio', None) or DEFAULT_LORAPLUS_RATIO:g}x the learning rate of A")
    elif optimizer == "lorafa":
        parts.append("LoRA-FA: A frozen, only B trains")
    return "; ".join(parts)
