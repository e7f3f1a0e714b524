"""Batching: dynamic padding, padding-free batches or packed rows (hf_lora_ds.data.batches.packing), and the
length-grouped sampler that makes padded batches short.

The padded and padding-free collators are transformers'; this module adds the choice between them, the refusal to
flatten or pack a batch for a model whose attention would let packed sequences attend to each other, what sequence
parallelism needs of a batch (``position_ids``, a length divisible by its size), and a length-grouped order that every
rank draws alike (``LengthGroupedEpochSampler``). ``SupervisedPositionsCollator`` adds to any collator's batches where
their trained labels are, found on the host (hf_lora_ds.training.supervised_logits reads them).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DataCollatorForSeq2Seq, DataCollatorWithFlattening, PreTrainedTokenizerBase
from transformers.trainer_pt_utils import LengthGroupedSampler

from hf_lora_ds.config.batching import ResolvedBatching, is_flash_attention
from hf_lora_ds.data.batches.packing import PackedCollator
from hf_lora_ds.data.dataset import IGNORE_INDEX
from hf_lora_ds.errors import UserError

__all__ = [
    "SUPERVISED_POSITIONS",
    "LengthGroupedEpochSampler",
    "SupervisedPositionsCollator",
    "build_collator",
    "check_model_batching",
    "padded_collator",
    "shifted_labels",
    "supervised_positions",
    "supports_padding_free",
]

# The batch key of the flat indices of the positions whose shifted label is trained (SupervisedPositionsCollator).
SUPERVISED_POSITIONS = "supervised_positions"


def shifted_labels(inputs: dict[str, Any]) -> torch.Tensor:
    """The label each position predicts: ``labels`` shifted left by one with -100 at the end, as ``ForCausalLMLoss``
    does, or the collator's own ``shift_labels`` when it provides them.

    >>> import torch
    >>> shifted_labels({"labels": torch.tensor([[-100, 5, 6], [-100, -100, 7]])}).tolist()
    [[5, 6, -100], [-100, 7, -100]]
    """
    if inputs.get("shift_labels") is not None:
        return inputs["shift_labels"]
    return F.pad(inputs["labels"], (0, 1), value=IGNORE_INDEX)[..., 1:]


def supervised_positions(targets: torch.Tensor) -> torch.Tensor:
    """Flat indices into ``targets.flatten()`` of the positions whose target is trained (not -100), ascending. On the
    collator's CPU tensors this costs the device nothing; on a device tensor ``nonzero`` waits for the device.

    >>> import torch
    >>> supervised_positions(torch.tensor([[5, 6, -100], [-100, 7, -100]])).tolist()
    [0, 1, 4]
    """
    return (targets != IGNORE_INDEX).flatten().nonzero().squeeze(1)


class SupervisedPositionsCollator:
    """``collator``'s batches with ``SUPERVISED_POSITIONS`` added: ``supervised_positions`` of their shifted labels,
    found here on the CPU tensors the collator made, so the loss picks its rows on the device by index, with no
    ``nonzero`` that makes the host wait for the GPU every step. A batch whose labels are not a 2-D CPU tensor is
    returned as it is (the loss then finds the positions on the device).

    Each index is into the whole ``(batch, seq)`` grid: a path that slices the batch (accelerate's dispatched or
    split batches, DataParallel, sequence-parallel shards) must not get it (``LoraSFTTrainer`` sees to that)."""

    def __init__(self, collator: Any):
        self.collator = collator

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(features)
        labels = batch.get("shift_labels", batch.get("labels"))
        if isinstance(labels, torch.Tensor) and labels.dim() == 2 and labels.device.type == "cpu":
            batch[SUPERVISED_POSITIONS] = supervised_positions(shifted_labels(batch))
        return batch


def padded_collator(
    tokenizer: PreTrainedTokenizerBase, pad_to_multiple_of: int | None = None
) -> DataCollatorForSeq2Seq:
    """Pads each batch to its longest sample (optionally rounded up to a multiple), labels with -100.

    Dynamic padding pads to the longest sample of the batch (not to ``max_length``), labels with -100 and the
    attention mask with 0:

    >>> import torch
    >>> from transformers import DataCollatorForSeq2Seq
    >>> from hf_lora_ds.data.batches.collator import padded_collator
    >>> class Tok:  # the two attributes DataCollatorForSeq2Seq's padding reads, for a self-contained example
    ...     pad_token_id, padding_side = 0, "right"
    ...     def pad(self, features, **kw):
    ...         n = max(len(f["input_ids"]) for f in features)
    ...         ids = [f["input_ids"] + [0] * (n - len(f["input_ids"])) for f in features]
    ...         mask = [f["attention_mask"] + [0] * (n - len(f["attention_mask"])) for f in features]
    ...         return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
    >>> batch = padded_collator(Tok())([
    ...     {"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": [-100, 6, 7]},
    ...     {"input_ids": [8], "attention_mask": [1], "labels": [8]},
    ... ])
    >>> batch["input_ids"].tolist(), batch["labels"].tolist(), batch["attention_mask"].tolist()
    ([[5, 6, 7], [8, 0, 0]], [[-100, 6, 7], [8, -100, -100]], [[1, 1, 1], [1, 0, 0]])
    """
    return DataCollatorForSeq2Seq(
        tokenizer, padding="longest", pad_to_multiple_of=pad_to_multiple_of, label_pad_token_id=IGNORE_INDEX
    )


def supports_padding_free(model: torch.nn.Module) -> bool:
    """Whether a flattened batch with restarting ``position_ids`` keeps its sequences apart in attention.

    Flash-attention kernels read the boundaries from the position ids; with sdpa or eager attention, models built on
    transformers' ``create_causal_mask`` detect packed sequences from the position ids and build a block-diagonal mask.
    Models outside both would silently attend across samples.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    implementation = getattr(base.config, "_attn_implementation", None) or ""
    if is_flash_attention(implementation):
        return True
    return hasattr(sys.modules.get(type(base).__module__), "create_causal_mask")


def check_model_batching(batching: ResolvedBatching, model: torch.nn.Module) -> None:
    """Padding-free batches and packed rows only for a model whose attention keeps their samples apart (its other
    token-mixing layers: hf_lora_ds.model.packed_boundaries)."""
    if batching in ("padding_free", "packed") and not supports_padding_free(model):
        raise UserError(
            f"--batching {batching}: {type(model).__name__} with attn_implementation="
            f"{model.config._attn_implementation!r} cannot keep packed sequences apart; use --batching padded, or "
            "--attn_implementation flash_attention_2 on a GPU"
        )


def build_collator(
    batching: ResolvedBatching,
    tokenizer: PreTrainedTokenizerBase,
    pad_to_multiple_of: int | None = None,
    sequence_parallel_size: int = 1,
    one_row: bool = False,
    boundary_keys: tuple[str, ...] = (),
) -> Any:
    """The collator for an already resolved batching mode.

    Under sequence parallelism every batch needs ``position_ids`` (Ulysses gathers them to place each shard's
    tokens), a length divisible by its size (the shards are equal) and its padding on the right (Ulysses drops the
    attention mask, and causal attention never looks right): ``PackedCollator`` makes such batches, one sample a row
    for padded batching. ``one_row`` flattens packed rows into one (flash attention reads packed samples from one row
    only). ``boundary_keys`` (hf_lora_ds.model.packed_boundaries) are the sample boundaries a hybrid model's
    kernels read besides the position ids; flash-linear-attention reads ``cu_seq_lens_q`` of one row only."""
    multiple = math.lcm(pad_to_multiple_of or 1, sequence_parallel_size)
    if batching == "padded" and sequence_parallel_size == 1:
        return padded_collator(tokenizer, pad_to_multiple_of)
    seq_idx, cu_seq_lens = "seq_idx" in boundary_keys, "cu_seq_lens_q" in boundary_keys
    if batching == "padding_free" and multiple == 1:
        return DataCollatorWithFlattening(
            separator_id=IGNORE_INDEX, return_seq_idx=seq_idx, return_flash_attn_kwargs=cu_seq_lens
        )
    flatten = batching == "padding_free" or one_row or cu_seq_lens
    return PackedCollator(tokenizer.pad_token_id, multiple, flatten=flatten, boundary_keys=boundary_keys)


class LengthGroupedEpochSampler(LengthGroupedSampler):
    """transformers' ``LengthGroupedSampler`` (random mega-batches, each sorted by length) drawn from a generator
    seeded with ``seed + epoch``.

    Left without a generator it draws from the global torch RNG when each epoch starts, and that state differs
    between ranks once dropout has consumed it (by as many numbers as each rank's batch has elements): ranks would
    then shard different orders, training some samples twice and some never, and a resumed run would not see the
    order of the run it resumes. Trainer calls ``set_epoch`` before every epoch, as it does for DistributedSampler;
    iterating twice in one epoch gives the same order twice.
    """

    def __init__(self, batch_size: int, lengths: list[int], seed: int):
        super().__init__(batch_size, lengths=lengths, generator=torch.Generator())
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()
