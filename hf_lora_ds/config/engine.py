"""The engine fields: DeepSpeed and sequence parallelism, with the checks that need their values only, and the one
decision the rest of the package reads (``Engine``, made from the flags by ``engine_of``).

Only config/ and launch/ read ``--deepspeed`` and ``--sequence_parallel_size`` themselves (tests/test_layout.py): they
check the flags and resolve them in place (an ``accelerate launch`` config adopted, ``auto`` planned, a short name
made a path); everything else reads ``args.engine``, decided from the resolved flags (``engine_of``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hf_lora_ds.config.batching import VARLEN_ATTENTION, is_flash_attention
from hf_lora_ds.config.deepspeed import deepspeed_config_file, load_deepspeed_config
from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.errors import UserError

if TYPE_CHECKING:
    from transformers import TrainingArguments

    from hf_lora_ds.config.arguments import SFTTrainingArguments  # these checks read across the parts

__all__ = ["Engine", "EngineArguments", "check_engine_fields", "data_parallel_size", "engine_of", "parallelism_config"]

EngineKind = Literal["deepspeed", "fsdp", "none"]  # "none": Trainer's own, DDP over several ranks


@dataclass
class EngineArguments:
    """DeepSpeed (or FSDP, a TrainingArguments field) and Ulysses sequence parallelism."""

    # Redeclared for its help text: the memory plan resolves "auto" from the command line (launch.resolve).
    deepspeed: dict | str | None = field(
        default=None,
        metadata={
            "help": "A DeepSpeed JSON config (e.g. ds_configs/stage3.json), a shipped config by its short name "
            "(stage0, stage1, stage2, stage2_offload, stage3, stage3_offload), or 'auto': the first shipped config "
            "the memory plan says fits (python -m hf_lora_ds.plan shows the whole table). Under accelerate launch "
            "with a DeepSpeed config, that config is used (and must agree with this one when both are given)."
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


def check_engine_fields(args: SFTTrainingArguments) -> None:
    """One engine, ``auto`` already resolved, and what Ulysses needs from the flags alone (the world size and the
    model's heads are checked when the run is resolved: hf_lora_ds.launch.resolve)."""
    if args.deepspeed == "auto":
        raise UserError(
            "--deepspeed auto is resolved from the command line (hf_lora_ds.launch.resolve); pass a "
            "DeepSpeed config (e.g. ds_configs/stage3.json) when building the arguments in code"
        )
    if args.deepspeed and args.fsdp:
        raise UserError(f"--fsdp and --deepspeed {args.deepspeed}: choose one of FSDP and DeepSpeed")
    size = args.sequence_parallel_size
    if size < 1:
        raise UserError(f"--sequence_parallel_size must be a positive integer, got {size}")
    if size == 1:
        return
    flag = f"--sequence_parallel_size {size}"
    if not args.deepspeed:
        raise UserError(
            f"{flag} needs DeepSpeed (Ulysses is DeepSpeed's sequence parallelism): add --deepspeed "
            "stage2 (or stage1, stage3), or launch with an accelerate DeepSpeed config"
        )
    attention = args.attn_implementation or "sdpa"
    if attention in ("eager", "flex_attention") or attention.startswith("paged"):
        raise UserError(
            f"--attn_implementation {attention} with {flag}: Ulysses discards the attention mask this "
            "kernel needs; use sdpa (the default) or flash_attention_2"
        )
    if attention == VARLEN_ATTENTION:
        # Ulysses shards the flattened row after the collator computed cu_seq_lens for the whole of it, and no run has
        # shown its all-to-all around this kernel keeping the samples apart.
        raise UserError(
            f"--attn_implementation {attention} with {flag}: Ulysses is not proven with torch's varlen kernel; "
            "use flash_attention_2 (or sdpa with --batching padded)"
        )
    if args.batching in ("packed", "padding_free") and not is_flash_attention(attention):
        # UlyssesSPAttentionHF drops the block-diagonal mask transformers builds from restarting position_ids and runs
        # sdpa as plain causal over the gathered sequence; only flash's varlen path reads the boundaries itself.
        raise UserError(
            f"--batching {args.batching} with {flag} and {attention} attention: Ulysses drops the mask "
            "that keeps packed samples apart, so they would attend to each other; use --batching padded, "
            "or --attn_implementation flash_attention_2 on a GPU"
        )


def parallelism_config(size: int, attn_implementation: str):
    """accelerate's parallelism config for Ulysses over ``size`` ranks, or None for ``size`` 1.

    The sequence length may change from batch to batch (dynamic padding), and Ulysses must wrap the very kernel the
    model was loaded with (``attn_implementation``): DeepSpeed refuses a mismatch."""
    if size == 1:
        return None
    from accelerate import ParallelismConfig
    from accelerate.utils import DeepSpeedSequenceParallelConfig

    handler = DeepSpeedSequenceParallelConfig(
        sp_seq_length_is_variable=True, sp_attn_implementation=attn_implementation
    )
    return ParallelismConfig(sp_size=size, sp_backend="deepspeed", sp_handler=handler)


def data_parallel_size(world_size: int, sequence_parallel_size: int) -> int:
    """Groups of ranks that see different batches: each sequence-parallel group of ``N`` ranks trains one."""
    return world_size // sequence_parallel_size


@dataclass(frozen=True)
class Engine:
    """What the engine flags decided: the kind, DeepSpeed's config and ZeRO settings, the sequence-parallel size."""

    kind: EngineKind = "none"
    # The config in whichever form --deepspeed gave it (a shipped name, a file, base64, a dict), or the live dict
    # TrainingArguments built, Trainer's "auto" values filled in; None without DeepSpeed or before "auto" is planned.
    deepspeed_config: dict[str, Any] | None = None
    deepspeed_file: Path | None = None  # the file it was read from; None for a dict or base64 text
    sequence_parallel: int = 1

    @property
    def zero(self) -> ZeroSettings:
        """The ZeRO stage and offload; stage 0 without DeepSpeed."""
        return ZeroSettings.of(self.deepspeed_config)

    def data_parallel_size(self, world_size: int) -> int:
        return data_parallel_size(world_size, self.sequence_parallel)


def engine_of(args: TrainingArguments) -> Engine:
    """The engine ``args`` decide: ``SFTTrainingArguments`` keep it as their ``engine`` field, decided here once
    their flags are (launch/ resolves them in place before the run is built); a plain TrainingArguments (what a
    callback is handed) has no sequence parallelism."""
    return _decide(
        args.deepspeed,
        bool(args.fsdp),
        getattr(args, "sequence_parallel_size", 1),
        getattr(args, "hf_deepspeed_config", None),  # TrainingArguments sets it when built, with DeepSpeed only
    )


def _decide(deepspeed: str | dict | None, fsdp: bool, sequence_parallel: int, built: Any) -> Engine:
    if not (deepspeed or built):
        return Engine("fsdp" if fsdp else "none", sequence_parallel=sequence_parallel)
    if deepspeed == "auto":  # the memory plan picks the config (hf_lora_ds.launch.resolve)
        return Engine("deepspeed", sequence_parallel=sequence_parallel)
    config = built.config if built is not None else load_deepspeed_config(deepspeed)[0]
    file = deepspeed_config_file(deepspeed) if deepspeed else None
    return Engine("deepspeed", config, file, sequence_parallel)
