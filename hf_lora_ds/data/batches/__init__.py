"""Batches: the dataset's samples padded, padding-free or packed (``collator``, ``packing``), and the length-grouped
sampler. ``build_collator`` is the entry the training runtime calls."""

from hf_lora_ds.data.batches.collator import (
    LengthGroupedEpochSampler,
    build_collator,
    check_model_batching,
    padded_collator,
    supports_padding_free,
)
from hf_lora_ds.data.batches.packing import PackedDataset

__all__ = [
    "LengthGroupedEpochSampler",
    "PackedDataset",
    "build_collator",
    "check_model_batching",
    "padded_collator",
    "supports_padding_free",
]
