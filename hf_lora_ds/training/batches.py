"""The run's datasets and collator as ``--batching`` asks: packed into rows of ``--max_length`` for ``packed``, and
the padded, padding-free or packed collator, so a ``LoraSFTTrainer`` built in code batches as run_sft does (as
TRL's ``SFTTrainer._prepare_dataset`` packs inside the trainer), and the collator's batches given the positions the
loss trains where nothing slices them on their way (``with_supervised_positions``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.batching import ResolvedBatching, is_flash_attention
from hf_lora_ds.data.collator import SupervisedPositionsCollator, build_collator, check_model_batching
from hf_lora_ds.data.packing import PackedDataset

__all__ = ["prepare_batches", "with_supervised_positions"]

logger = logging.get_logger(__name__)


def prepare_batches(
    args: SFTTrainingArguments,
    model: torch.nn.Module,
    train_dataset: Any,
    eval_dataset: Any,
    data_collator: Callable | None,
    tokenizer: PreTrainedTokenizerBase | None,
) -> tuple[Any, Any, Callable | None]:
    """``(train_dataset, eval_dataset, data_collator)`` for ``args.batching``: datasets packed unless they already are
    (or absent), and the collator built unless one is given."""
    batching: ResolvedBatching = args.batching  # resolved when the arguments were built (hf_lora_ds.config.batching)
    check_model_batching(batching, model)
    if batching == "packed":
        train_dataset = _packed(train_dataset, args.max_length, "training")
        if train_dataset is not None:
            logger.info(
                f"packed: {len(train_dataset.samples)} samples in {len(train_dataset)} rows of {args.max_length} "
                f"tokens, {train_dataset.fill():.3f} of the rows filled"
            )
        if isinstance(eval_dataset, dict):
            eval_dataset = {name: _packed(data, args.max_length, name) for name, data in eval_dataset.items()}
        else:
            eval_dataset = _packed(eval_dataset, args.max_length, "eval")
    if data_collator is None and train_dataset is not None:
        if tokenizer is None and batching != "padding_free":
            raise ValueError(f"--batching {batching} pads with the tokenizer's pad token: pass processing_class")
        one_row = is_flash_attention(getattr(model.config, "_attn_implementation", None))
        data_collator = build_collator(
            batching, tokenizer, args.pad_to_multiple_of, args.engine.sequence_parallel, one_row
        )
    return train_dataset, eval_dataset, data_collator


def with_supervised_positions(
    args: SFTTrainingArguments, train_dataset: Any, data_collator: Callable | None
) -> Callable | None:
    """``data_collator`` adding the flat indices of the trained positions to its batches
    (``SupervisedPositionsCollator``), where each batch reaches ``compute_loss`` whole. Not where something slices
    batches on the way (the indices would then point past or into other rows): accelerate's split or dispatched
    batches (an iterable dataset is dispatched by default), DataParallel over several GPUs of one process, and
    sequence parallelism, whose shards the trainer indexes itself (``LoraSFTTrainer._get_num_items_in_batch``). For
    the trainer only, after the data pass of EVA and CorDA, whose forwards would get the key."""
    accelerator = args.accelerator_config
    sliced = (
        accelerator.split_batches
        or accelerator.dispatch_batches
        or isinstance(train_dataset, torch.utils.data.IterableDataset)
        or args.n_gpu > 1
        or args.engine.sequence_parallel > 1
    )
    return data_collator if data_collator is None or sliced else SupervisedPositionsCollator(data_collator)


def _packed(dataset: Any, capacity: int, name: str) -> Any:
    """``dataset``'s samples in rows of ``capacity`` tokens (hf_lora_ds.data.packing); None and packed rows as given."""
    if dataset is None or isinstance(dataset, PackedDataset):
        return dataset
    if not hasattr(dataset, "lengths"):
        raise ValueError(
            f"--batching packed packs by the samples' lengths, and the {name} dataset "
            f"({type(dataset).__name__}) has no 'lengths': pass a ChatSFTDataset"
        )
    return PackedDataset(dataset, capacity)
