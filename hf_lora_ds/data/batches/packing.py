"""``--batching packed``: samples packed into rows of ``--max_length`` tokens, none split, none seeing another.

Rows are filled best-fit-decreasing (``best_fit_decreasing``): samples from the longest down, each into the open row
whose free space it fills most tightly, a new row when none has room. On chat SFT data, where most samples are far
shorter than ``max_length``, the rows come out nearly full, so a batch of rows carries almost no padding, unlike
length-grouped padded batches, which still pad each sample to the longest of its batch.

Samples in a row stay apart through ``position_ids`` that restart at 0 for each sample and no attention mask:
transformers then builds a block-diagonal causal mask from them (sdpa, eager, flex; ``create_causal_mask``), and
flash attention's varlen path reads the same boundaries (it needs one row per batch: ``PackedCollator(flatten=True)``).
The label of each sample's first token is masked, so a sample's last position never learns to predict its
successor's first token. Each sample's logits then equal those it gets alone (tests/data/batches/test_packing.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

import torch

from hf_lora_ds.data.dataset import IGNORE_INDEX

__all__ = [
    "PackedCollator",
    "PackedDataset",
    "best_fit_decreasing",
    "cumulative_lengths",
    "padding_segments",
    "sequence_index",
    "training_samples",
]


def best_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into rows of at most ``capacity`` tokens; a length over ``capacity`` gets a
    row of its own (the dataset truncates to ``max_length``, so none is, in training).

    Open rows are kept by free space in a sorted list of distinct free amounts (at most ``capacity + 1`` of them),
    each with a stack of rows: finding the tightest row is a bisection (a million samples packed into rows of 4096
    in ~10 s on this project's CPU).

    >>> best_fit_decreasing([5, 3, 8, 2, 6], capacity=10)  # 8+2, 6+3, 5
    [[2, 3], [4, 1], [0]]
    """
    rows: list[list[int]] = []
    free_amounts: list[int] = []  # sorted distinct free space of open rows
    rows_by_free: dict[int, list[int]] = {}
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        length = lengths[index]
        at = bisect.bisect_left(free_amounts, length)
        if at == len(free_amounts):
            row, free = len(rows), capacity - length
            rows.append([index])
        else:
            found = free_amounts[at]
            row = rows_by_free[found].pop()
            if not rows_by_free[found]:
                del rows_by_free[found], free_amounts[at]
            rows[row].append(index)
            free = found - length
        if free > 0:
            if free not in rows_by_free:
                bisect.insort(free_amounts, free)
                rows_by_free[free] = []
            rows_by_free[free].append(row)
    return rows


class PackedDataset(torch.utils.data.Dataset):
    """A tokenized dataset's samples packed into rows of ``capacity`` tokens: ``ds[i]`` is row ``i`` as one sample
    (``input_ids``, ``labels``, ``position_ids`` restarting per sample). The packing depends on the lengths only, so
    every rank and every epoch packs alike; the sampler shuffles rows. ``samples`` is the dataset packed."""

    def __init__(self, samples: torch.utils.data.Dataset, capacity: int):
        self.samples, self.capacity = samples, capacity
        self._sample_lengths = list(samples.lengths)
        self.rows = best_fit_decreasing(self._sample_lengths, capacity)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        row: dict[str, list[int]] = {"input_ids": [], "labels": [], "position_ids": []}
        for sample_index in self.rows[index]:
            sample = self.samples[sample_index]
            row["input_ids"] += sample["input_ids"]
            row["labels"] += [IGNORE_INDEX, *sample["labels"][1:]]  # never predicted from the previous sample
            row["position_ids"] += range(len(sample["input_ids"]))
            if sample.get("images"):  # a vision-language model's: the row's images in its samples' order
                row.setdefault("images", []).extend(sample["images"])
        return row

    @property
    def lengths(self) -> list[int]:
        """Tokens of each row (for the length-grouped sampler and the planner)."""
        return [sum(self._sample_lengths[i] for i in row) for row in self.rows]

    def fill(self) -> float:
        """The share of the rows' ``capacity`` that holds tokens: 1 minus the padding a full-row batch would carry."""
        return sum(self._sample_lengths) / (len(self.rows) * self.capacity) if self.rows else 1.0


def training_samples(dataset: Any) -> Any:
    """The dataset of samples behind ``dataset``: the packed one for packed rows, else ``dataset`` itself."""
    return dataset.samples if isinstance(dataset, PackedDataset) else dataset


class PackedCollator:
    """Rows of samples (``PackedDataset`` rows, or single samples for a padding-free batch) to a batch: each row
    padded to the longest, rounded up to ``pad_to_multiple_of`` (sequence parallelism needs a multiple of its size),
    with ``position_ids`` and no attention mask, which would stop transformers from reading the boundaries.

    Padding is one more sample of pad tokens (positions from 0, labels -100), so it attends to nothing real and
    nothing real attends to it. ``flatten`` concatenates the rows into one (flash attention detects packed samples
    only in a batch of one row). ``boundary_keys`` are what a hybrid model's CUDA kernels read besides the position
    ids (``hf_lora_ds.model.packed_boundaries``): ``seq_idx``, ``cu_seq_lens_q`` (with ``_k`` and their maxima)."""

    def __init__(
        self, pad_token_id: int, pad_to_multiple_of: int = 1, flatten: bool = False, boundary_keys: tuple[str, ...] = ()
    ):
        self.pad_token_id, self.multiple, self.flatten = pad_token_id, pad_to_multiple_of, flatten
        self.boundary_keys = boundary_keys

    def __call__(self, features: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        rows = [
            (f["input_ids"], f["labels"], f.get("position_ids") or list(range(len(f["input_ids"])))) for f in features
        ]
        if self.flatten:
            rows = [tuple(sum((list(row[part]) for row in rows), []) for part in range(3))]
        width = -(-max(len(ids) for ids, _, _ in rows) // self.multiple) * self.multiple
        batch = {"input_ids": [], "labels": [], "position_ids": []}
        for ids, labels, positions in rows:
            pad = width - len(ids)
            batch["input_ids"].append(list(ids) + [self.pad_token_id] * pad)
            batch["labels"].append(list(labels) + [IGNORE_INDEX] * pad)
            batch["position_ids"].append(list(positions) + list(range(pad)))
        tensors = {key: torch.tensor(value, dtype=torch.long) for key, value in batch.items()}
        tensors["labels"][tensors["position_ids"] == 0] = IGNORE_INDEX  # each sample's first token, whatever fed it
        if "seq_idx" in self.boundary_keys:
            tensors["seq_idx"] = sequence_index(tensors["position_ids"])
        if "cu_seq_lens_q" in self.boundary_keys:
            tensors.update(cumulative_lengths(tensors["position_ids"]))
        return tensors


def sequence_index(position_ids: torch.Tensor) -> torch.Tensor:
    """``seq_idx`` as causal-conv1d and mamba-ssm take it: the sample each token of a packed row belongs to.

    >>> sequence_index(torch.tensor([[0, 1, 2, 0, 1, 0]])).tolist()
    [[0, 0, 0, 1, 1, 2]]
    """
    return ((position_ids == 0).cumsum(dim=1) - 1).to(torch.int32)


def cumulative_lengths(position_ids: torch.Tensor) -> dict[str, Any]:
    """``cu_seq_lens_q``/``_k`` (where each sample of the flattened batch starts, then its end) and ``max_length_q``/
    ``_k``, as transformers' DataCollatorWithFlattening returns them (flash attention, flash-linear-attention).

    >>> bounds = cumulative_lengths(torch.tensor([[0, 1, 2, 0, 1, 0]]))
    >>> bounds["cu_seq_lens_q"].tolist(), bounds["max_length_q"]
    ([0, 3, 5, 6], 3)
    """
    starts = (position_ids.flatten() == 0).nonzero().flatten()
    cu_seq_lens = torch.cat([starts, torch.tensor([position_ids.numel()])]).to(torch.int32)
    longest = int((cu_seq_lens[1:] - cu_seq_lens[:-1]).max())
    return {
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def padding_segments(input_ids: torch.Tensor, position_ids: torch.Tensor, pad_token_id: int | None) -> torch.Tensor:
    """Per row of a mask-less batch (packed, padding-free, or a sequence-parallel shard of one), how many of its
    tokens are ``PackedCollator``'s padding: the row's last segment (from its last ``position_ids == 0``, or from its
    start in a shard that holds none) when every token of it is ``pad_token_id``. No sample is all padding tokens
    (each has its chat template's header), so a real sample never counts; 0 everywhere without a pad token."""
    length = input_ids.shape[1]
    if pad_token_id is None or length == 0:
        return torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    starts = position_ids == 0
    last_start = torch.where(starts.any(dim=1), length - 1 - starts.flip(1).int().argmax(dim=1), 0)
    in_tail = torch.arange(length, device=input_ids.device) >= last_start[:, None]
    all_padding = ((input_ids == pad_token_id) | ~in_tail).all(dim=1)
    return torch.where(all_padding, length - last_start, 0)
