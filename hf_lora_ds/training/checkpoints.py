"""``--resume_from_checkpoint PATH|auto``, where ``auto`` never picks a checkpoint that a kill cut short.

transformers (5.x) writes ``checkpoint-N`` in place, file by file, and rank 0 may finish while other ranks still
write; its ``get_last_checkpoint`` takes the highest directory, complete or not, so a job killed during a save resumes
from a torn checkpoint. ``CheckpointCompletionCallback`` writes ``checkpoint_complete.json`` (every file and its size,
atomically, after a barrier) and ``auto`` takes the highest checkpoint whose marker and files are all there. A ZeRO
checkpoint from another rank count resumes through hf_lora_ds.training.universal_checkpoint.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.training.universal_checkpoint import universal_refusal, zero_checkpoint_world_size

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointSaveError",
    "RankLostError",
    "save_failures",
    "lost_ranks",
    "mark_checkpoint_complete",
    "is_complete_checkpoint",
    "find_latest_complete_checkpoint",
    "check_resume_world_size",
    "resolve_resume_checkpoint",
    "ResumePoint",
]

COMPLETE_MARKER = "checkpoint_complete.json"
_CHECKPOINT_NAME = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


class CheckpointSaveError(UserError):
    """Writing a checkpoint or the final adapter failed (no space, no permission); the last complete checkpoint is
    intact and named."""


_SPACE_PROBE_BYTES = 1 << 20


@contextlib.contextmanager
def save_failures(target: str | os.PathLike, output_dir: str | os.PathLike) -> Iterator[None]:
    """Turn a save into ``target`` that fails for lack of space or permission into one line naming the path, the
    cause and the checkpoint ``--resume_from_checkpoint auto`` will take. Only OSErrors carry the cause: torch.save
    reports a full disk as a ``RuntimeError`` ("unexpected pos"), the tokenizers library's writer as a bare
    ``Exception`` ("os error 28", seen in a 2-rank ZeRO-3 save); for those the cause is confirmed by writing 1 MiB
    next to the target, and any failure that is not the file system's is re-raised as it is."""
    try:
        yield
    except CheckpointSaveError:
        raise  # already said by a save nested inside this one
    except Exception as err:
        cause = err.strerror if isinstance(err, OSError) and err.strerror else _write_failure(Path(target))
        if cause is None:
            raise
        raise CheckpointSaveError(f"saving {target} failed: {cause}; {_resume_hint(output_dir)}") from err


class RankLostError(UserError):
    """Another rank's process stopped mid-run (killed, out of memory); the last complete checkpoint is named."""


# gloo's words for a collective whose peer process is gone: the kernel closed the dead process's sockets.
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer")


@contextlib.contextmanager
def lost_ranks(output_dir: str | os.PathLike) -> Iterator[None]:
    """Turn the collective that fails because another rank's process is gone (a SIGKILL inside a save, the OOM
    killer) into one line naming the checkpoint to resume from, instead of gloo's traceback on every survivor. The
    dead rank's own cause is in the launcher's report of it. (NCCL notices a dead peer only at its timeout.)"""
    try:
        yield
    except RuntimeError as err:
        gone = next((text for text in _PEER_GONE if text in str(err)), None)
        if gone is None:
            raise
        raise RankLostError(
            f"another rank of this run stopped (its connection: {gone}; the launcher's report says "
            f"which and why); {_resume_hint(output_dir)}"
        ) from err


def _resume_hint(output_dir: str | os.PathLike) -> str:
    latest, _ = find_latest_complete_checkpoint(output_dir)
    if latest is None:
        return f"no complete checkpoint in {output_dir}"
    return f"{latest} is the last complete checkpoint (--resume_from_checkpoint auto continues from it)"


def _write_failure(target: Path) -> str | None:
    """The file system's reason a write next to ``target`` fails now, or None when writing works."""
    directory = next((p for p in (target, *target.parents) if p.is_dir()), Path("."))
    probe = directory / ".hf_lora_ds_write_probe"
    try:
        with open(probe, "wb") as handle:
            handle.write(b"\0" * _SPACE_PROBE_BYTES)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        return err.strerror or errno.errorcode.get(err.errno or 0, str(err))
    finally:
        with contextlib.suppress(OSError):  # a read-only file system refuses the unlink too
            probe.unlink(missing_ok=True)
    return None


def mark_checkpoint_complete(checkpoint: str | os.PathLike, global_step: int, world_size: int) -> Path:
    """Write the completion marker into ``checkpoint``: the files it holds now, with their sizes."""
    checkpoint = Path(checkpoint)
    files = {
        str(path.relative_to(checkpoint)): path.stat().st_size
        for path in sorted(checkpoint.rglob("*"))
        if path.is_file() and path.name != COMPLETE_MARKER
    }
    marker = checkpoint / COMPLETE_MARKER
    partial = marker.with_name(f".{COMPLETE_MARKER}.tmp")
    partial.write_text(json.dumps({"global_step": global_step, "world_size": world_size, "files": files}, indent=1))
    os.replace(partial, marker)  # atomic: the marker is either absent or whole
    return marker


def is_complete_checkpoint(checkpoint: str | os.PathLike) -> bool:
    """True when ``checkpoint`` carries a marker and every file it lists is present with the recorded size."""
    marker = Path(checkpoint, COMPLETE_MARKER)
    try:
        files = json.loads(marker.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    for name, size in files.items():
        path = Path(checkpoint, name)
        if not path.is_file() or path.stat().st_size != size:
            return False
    return bool(files)


def find_latest_complete_checkpoint(output_dir: str | os.PathLike) -> tuple[Path | None, list[Path]]:
    """The highest-step complete ``checkpoint-N`` in ``output_dir`` (or None), and the newer incomplete ones skipped."""
    root = Path(output_dir)
    if not root.is_dir():
        return None, []
    steps = {
        int(m.group(1)): path for path in root.iterdir() if path.is_dir() and (m := _CHECKPOINT_NAME.match(path.name))
    }
    skipped = []
    for step in sorted(steps, reverse=True):
        if is_complete_checkpoint(steps[step]):
            return steps[step], skipped
        skipped.append(steps[step])
    return None, skipped


def check_resume_world_size(
    checkpoint: str | os.PathLike, world_size: int, deepspeed_config: dict | None = None
) -> str:
    """Whether ``checkpoint`` resumes on ``world_size`` ranks: "" when it does as it is, or a note that its ZeRO
    partitions (written by another number of ranks) go through a universal checkpoint. Raise, before any model is
    loaded, when they cannot: this run (``deepspeed_config``, its loaded DeepSpeed config) cannot load one."""
    ranks = zero_checkpoint_world_size(checkpoint)
    if ranks is None or ranks == world_size:
        return ""
    refusal = universal_refusal(deepspeed_config)
    if refusal:
        raise UserError(
            f"{checkpoint} holds DeepSpeed ZeRO optimizer state partitioned over {ranks} ranks, and this run has "
            f"{world_size}; it can only be re-partitioned through a DeepSpeed universal checkpoint, but {refusal}. "
            f"Resume with {ranks} ranks (the same launcher flags as the run that wrote it), or with a ZeRO 1-3 config."
        )
    return (
        f"; written by {ranks} ranks, this run has {world_size}: it is converted to a DeepSpeed universal checkpoint "
        "and re-partitioned"
    )


@dataclass(frozen=True)
class ResumePoint:
    """``--resume_from_checkpoint`` resolved: the checkpoint to load (None: a fresh start), the note for rank 0 to
    print, and whether its ZeRO partitions were written by another number of ranks (loaded through a universal
    checkpoint)."""

    checkpoint: str | None
    note: str | None
    repartitioned: bool = False


def resolve_resume_checkpoint(
    value: str | None, output_dir: str | os.PathLike, world_size: int = 1, deepspeed_config: dict | None = None
) -> ResumePoint:
    """Turn ``--resume_from_checkpoint`` into what ``LoraSFTTrainer.train`` resumes from, once.

    ``None``/empty: start fresh, no note. ``auto``: the latest complete checkpoint in ``output_dir``, or a fresh start
    when there is none. A path: used as given (it must look like a Trainer checkpoint); the note warns when it has no
    completion marker, as for checkpoints written by other tools or cut short by a kill. Either way a ZeRO
    checkpoint written by another number of ranks than ``world_size`` is noted (it resumes through a universal
    checkpoint), or an error where this run (``deepspeed_config``: its DeepSpeed config, None without) cannot.
    """
    if not value:
        return ResumePoint(None, None)
    if value == "auto":
        latest, skipped = find_latest_complete_checkpoint(output_dir)
        skipped_note = f"; skipped incomplete {', '.join(path.name for path in skipped)}" if skipped else ""
        if latest is None:
            return ResumePoint(None, f"resume: no complete checkpoint in {output_dir}, starting fresh{skipped_note}")
        ranks_note = check_resume_world_size(latest, world_size, deepspeed_config)
        note = f"resume: from {latest} (latest complete checkpoint{skipped_note}){ranks_note}"
        return ResumePoint(str(latest), note, bool(ranks_note))
    checkpoint = Path(value)
    if not (checkpoint / "trainer_state.json").is_file():
        raise MissingPathError(
            f"--resume_from_checkpoint {value}: not a Trainer checkpoint (no trainer_state.json). Pass a "
            f"{PREFIX_CHECKPOINT_DIR}-N directory, or 'auto' for the latest complete one in --output_dir."
        )
    ranks_note = check_resume_world_size(checkpoint, world_size, deepspeed_config)
    if not is_complete_checkpoint(checkpoint):
        note = (
            f"resume: from {value}, which has no {COMPLETE_MARKER}: it was written by another tool or cut short "
            f"by a kill; use 'auto' to pick the latest checkpoint known to be complete{ranks_note}"
        )
        return ResumePoint(value, note, bool(ranks_note))
    return ResumePoint(value, f"resume: from {value}{ranks_note}", bool(ranks_note))
