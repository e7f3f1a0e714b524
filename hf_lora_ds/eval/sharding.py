"""Split eval work across ranks so that every rank runs the same number of batches, and merge it back.

Under DeepSpeed ZeRO-3 every forward pass is a collective (each layer's parameters are all-gathered on the fly),
so a rank that ran out of prompts while another still generates would deadlock it. Each rank therefore gets
``ceil(n / world_size)`` prompts, topped up with duplicates of its own last prompt, and the duplicates are dropped
when results are merged. Prompts are dealt round-robin from one global longest-first order, so each rank's batches
have similar lengths and no rank waits long for another at each step.

These are pure functions of (lengths, rank, world size), testable without a process group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from hf_lora_ds.eval.generation import length_order

__all__ = ["Shard", "shard", "merge_shards"]

T = TypeVar("T")


@dataclass(frozen=True)
class Shard:
    """The record indices one rank evaluates; the first ``num_real`` are its own, the rest duplicates for lockstep."""

    indices: list[int]
    num_real: int


def shard(lengths: Sequence[int], rank: int, world_size: int) -> Shard:
    """Indices of the records ``rank`` evaluates, longest first, padded to ``ceil(len(lengths) / world_size)``."""
    if not lengths:
        raise ValueError("nothing to evaluate: the eval set is empty")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a world of size {world_size}")
    order = length_order(lengths)
    own = order[rank::world_size]
    size = math.ceil(len(order) / world_size)
    filler = own[-1] if own else order[-1]
    return Shard(own + [filler] * (size - len(own)), len(own))


def merge_shards(parts: Sequence[Sequence[tuple[int, T]]], total: int) -> list[T]:
    """Put ``(index, item)`` pairs gathered from every rank back in record order; every index must appear once."""
    merged: dict[int, T] = {}
    for part in parts:
        for index, item in part:
            if index in merged:
                raise RuntimeError(f"record {index} was evaluated by two ranks; the shards overlap")
            merged[index] = item
    if len(merged) != total:
        missing = sorted(set(range(total)) - set(merged))[:10]
        raise RuntimeError(f"{total - len(merged)} records were evaluated by no rank, e.g. {missing}")
    return [merged[i] for i in range(total)]
