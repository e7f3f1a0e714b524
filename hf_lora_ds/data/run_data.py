"""A run's data from its flags: the records ``--train_file``/``--eval_file`` name, and the dataset they tokenize to.

run_sft, ``python -m hf_lora_ds.audit`` and ``python -m hf_lora_ds.plan`` all build their data here, from the same
parsed flags (``SFTTrainingArguments`` or the values hf_lora_ds.launch.resolve reads for it), so the three count the
same samples.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase, ProcessorMixin

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.masking.thinking import ThinkingOptions
from hf_lora_ds.data.sources import LoadedData, load_data
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = ["image_bounds", "load_run_data", "sft_dataset"]


def load_run_data(spec: str, args: SFTTrainingArguments, dataset: str | None = None) -> LoadedData:
    """``--train_file``/``--eval_file`` records, mixed with the run's seed and cached where the run caches data;
    ``dataset``: the entries of a ``dataset_info.json`` (``--dataset``, for ``--train_file``)."""
    return load_data(
        spec,
        seed=args.seed,
        trust_remote_code=args.trust_remote_code,
        cache_dir=args.dataset_cache_dir,
        dataset=dataset,
    )


def sft_dataset(
    data: LoadedData,
    tokenizer: PreTrainedTokenizerBase,
    args: SFTTrainingArguments,
    processor: ProcessorMixin | None = None,
) -> ChatSFTDataset:
    """The records tokenized with exact label masks, as the run's data flags ask; with a vision-language model's
    ``processor``, their images too, within the run's pixel bounds."""
    return ChatSFTDataset(
        data,
        tokenizer,
        max_length=args.max_length,
        system_prompt=args.system_prompt,
        assistant_turns=args.assistant_turns,
        on_empty_labels=args.on_empty_labels,
        cache_dir=args.dataset_cache_dir,
        formats=FormatOptions.from_flags(args.columns, args.sharegpt_roles),
        num_proc=args.preprocessing_num_workers,
        thinking=ThinkingOptions(args.train_reasoning, args.empty_think),
        processor=processor,
        image_bounds=image_bounds(args),
    )


def image_bounds(args: SFTTrainingArguments) -> PixelBounds:
    """The pixels an image keeps (``--image_max_pixels``, ``--image_min_pixels``)."""
    return PixelBounds(args.image_max_pixels, args.image_min_pixels)
