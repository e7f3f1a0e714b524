"""The run's datasets and collator as ``--batching`` asks: packed into rows of ``--max_length`` for ``packed``, and
the padded, padding-free or packed collator, so a ``LoraSFTTrainer`` built in code batches as run_sft does (as
TRL's ``SFTTrainer._prepare_dataset`` packs inside the trainer), and the collator's batches given the positions the
loss trains where nothing slices them on their way (``with_supervised_positions``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, ProcessorMixin
from transformers.utils import logging

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.batching import VARLEN_ATTENTION, ResolvedBatching, is_flash_attention, resolve_batching
from hf_lora_ds.data.batches.collator import SupervisedPositionsCollator, build_collator, check_model_batching
from hf_lora_ds.data.batches.packing import PackedDataset, training_samples
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.layer_kinds import sequence_mixers
from hf_lora_ds.model.loading import base_model_config
from hf_lora_ds.model.packed_boundaries import packed_batch_keys, packing_refusal
from hf_lora_ds.vision.collator import VisionCollator
from hf_lora_ds.vision.encoding import ImageEncoding
from hf_lora_ds.vision.every_rank import blank_image_pixels, run_tower_in_every_forward
from hf_lora_ds.vision.modules import auto_model_class
from hf_lora_ds.vision.packing import packed_rope_index

__all__ = ["boundary_keys", "prepare_batches", "settle_batching", "with_supervised_positions"]

logger = logging.get_logger(__name__)


def settle_batching(args: SFTTrainingArguments, model: torch.nn.Module | None = None) -> None:
    """``args.batching`` for the model's layers, before any data is read: ``auto`` becomes padded for a model with
    layers besides attention, and packed or padding-free batches that such layers would let leak from one sample
    into the next are refused in one line. ``model`` None: the run's model, built from its config on the meta device
    (no weight is read). ``prepare_batches`` checks the loaded model's attention too."""
    if args.batching == "padded":
        return
    model = model if model is not None else _meta_model(args)
    if args.batching_asked == "auto":
        args.batching = resolve_batching("auto", args.attn_implementation, bool(sequence_mixers(model)))
    boundary_keys(args.batching, model)


def boundary_keys(batching: ResolvedBatching, model: torch.nn.Module) -> tuple[str, ...]:
    """What packed or padding-free batches must carry for ``model``'s non-attention layers to keep their samples
    apart (hf_lora_ds.model.packed_boundaries), and for ``varlen_attn``, which reads ``cu_seq_lens`` rather than the
    position ids; the one-line refusal where they cannot."""
    if batching == "padded":
        return ()
    keys = packed_batch_keys(model)
    if keys is None:
        raise UserError(packing_refusal(batching, model))
    if getattr(model.config, "_attn_implementation", None) == VARLEN_ATTENTION and "cu_seq_lens_q" not in keys:
        keys = (*keys, "cu_seq_lens_q")
    return keys


def _meta_model(args: SFTTrainingArguments) -> torch.nn.Module:
    """The run's model with its layers and no weights; the default attention (flash needs no kernel here)."""
    from transformers.modeling_utils import set_zero3_state

    # set_zero3_state: under ZeRO-3 from_config would build inside deepspeed.zero.Init, which cannot partition meta.
    with set_zero3_state(), torch.device("meta"):
        config = base_model_config(args)
        return auto_model_class(config).from_config(config, trust_remote_code=args.trust_remote_code)


def prepare_batches(
    args: SFTTrainingArguments,
    model: torch.nn.Module,
    train_dataset: Any,
    eval_dataset: Any,
    data_collator: Callable | None,
    processing_class: PreTrainedTokenizerBase | ProcessorMixin | None,
) -> tuple[Any, Any, Callable | None]:
    """``(train_dataset, eval_dataset, data_collator)`` for ``args.batching``: datasets packed unless they already are
    (or absent), and the collator built unless one is given: for image samples, one that adds their pixels
    (hf_lora_ds.vision.collator)."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)  # a processor's own tokenizer pads
    batching: ResolvedBatching = args.batching  # resolved when the arguments were built (hf_lora_ds.config.batching)
    check_model_batching(batching, model)
    boundaries = boundary_keys(batching, model)
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
            batching, tokenizer, args.pad_to_multiple_of, args.engine.sequence_parallel, one_row, boundaries
        )
        if (images := image_encoding(train_dataset)) is not None:
            data_collator = VisionCollator(data_collator, images, packed_rope_index(batching, model))
            if args.world_size > 1:  # every rank runs the tower in every forward (hf_lora_ds.vision.every_rank)
                run_tower_in_every_forward(model, blank_image_pixels(data_collator.processor, data_collator.outputs))
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


def image_encoding(dataset: Any) -> ImageEncoding | None:
    """How the dataset's image samples were tokenized, where it has any (a vision-language model's records)."""
    samples = training_samples(dataset)
    return samples.encoder.vision if isinstance(samples, ChatSFTDataset) else None


def _packed(dataset: Any, capacity: int, name: str) -> Any:
    """``dataset``'s samples in rows of ``capacity`` tokens (hf_lora_ds.data.batches.packing); None and packed rows as
    given."""
    if dataset is None or isinstance(dataset, PackedDataset):
        return dataset
    if not hasattr(dataset, "lengths"):
        raise ValueError(
            f"--batching packed packs by the samples' lengths, and the {name} dataset "
            f"({type(dataset).__name__}) has no 'lengths': pass a ChatSFTDataset"
        )
    return PackedDataset(dataset, capacity)
