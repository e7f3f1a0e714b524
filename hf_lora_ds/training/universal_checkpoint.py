"""Resume a DeepSpeed ZeRO checkpoint on another number of ranks, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint's optimizer state (fp32 LoRA weights, Adam moments) is partitioned over the ranks that wrote it and
loads only on that many. ``--resume_from_checkpoint`` converts it when the rank count differs: rank 0 runs DeepSpeed's
``ds_to_universal`` into ``global_stepN_universal`` (the partitions stay; a finished conversion is reused), the others
wait, and the engine is built with ``checkpoint.load_universal``. LoRA's frozen base weights are not in the checkpoint
and need not be: a universal load restores only what the optimizer owns. Refused before the model loads
(``universal_refusal``): no DeepSpeed, ZeRO stage 0, and NVMe optimizer offload.
"""

from __future__ import annotations

import json
import os
import re
from argparse import Namespace
from pathlib import Path

from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.distributed import gather_from_ranks
from hf_lora_ds.errors import UserError

__all__ = [
    "UNIVERSAL_MARKER",
    "convert_to_universal",
    "enable_universal_loading",
    "universal_refusal",
    "zero_checkpoint_world_size",
]

UNIVERSAL_MARKER = "universal_complete.json"
# DeepSpeed's per-rank optimizer partition (ZeRO 1-3, and its bf16 optimizer): <tag>/zero_pp_rank_<dp>_mp_rank_<mp>_...
_ZERO_OPTIMIZER_SHARD = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def zero_checkpoint_world_size(checkpoint: str | os.PathLike) -> int | None:
    """The number of ranks whose ZeRO optimizer partitions ``checkpoint`` holds, or None for a checkpoint without
    any (Trainer's own, or DeepSpeed without ZeRO)."""
    ranks = {
        int(match.group(1))
        for path in Path(checkpoint).glob("global_step*/*")
        if (match := _ZERO_OPTIMIZER_SHARD.match(path.name))
    }
    return len(ranks) or None


def universal_refusal(deepspeed_config: dict | None) -> str | None:
    """Why this run cannot load a universal checkpoint, or None when it can. ``deepspeed_config`` is the run's
    (loaded) DeepSpeed config, None without DeepSpeed."""
    if deepspeed_config is None:
        return "this run has no --deepspeed config, and only DeepSpeed's ZeRO optimizer reads a universal checkpoint"
    zero = ZeroSettings.of(deepspeed_config)
    if zero.stage == 0:
        return "this run's DeepSpeed config uses ZeRO stage 0, and only the ZeRO optimizer reads a universal checkpoint"
    if zero.optimizer_device == "nvme":
        return "NVMe optimizer offload restores per-rank swap files and skips DeepSpeed's universal loading"
    return None


def universal_tag(checkpoint: str | os.PathLike) -> str:
    """The DeepSpeed tag (``global_stepN``) the checkpoint's ``latest`` file names."""
    return Path(checkpoint, "latest").read_text().strip()


def convert_to_universal(checkpoint: str | os.PathLike) -> Path:
    """Convert ``checkpoint``'s ZeRO partitions into ``<checkpoint>/<tag>_universal`` with DeepSpeed's
    ``ds_to_universal`` (in this process, without worker processes), unless a finished conversion is there already.
    Returns the universal folder. Run on one rank only."""
    from deepspeed.checkpoint import ds_to_universal

    checkpoint = Path(checkpoint)
    tag = universal_tag(checkpoint)
    output = checkpoint / f"{tag}_universal"
    marker = output / UNIVERSAL_MARKER
    if marker.is_file():
        return output
    # Trainer's checkpoints lack Megatron-DeepSpeed's universal_checkpoint_info; without tensor-parallel slices to
    # describe it only carries a format version, which inject_missing_state supplies.
    options = dict(num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True)
    ds_to_universal.main(
        Namespace(input_folder=str(checkpoint / tag), output_folder=str(output), inject_missing_state=True, **options)
    )
    # ds_to_universal writes <checkpoint>/latest_universal (the tag the engine loads) next to its output folder.
    marker.write_text(json.dumps({"source": tag, "ranks": zero_checkpoint_world_size(checkpoint)}))
    return output


def enable_universal_loading(checkpoint: str | os.PathLike, deepspeed_config: dict, is_main_process: bool) -> Path:
    """Rank 0 converts ``checkpoint`` while the others wait, then ``checkpoint.load_universal`` is set in
    ``deepspeed_config``, the live dict the engine will be built from. A collective: every rank calls it, and a
    failed conversion raises the same ``UserError`` on every rank (none is left waiting)."""
    universal = Path(checkpoint, f"{universal_tag(checkpoint)}_universal")
    problem = None
    if is_main_process:
        try:
            convert_to_universal(checkpoint)
        except Exception as error:  # reported on every rank below, so no rank waits forever for rank 0
            problem = f"{type(error).__name__}: {error}"
    problem = gather_from_ranks(problem)[0]
    if problem:
        raise UserError(f"converting {checkpoint} to a DeepSpeed universal checkpoint in {universal} failed: {problem}")
    deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True
    return universal
