"""Sequence parallelism (DeepSpeed Ulysses, the ALST recipe) for LoRA SFT: the pieces this package adds to what
transformers, accelerate and DeepSpeed already wire together.

``--sequence_parallel_size N`` becomes accelerate's ``ParallelismConfig(sp_size=N, sp_backend="deepspeed")``
(hf_lora_ds.config.engine); accelerate swaps in DeepSpeed's all-to-all attention and Trainer shards each sequence over
the group, labels pre-shifted. What this module owns is the loss: ``sequence_parallel_loss`` turns each rank's shard
sum into the loss whose gradient, once DeepSpeed has reduced it, is exactly one process's on the same global batch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from hf_lora_ds.config.engine import data_parallel_size
from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.data.batches.collator import SUPERVISED_POSITIONS, supervised_positions
from hf_lora_ds.data.masking import IGNORE_INDEX
from hf_lora_ds.errors import UserError

__all__ = [
    "deepspeed_gradient_divisor",
    "index_shards",
    "sequence_parallel_group",
    "sequence_parallel_loss",
    "supervised_tokens_in_shards",
]


def sequence_parallel_group():
    """This rank's sequence-parallel group, as DeepSpeed's engine registered it."""
    from deepspeed.utils import groups

    return groups._get_sequence_parallel_group()


def supervised_tokens_in_shards(shards: list[dict[str, torch.Tensor]], device: torch.device) -> torch.Tensor:
    """The trained tokens of the whole accumulated global batch, counted from every rank's shards
    (``shift_labels != -100``) and summed over all ranks: each token lies in exactly one rank's shard, so each counts
    once (transformers divides its own count by the SP size, which assumes every rank counted whole sequences).
    A collective: every rank calls it once per optimizer step."""
    count = sum((shard["shift_labels"] != IGNORE_INDEX).sum() for shard in shards).to(device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(count)
    return count


def index_shards(shards: list[dict[str, torch.Tensor]]) -> None:
    """Give each shard its trained positions (``SUPERVISED_POSITIONS``), which the collator cannot give a batch that
    DeepSpeed's adapter shards after it; found while the shards are still on the CPU, where that adapter leaves them."""
    for shard in shards:
        if shard["shift_labels"].device.type == "cpu":
            shard[SUPERVISED_POSITIONS] = supervised_positions(shard["shift_labels"])


def deepspeed_gradient_divisor(deepspeed_config: dict, world_size: int, sequence_parallel_size: int) -> int:
    """What DeepSpeed divides the gradients it sums over all ranks by, under Ulysses (DeepSpeed 0.19.8).

    ZeRO 0-2 divide by the data-parallel size (world / N: ``tensor.div_(world / sequence_parallel_size)`` in
    ``stage_1_and_2.py`` and the engine's allreduce). ZeRO-3 does so only on its contiguous-bucket path; its
    reduce-scatter path (``reduce_scatter: true``, the default) pre-divides by the whole partition group, every rank,
    in ``reduce_scatter_coalesced`` (measured: gradients 1/N of one process's at SP 2). With ``reduce_scatter: false``
    ZeRO-3 takes either path by bucket size, so the divisor would differ between parameters: refused."""
    zero = ZeroSettings.of(deepspeed_config)
    if zero.stage < 3:
        return data_parallel_size(world_size, sequence_parallel_size)
    if not zero.reduce_scatter:
        raise UserError(
            f"--sequence_parallel_size {sequence_parallel_size} with ZeRO-3 and reduce_scatter false: "
            "DeepSpeed then scales gradients differently for small and large parameters; drop "
            "reduce_scatter from the DeepSpeed config (its default, true, is what sequence parallelism "
            "is tested with)"
        )
    return world_size


def sequence_parallel_loss(shard_loss: torch.Tensor, group, deepspeed_divisor: int, data_parallel: int) -> torch.Tensor:
    """The loss to backpropagate from one rank's shard. Its gradient is the shard's own, scaled so that what DeepSpeed
    makes of it is one process's gradient on the global batch; its value is the whole sequence's, scaled as Trainer
    scales every rank's loss (``data_parallel`` times, since it logs the mean over ranks), so the logged loss and
    the non-finite check see the same number as a one-process run.

    ``shard_loss`` is the shard's summed cross-entropy divided by the supervised tokens of the whole global batch;
    ``deepspeed_divisor`` is what DeepSpeed divides the gradients summed over all ranks by
    (``deepspeed_gradient_divisor``).

    This is the one place where sequence parallelism's gradient scale is set. Under Ulysses every rank of a group
    holds a partial gradient of the same sequences; DeepSpeed sums the gradients of all ranks and divides by a size
    that is not the number of batches (DeepSpeed issue 5248, open since 2024: "the gradient would be scaled by the
    sequence parallel size"). transformers' own SP loss (``deepspeed_sp_compute_loss``) all-gathers the per-rank
    losses with autograd, so each rank's backward also carries the other ranks' shares: under ZeRO-2 gradients came
    out N times one process's (grad_norm exactly 2x at SP 2; with SGD, SP 2 at lr 0.05 equals one process at lr 0.1),
    and ZeRO-3's reduce-scatter divides by N more, so the two errors cancel there only. Here each rank's gradient is
    its shard's alone (the other ranks' part of the value is a constant); DeepSpeed's sum over all ranks then makes
    the global batch's gradient, and multiplying by the divisor undoes its division.
    """
    sequence = shard_loss.detach().clone()
    dist.all_reduce(sequence, group=group)
    scaled = shard_loss * deepspeed_divisor
    return scaled + (sequence * data_parallel - scaled).detach()
