"""Stop (or skip the step) at the first NaN or infinite training loss or gradient norm, naming the step, the samples
and the checkpoint to go back to.

Trainer trains on through a NaN: the NaN gradients reach the optimizer and the run saves a useless adapter. Every
loss (``LoraSFTTrainer.compute_loss``) and gradient norm (``_get_grad_norm``, before ``optimizer.step()``) is looked
at. ``stop`` raises with the bad step's dataset indices on every rank (found by token ids, only once something went
bad) and the last complete checkpoint; ``skip`` drops the step and counts it (``nonfinite_skipped`` in the logs).

Reading a value on the host makes it wait for the GPU, so ``stop`` reads once per window: each check only notes, on
the device, the first non-finite value since the last read, and ``NonFiniteGuard.end_window`` reads that (one
all-reduce, so every rank decides alike). The trainer ends a window before the update of every step that logs or
saves a checkpoint, before any other checkpoint and at the end of training: a run stops at the first of those after
the bad step, with the same message, and with a logging window of one step (or the bad step ending one) before the bad
update; with longer windows the updates in between were applied, as the message says. ``skip`` must decide every
step, so it reads every loss and norm.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Mapping
from typing import Literal

import torch
from transformers import TrainerState, TrainingArguments

from hf_lora_ds.devices import available_accelerator
from hf_lora_ds.distributed import gather_from_ranks, process_group_exists
from hf_lora_ds.errors import UserError
from hf_lora_ds.training.checkpoints import find_latest_complete_checkpoint

__all__ = [
    "NonFiniteError",
    "NonFiniteGradientError",
    "NonFiniteGuard",
    "NonFiniteLossError",
    "any_rank_nonfinite",
    "batch_sequences",
    "ends_window",
    "find_samples",
    "nonfinite_message",
]

_MAX_LISTED_SOURCES = 4
_SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")


class NonFiniteError(UserError):
    """A training loss or gradient norm was NaN or infinite; the message names the step, the samples and the last
    good checkpoint."""


class NonFiniteLossError(NonFiniteError):
    """A training loss was NaN or infinite."""


class NonFiniteGradientError(NonFiniteError):
    """A step's gradient norm was NaN or infinite (its loss was finite)."""


def any_rank_nonfinite(value: torch.Tensor | float) -> bool:
    """Whether ``value`` on this rank, or on any other rank, is NaN or infinite. A collective when a process group is
    up: every rank calls it at the same point, so all take the same decision at the same step."""
    value = torch.as_tensor(value).detach()
    flag = (~torch.isfinite(value)).any().to(torch.int32).reshape(1)
    if process_group_exists():
        if torch.distributed.get_backend() == "nccl":
            flag = flag.to(available_accelerator())
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
    return bool(flag.item())


def ends_window(args: TrainingArguments, state: TrainerState) -> bool:
    """Whether the optimizer step under way (``state.global_step + 1``) will log its loss or save a checkpoint, as
    Trainer's DefaultFlowCallback decides after it: the stop check reads the device before its update. Every step
    where logging or saving goes by epochs, whose last step is not known here."""
    step = state.global_step + 1
    if args.logging_strategy == "epoch" or args.save_strategy in ("epoch", "best"):
        return True
    logs = args.logging_strategy == "steps" and (
        step % state.logging_steps == 0 or (step == 1 and args.logging_first_step)
    )
    saves = args.save_strategy == "steps" and state.save_steps > 0 and step % state.save_steps == 0
    return logs or saves or step >= state.max_steps


def batch_sequences(inputs: Mapping[str, torch.Tensor]) -> list[tuple[int, ...]]:
    """The token ids of each sample in a collated batch: padded rows without their padding, or the pieces of
    padding-free and packed rows (``position_ids`` restart at 0 for each sample; a padding piece matches no sample)."""
    input_ids = inputs["input_ids"].detach().cpu()
    positions = inputs.get("position_ids")
    if positions is not None and "attention_mask" not in inputs:
        pieces = []
        for ids, row_positions in zip(input_ids, positions.detach().cpu()):
            starts = (row_positions == 0).nonzero().flatten().tolist() + [len(ids)]
            pieces += [tuple(ids[start:end].tolist()) for start, end in zip(starts, starts[1:])]
        return pieces
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


def nonfinite_message(
    what: str, step: int, value: float, samples: list[tuple[int, str]], output_dir: str, applied: int | None = None
) -> str:
    """The one line the run stops with; ``what`` is "training loss" or "gradient norm"; ``applied``: the last step
    whose update was applied when the check read the device (None: before the bad step's own)."""
    indices = sorted({index for index, _ in samples})
    sources = "; ".join(where for _, where in samples[:_MAX_LISTED_SOURCES])
    more = f"; and {len(samples) - _MAX_LISTED_SOURCES} more" if len(samples) > _MAX_LISTED_SOURCES else ""
    checkpoint, _ = find_latest_complete_checkpoint(output_dir)
    resume = (
        f"last complete checkpoint: {checkpoint} (--resume_from_checkpoint auto continues from it)"
        if checkpoint
        else f"no complete checkpoint in {os.fspath(output_dir)} yet (--save_strategy steps keeps some)"
    )
    when = (
        "before its update was applied"
        if applied is None or applied < step
        else f"read at the end of its logging window, after the updates of steps {step}-{applied}"
    )
    return (
        f"non-finite {what} ({value}) at step {step}, {when}; samples of the batch "
        f"(training dataset indices) {indices} ({sources}{more}); {resume}. Check those records, lower "
        "--learning_rate / set --max_grad_norm if the loss had been growing, or pass --on_nonfinite skip"
    )


class NonFiniteGuard:
    """The loss and gradient-norm checks of one training run (see the module docstring), and its skip count."""

    def __init__(self, mode: Literal["stop", "skip"], output_dir: str, dataset=None) -> None:
        self.mode = mode
        self.output_dir = output_dir
        self.dataset = dataset  # a ChatSFTDataset to name samples from, or None
        self.skipped = 0
        self._bad_loss = False
        # Stop mode, on the device: 2 * step + (0 loss, 1 gradient norm) of the window's first non-finite value (inf:
        # none yet) and that value; None when nothing was noted since the last read.
        self._first: torch.Tensor | None = None
        self._first_value: torch.Tensor | None = None
        self._window_batches: dict[int, list[dict[str, torch.Tensor]]] = defaultdict(list)

    def check_loss(self, loss: torch.Tensor, inputs: Mapping[str, torch.Tensor], step: int) -> torch.Tensor:
        """The loss to backpropagate. Stop mode: noted for the window's read (``end_window``). Skip mode: when any
        rank's loss is not finite, it becomes NaN on every rank, and the step is dropped after the backward."""
        if self.mode == "stop":
            # Copies on their way to the host (no wait), for naming the samples if this step turns out bad.
            batch = {key: inputs[key].to("cpu", non_blocking=True) for key in _SEQUENCE_KEYS if key in inputs}
            self._window_batches[step].append(batch)
            self._note(loss, 2 * step)
            return loss
        if not any_rank_nonfinite(loss):
            return loss
        self._bad_loss = True
        return loss * float("nan")

    def check_grad_norm(
        self,
        grad_norm: torch.Tensor | float | None,
        model: torch.nn.Module,
        step: int,
        under_deepspeed: bool,
        ends_window: bool = True,
    ) -> None:
        """Called once per optimizer step, after the backward passes and before ``optimizer.step()``. Stop mode: noted,
        and the window read when ``ends_window`` (``end_window``). Skip mode: drop the step, count it.

        Without DeepSpeed every gradient becomes None, which torch optimizers skip (no moment update, no weight decay).
        Under ZeRO 1-3 the engine steps inside the backward and its own overflow check has already dropped a step with
        a non-finite norm (reported as inf); a NaN loss was made NaN on every rank so that check trips everywhere.
        ZeRO stage 0 reports no norm: only the loss check applies there."""
        if self.mode == "stop":
            if grad_norm is not None:
                self._note(grad_norm, 2 * step + 1)
            if ends_window:
                self.end_window(applied=step - 1)
            return
        try:
            if not (self._bad_loss or (grad_norm is not None and any_rank_nonfinite(grad_norm))):
                return
            if not under_deepspeed:
                model.zero_grad(set_to_none=True)  # torch optimizers skip parameters whose grad is None
            self.skipped += 1
        finally:
            self._bad_loss = False

    def end_window(self, applied: int) -> None:
        """Stop mode: read the window's notes (one read; a collective under torch.distributed: every rank calls it at
        the same point) and raise ``NonFiniteLossError`` or ``NonFiniteGradientError`` on every rank when a value was
        not finite. ``applied``: the last step whose update the weights hold. Nothing to read: returns at once."""
        if self._first is None:
            return
        first, value, batches = self._first, self._first_value, self._window_batches
        self._first = self._first_value = None
        self._window_batches = defaultdict(list)
        earliest = first.clone().reshape(1)
        if process_group_exists():
            if torch.distributed.get_backend() == "nccl":
                earliest = earliest.to(available_accelerator())
            torch.distributed.all_reduce(earliest, op=torch.distributed.ReduceOp.MIN)
        code = earliest.item()  # the window's one read
        if math.isinf(code):
            return
        step, kind = divmod(int(code), 2)
        own = float(value) if first.item() == code else None
        what, error = ("gradient norm", NonFiniteGradientError) if kind else ("training loss", NonFiniteLossError)
        raise error(self._message(what, own, batches[step], step, applied))

    def _note(self, value: torch.Tensor | float, code: int) -> None:
        """Keep ``value`` with ``code`` if it is the window's first non-finite one; device work only."""
        value = torch.as_tensor(value).detach().reshape(-1).to(torch.float64)
        if self._first is not None:
            value = value.to(self._first.device)
        bad = ~torch.isfinite(value).all()
        candidate = torch.full((), float(code), dtype=torch.float64, device=value.device).where(bad, math.inf)
        bad_value = value.index_select(0, (~torch.isfinite(value)).to(torch.int8).argmax().reshape(1)).reshape(())
        if self._first is None:
            self._first, self._first_value = candidate, bad_value
            return
        earlier = candidate < self._first
        self._first = torch.minimum(self._first, candidate)
        self._first_value = torch.where(earlier, bad_value, self._first_value)

    def _message(
        self, what: str, own_value: float | None, batches: list[dict[str, torch.Tensor]], step: int, applied: int
    ) -> str:
        """The stop message, with every rank's samples of the bad step and the first non-finite value any rank saw."""
        sequences = [sequence for batch in batches for sequence in batch_sequences(batch)]
        own_bad = own_value is not None
        samples = find_samples(self.dataset, sequences) if own_bad and self.dataset is not None else []
        gathered = gather_from_ranks((own_value, samples))
        bad_value = next(rank_value for rank_value, _ in gathered if rank_value is not None)
        all_samples = [sample for _, rank_samples in gathered for sample in rank_samples]
        return nonfinite_message(what, step, bad_value, all_samples, self.output_dir, applied)
