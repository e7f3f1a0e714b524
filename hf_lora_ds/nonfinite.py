"""Stop at the first NaN or infinite training loss, naming the step, the samples and the checkpoint to go back to.

Trainer trains on through a NaN loss: the NaN gradients reach the optimizer, every weight they touch becomes NaN, and
the run goes on logging ``nan`` until it ends and saves a useless adapter. ``LoraSFTTrainer.compute_loss`` checks
each training loss before its backward pass, so no NaN gradient is ever applied. All ranks agree (one all-reduce
of a flag), then stop with a ``NonFiniteLossError``: the step, the dataset indices of every sample in the offending
batch on every rank (with the file and line they came from), and the last complete checkpoint to resume from.

The batch carries no sample index, so the samples are found by their token ids in the training dataset; that
lookup runs only once a loss has gone bad.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping

import torch

from hf_lora_ds.distributed import gather_from_ranks, process_group_exists
from hf_lora_ds.errors import UserError
from hf_lora_ds.resume import find_latest_complete_checkpoint

__all__ = [
    "NonFiniteLossError",
    "any_rank_nonfinite",
    "batch_sequences",
    "find_samples",
    "nonfinite_loss_message",
    "stop_on_nonfinite_loss",
]

_MAX_LISTED_SOURCES = 4


class NonFiniteLossError(UserError):
    """A training loss was NaN or infinite; the message names the step, the samples and the last good checkpoint."""


def any_rank_nonfinite(loss: torch.Tensor) -> bool:
    """Whether this rank's loss, or any other rank's, is NaN or infinite. A collective when a process group is up:
    every rank calls it for every training batch, so all stop at the same step."""
    flag = (~torch.isfinite(loss.detach())).any().to(torch.int32).reshape(1)
    if process_group_exists():
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def batch_sequences(inputs: Mapping[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """The token ids of each sample in a collated batch: padded rows without their padding, or the pieces of a
    padding-free row (``position_ids`` restart at 0 for each sample)."""
    input_ids = inputs["input_ids"].detach().cpu()
    positions = inputs.get("position_ids")
    if positions is not None and input_ids.shape[0] == 1 and "attention_mask" not in inputs:
        starts = (positions[0].detach().cpu() == 0).nonzero().flatten().tolist() + [input_ids.shape[1]]
        return [tuple(input_ids[0, start:end].tolist()) for start, end in zip(starts, starts[1:])]
    mask = inputs.get("attention_mask")
    if mask is None:
        return [tuple(row.tolist()) for row in input_ids]
    return [tuple(row[keep.bool()].tolist()) for row, keep in zip(input_ids, mask.detach().cpu())]


def find_samples(dataset, sequences: list[tuple[int, ...]]) -> list[tuple[int, str]]:
    """``(dataset index, where it came from)`` for each sequence; a sequence that occurs several times in the
    dataset yields every index. ``dataset`` is a ``ChatSFTDataset`` (its ``samples`` keep each record's origin)."""
    table = dataset.samples.with_format(None)
    wheres = table["where"] if "where" in table.column_names else [f"sample {i}" for i in range(len(table))]
    by_tokens: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for index, ids in enumerate(table["input_ids"]):
        by_tokens[tuple(ids)].append(index)
    return [(index, wheres[index]) for sequence in sequences for index in by_tokens.get(sequence, [])]


def nonfinite_loss_message(step: int, loss: float, samples: list[tuple[int, str]], output_dir: str) -> str:
    """The one line the run stops with."""
    indices = sorted({index for index, _ in samples})
    sources = "; ".join(where for _, where in samples[:_MAX_LISTED_SOURCES])
    more = f"; and {len(samples) - _MAX_LISTED_SOURCES} more" if len(samples) > _MAX_LISTED_SOURCES else ""
    checkpoint, _ = find_latest_complete_checkpoint(output_dir)
    resume = (
        f"last complete checkpoint: {checkpoint} (--resume_from_checkpoint auto continues from it)"
        if checkpoint
        else f"no complete checkpoint in {os.fspath(output_dir)} yet (--save_strategy steps keeps some)"
    )
    return (
        f"non-finite training loss ({loss}) at step {step}, before its update was applied; samples of the batch "
        f"(training dataset indices) {indices} ({sources}{more}); {resume}. Check those records, or lower "
        "--learning_rate / set --max_grad_norm if the loss had been growing"
    )


def stop_on_nonfinite_loss(loss: torch.Tensor, inputs: Mapping[str, torch.Tensor], dataset, step: int,
                           output_dir: str) -> None:  # fmt: skip
    """Raise ``NonFiniteLossError`` on every rank when any rank's ``loss`` is not finite; a no-op otherwise."""
    if not any_rank_nonfinite(loss):
        return
    own_bad = not bool(torch.isfinite(loss.detach()).all())
    samples = find_samples(dataset, batch_sequences(inputs)) if own_bad and dataset is not None else []
    value = float(loss.detach().float().reshape(-1)[0]) if own_bad else None
    gathered = gather_from_ranks((value, samples))
    bad_value = next(value for value, _ in gathered if value is not None)
    all_samples = [sample for _, rank_samples in gathered for sample in rank_samples]
    raise NonFiniteLossError(nonfinite_loss_message(step, bad_value, all_samples, output_dir))
