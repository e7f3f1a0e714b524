"""What ``LoraSFTTrainer`` builds from what it is handed, as TRL's ``SFTTrainer`` does: the base from a hub id or a
path, its tokenizer, the datasets from raw records, the eval records with their accuracy callback, and where to resume.

A dataset may be a list of records, a ``datasets.Dataset``, a file, folder, Hub id or mixture as ``--train_file``
takes it, or already tokenized (a ``ChatSFTDataset``, or any torch dataset, used as it is); none given, the run's
``--train_file``/``--eval_file`` are read. Everything that can stop the run is checked before the model loads: the
arguments as a command line's are (hf_lora_ds.launch.resolve), the checkpoint to resume from, every record (file,
line, field), the memory plan.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import datasets
import torch
import transformers
from transformers import PreTrainedTokenizerBase, ProcessorMixin, TrainerCallback
from transformers.utils import logging

from hf_lora_ds.callbacks import AnswerAccuracyCallback, MemoryTraceCallback
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.reporting import chosen_callbacks
from hf_lora_ds.data.audit import check_round_trip
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.data.run_data import load_run_data, sft_dataset
from hf_lora_ds.data.sources import LoadedData, load_data
from hf_lora_ds.distributed import describe_world
from hf_lora_ds.errors import UserError
from hf_lora_ds.eval import get_task, load_samples, run_eval_options
from hf_lora_ds.eval.tasks import Task
from hf_lora_ds.launch.resolve import resolve_arguments
from hf_lora_ds.model.loading import load_base_model, load_run_processor, load_tokenizer
from hf_lora_ds.plan import check_run_fits, profile_from_dataset
from hf_lora_ds.training.batches import settle_batching
from hf_lora_ds.training.checkpoints import ResumePoint, resolve_resume_checkpoint

__all__ = ["RunInputs", "prepare_run_inputs"]

logger = logging.get_logger(__name__)

Data = str | os.PathLike | list | datasets.Dataset | torch.utils.data.Dataset | None


@dataclass
class RunInputs:
    """The run's model, tokenizer and datasets as the trainer takes them, and what it evaluates with."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase | None
    processor: ProcessorMixin | None  # a vision-language model's: its images' processor, around ``tokenizer``
    train_dataset: Any
    eval_dataset: Any  # tokenized, for Trainer's eval loss during training
    eval_records: list | None  # raw, generated from for answer accuracy
    task: Task
    resume: ResumePoint
    callbacks: list[TrainerCallback]  # the caller's, as given
    made: list[TrainerCallback]  # the run's own made here: the memory tracer that saw the load, the accuracy callback


def prepare_run_inputs(
    model: str | os.PathLike | torch.nn.Module,
    args: SFTTrainingArguments,
    train_dataset: Data,
    eval_dataset: Data,
    tokenizer: PreTrainedTokenizerBase | None,
    callbacks: list[TrainerCallback],
) -> RunInputs:
    """Everything the trainer needs, in the order that stops a bad run earliest (see the module docstring)."""
    transformers.set_seed(args.seed)  # before LoRA wrapping: Trainer seeds only after; the adapter's init must repeat
    by_name = isinstance(model, (str, os.PathLike))
    if by_name:
        _take_model_name(str(model), args)
    resolve_arguments(args)  # arguments built in code: the command line's checks, before anything loads
    # "auto" picks the latest checkpoint every rank finished; a ZeRO one from another rank count that this run cannot
    # convert to a universal checkpoint fails here, not after the model is loaded.
    resume = resolve_resume_checkpoint(
        args.resume_from_checkpoint, args.output_dir, args.world_size, args.engine.deepspeed_config
    )
    logger.info(
        "\n".join([describe_world(args, args.engine.sequence_parallel), *([resume.note] if resume.note else [])])
    )
    # --batching for the model's layers (auto padded for a hybrid, packing refused where it would leak) before the
    # data is read and planned for.
    settle_batching(args, None if by_name else model)
    processor, tokenizer = _processing(tokenizer, args, by_name)
    train = _training_data(train_dataset if train_dataset is not None else args.train_file, tokenizer, args, processor)
    if by_name and isinstance(train, ChatSFTDataset):
        check_run_fits(args, profile_from_dataset(train))  # the model it plans is the one about to load
    task = get_task(args.eval_task)
    eval_data = _eval_data(eval_dataset if eval_dataset is not None else args.eval_file, args)
    eval_records = list(eval_data.records) if eval_data else None  # generated from, so held whole: keep it small
    if eval_records:
        # every record checked as its task reads it (with its images, for a vision-language model)
        load_samples(eval_records, task, args.system_prompt, images=processor is not None)
    # With --eval_strategy, Trainer's evaluations report the loss on the eval set and the callback below its accuracy.
    evaluating = args.eval_strategy != "no" and (eval_data is not None or eval_dataset is not None)
    memory = next((cb for cb in callbacks if isinstance(cb, MemoryTraceCallback)), None)
    if memory is None and "memory" in chosen_callbacks(args.run_callbacks):
        memory = MemoryTraceCallback()
    if by_name:
        with memory.phase("load") if memory else contextlib.nullcontext():  # attached with the run's other callbacks
            model, quantized = load_base_model(args)
        if quantized:
            logger.info(quantized)
    made: list[TrainerCallback] = [] if memory is None or memory in callbacks else [memory]
    if evaluating and eval_records:
        options = run_eval_options(args)
        made.append(
            AnswerAccuracyCallback(
                processor or _need(tokenizer), eval_records, task, predictions_dir=args.output_dir, **options
            )
        )
    eval_tokenized = eval_dataset if eval_data is None else None  # a tokenized set as it is
    if evaluating and eval_data is not None:
        eval_tokenized = sft_dataset(eval_data, _need(tokenizer), args, processor)
    return RunInputs(model, tokenizer, processor, train, eval_tokenized, eval_records, task, resume, callbacks, made)


def _take_model_name(name: str, args: SFTTrainingArguments) -> None:
    """The run's model is the one named: recorded in ``args`` (the planner, the loaders and the saved arguments read
    it there), and refused where ``args`` names another."""
    if args.model_name_or_path and args.model_name_or_path != name:
        raise UserError(
            f"model {name!r} and --model_name_or_path {args.model_name_or_path!r} name two models; pass one of them"
        )
    args.model_name_or_path = name


def _processing(
    given: PreTrainedTokenizerBase | ProcessorMixin | None, args: SFTTrainingArguments, by_name: bool
) -> tuple[ProcessorMixin | None, PreTrainedTokenizerBase | None]:
    """``(processor, tokenizer)``: what the caller passed, else the named base's (a vision-language model's
    processor holds its tokenizer; a text model has none)."""
    if isinstance(given, ProcessorMixin):
        return given, given.tokenizer
    if given is not None or not by_name:
        return None, given
    processor = load_run_processor(args)
    return processor, processor.tokenizer if processor is not None else load_tokenizer(args)


def _training_data(
    data: Data, tokenizer: PreTrainedTokenizerBase | None, args: SFTTrainingArguments, processor: ProcessorMixin | None
) -> Any:
    """The training samples: tokenized with exact masks from records, with the data line and the inference round
    trip printed (rank 0); a tokenized dataset as it is."""
    if data is None or isinstance(data, torch.utils.data.Dataset):
        return data
    records = _records(data, args, args.dataset)
    dataset = sft_dataset(records, _need(tokenizer), args, processor)
    logger.info(records.summary() + dataset.unused_note())
    logger.info(check_round_trip(dataset).line())  # inference prompts start the training texts, on a sample
    return dataset


def _eval_data(data: Data, args: SFTTrainingArguments) -> LoadedData | None:
    """The eval set's records; a tokenized eval set (or none) has none to generate from."""
    if not data or isinstance(data, torch.utils.data.Dataset):
        return None
    return _records(data, args)


def _records(data: Data, args: SFTTrainingArguments, dataset: str | None = None) -> LoadedData:
    """Records as ``--train_file`` reads them: a spec (mixed with the run's seed, cached where the run caches data),
    a list, or a ``datasets.Dataset``'s rows."""
    if isinstance(data, datasets.Dataset):
        data = data.to_list()
    if isinstance(data, list):
        return load_data(data, cache_dir=args.dataset_cache_dir)
    return load_run_data(os.fspath(data), args, dataset)


def _need(tokenizer: PreTrainedTokenizerBase | None) -> PreTrainedTokenizerBase:
    if tokenizer is None:
        raise UserError("records to tokenize and no tokenizer: pass processing_class, or the model by its name")
    return tokenizer
