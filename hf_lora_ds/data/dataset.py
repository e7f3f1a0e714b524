"""Chat-template SFT data with exact labels: every token is -100 except what each trained assistant turn says.

Stock templates (Qwen's among them) have no ``{% generation %}`` block, so transformers' assistant mask comes back
all zeros, and response-marker strings tokenize differently in context. So the supervised spans come from the
template as inference uses it (hf_lora_ds.data.masking.template_rule): what the model must generate after each turn's
inference prompt, through its end-of-turn token, mapped to tokens by offsets and checked against the text. A template
that breaks this raises a ``TemplateError`` naming the record instead of training on a wrong mask.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from hf_lora_ds.data.formats import FormatOptions, to_conversation
from hf_lora_ds.data.formats.registry import fingerprint
from hf_lora_ds.data.masking import (
    IGNORE_INDEX,
    AssistantTurns,
    Locator,
    PlainText,
    TemplateError,
    TextMask,
    ThinkingOptions,
    TrainingText,
    TurnRules,
    as_template_reads,
    plan_turns,
    prefix_samples,
    render_samples,
    text_mask,
    with_user_turns,
)
from hf_lora_ds.data.records import DataError, decode_record
from hf_lora_ds.data.records.record_table import cache_root
from hf_lora_ds.data.sources import LoadedData, load_data
from hf_lora_ds.data.tokens import FlatLabels, TokenBytes, labels_from_spans, tokenized_labels
from hf_lora_ds.distributed import main_process_first
from hf_lora_ds.vision.encoding import ImageEncoding, image_reference, with_image_text
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = ["ChatSFTDataset", "TemplateError", "IGNORE_INDEX", "render_samples", "labels_from_spans"]

# Compact columns: labels as int32 like the token ids (datasets would infer int64 for them), the mask as int8.
# The map function writes them as Arrow arrays, in this order (``_Encoder.table``).
_SAMPLE_FEATURES = datasets.Features(
    {
        "where": datasets.Value("string"),
        "source": datasets.Value("string"),
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "attention_mask": datasets.Sequence(datasets.Value("int8")),
        "labels": datasets.Sequence(datasets.Value("int32")),
        "length": datasets.Value("int32"),
        "num_supervised": datasets.Value("int32"),
        "truncated": datasets.Value("bool"),
        # A record's first sample carries what the record said besides its turns: the fields and message keys no
        # reader used (comma-separated), and the turns its training flags switched off and on.
        "unused": datasets.Value("string"),
        "turns_off": datasets.Value("int32"),
        "turns_on": datasets.Value("int32"),
        "tokens_masked": datasets.Value("int32"),  # by training flags, inside located turns
        "tokens_on": datasets.Value("int32"),  # trained in turns that only the flags train
        # A sample's images as references, its pixels made per batch (hf_lora_ds.vision.collator); whether its
        # truncation would cut an image (such a sample is dropped and counted).
        "images": datasets.List({"bytes": datasets.Value("binary"), "path": datasets.Value("string")}),
        "image_cut": datasets.Value("bool"),
    }
)
_IMAGES_TYPE = _SAMPLE_FEATURES.arrow_schema.field("images").type
EmptyLabelsPolicy = Literal["drop", "error"]
FLAG_COUNTS = ("turns_off", "turns_on", "tokens_masked", "tokens_on")


class ChatSFTDataset(torch.utils.data.Dataset):
    """Tokenized chat SFT samples: ``ds[i]`` is a dict of ``input_ids``, ``attention_mask`` and ``labels`` lists.

    Records are validated, rendered and tokenized by a batched ``datasets`` map over the memory-mapped record
    table (``hf_lora_ds.data.records.record_table``), in ``num_proc`` processes, into a cached Arrow file: the samples
    are never all Python objects at once, a bad record still fails with its file, line and field before training, and a
    second run with the same data, tokenizer and settings reads the cache instead of tokenizing again.

    Args:
        data: a source or weighted mixture as ``--train_file`` takes it (see ``hf_lora_ds.data.sources``), records
            already loaded by ``sources.load_data``, or a list of records in any format of ``hf_lora_ds.data.formats``.
        tokenizer: a fast tokenizer whose chat template renders the conversations.
        max_length: truncate longer samples to this many tokens (right side); None keeps them whole.
        system_prompt: system turn to add to records that have none (a record's own system turn wins).
        assistant_turns: train on ``"all"`` assistant turns or only the ``"last"`` one.
        on_empty_labels: a sample left with no supervised token (by truncation) is ``"drop"``-ped and counted,
            or raises an ``"error"`` naming it.
        cache_dir: where record tables and tokenized arrow files are cached; None uses the datasets cache.
        formats: column mapping and ShareGPT role names (``FormatOptions``); None: the defaults.
        num_proc: processes that validate and tokenize (``--preprocessing_num_workers``); None: this one.
        thinking: which ``<think>`` blocks of a thinking template are trained (``ThinkingOptions``); None: defaults.
        processor: a vision-language model's processor: records may hold images (hf_lora_ds.vision.encoding);
            None: a text-only model, whose records with images are refused.
        image_bounds: the pixels an image keeps (hf_lora_ds.vision.resolution); None: the defaults.
    """

    def __init__(
        self,
        data: str | Path | list[dict] | LoadedData,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int | None = None,
        system_prompt: str | None = None,
        assistant_turns: AssistantTurns = "all",
        on_empty_labels: EmptyLabelsPolicy = "drop",
        cache_dir: str | Path | None = None,
        formats: FormatOptions | None = None,
        num_proc: int | None = None,
        thinking: ThinkingOptions | None = None,
        processor: ProcessorMixin | None = None,
        image_bounds: PixelBounds | None = None,
    ):
        if not tokenizer.is_fast:
            raise TemplateError("a fast tokenizer is required (its offsets locate the assistant spans exactly)")
        if tokenizer.chat_template is None:
            raise TemplateError("the tokenizer has no chat_template; set tokenizer.chat_template first")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.assistant_turns = assistant_turns
        loaded = data if isinstance(data, LoadedData) else load_data(data, cache_dir=cache_dir)
        self.source_counts = loaded.counts()
        encoder = _Encoder(
            tokenizer,
            max_length,
            system_prompt,
            assistant_turns,
            formats or FormatOptions(),
            thinking or ThinkingOptions(),
            ImageEncoding.of(processor, image_bounds or PixelBounds()) if processor is not None else None,
        )
        encoder.source_formats = dict(loaded.formats)  # a dataset_info.json entry reads its records its own way
        self.encoder, self.records = encoder, loaded.table
        # Locations and sources are part of the cached output, so the table's fingerprint keys the cache with them.
        key = Hasher.hash([loaded.table._fingerprint, encoder.settings(), _code_version()])
        workers = min(num_proc or 1, len(loaded.table))  # datasets runs no more workers than rows
        num_proc = workers if workers > 1 else None
        cache_file = cache_root(cache_dir) / f"chat_sft-{key}.arrow"
        with main_process_first():
            if not _cached(cache_file, num_proc):
                # Validation alone is ~50x faster than rendering and tokenizing: a bad record at line 900,000 of
                # a million fails within a minute, not after most of the file has been tokenized.
                loaded.table.map(encoder.validate, batched=True, num_proc=num_proc, desc="Validating records")
            tokenized = loaded.table.map(
                encoder,
                batched=True,
                num_proc=num_proc,
                remove_columns=loaded.table.column_names,  # a conversation may give several samples
                features=_SAMPLE_FEATURES,
                new_fingerprint=key,
                cache_file_name=str(cache_file),
                desc="Tokenizing with the chat template",
            )
        table = tokenized.data.table  # memory-mapped: the checks below read columns, not Python rows
        cut = table["image_cut"].combine_chunks()
        self.num_image_cut = pc.sum(cut).as_py() or 0
        if self.num_image_cut and on_empty_labels == "error":
            first = pc.index(cut, True).as_py()
            raise DataError(
                f"{table['where'][first].as_py()}: sample {first}: truncation to max_length={max_length} cuts an "
                f"image ({self.num_image_cut} such samples); raise max_length, lower --image_max_pixels or set "
                "on_empty_labels='drop'"
            )
        empty = pc.or_(pc.equal(table["num_supervised"], 0), cut).combine_chunks()
        num_empty = pc.sum(empty).as_py() or 0
        if num_empty and on_empty_labels == "error":
            first = pc.index(empty, True).as_py()
            raise DataError(
                f"{table['where'][first].as_py()}: sample {first} has no supervised token left after truncation to "
                f"max_length={max_length} ({num_empty} such samples); raise max_length or set on_empty_labels='drop'"
            )
        self.unused_fields = _unused_counts(table["unused"])
        self.flag_counts = {name: pc.sum(table[name]).as_py() or 0 for name in FLAG_COUNTS}
        self.dropped_by_source = _count_values(table["source"].filter(empty))
        self.truncated_by_source = _count_values(table["source"].filter(table["truncated"]))
        self.num_dropped = num_empty
        self.num_truncated = sum(self.truncated_by_source.values())
        kept = np.flatnonzero(~empty.to_numpy(zero_copy_only=False))
        self.samples = tokenized.select(kept) if num_empty else tokenized
        columns = ["input_ids", "attention_mask", "labels"] + (["images"] if processor is not None else [])
        self.samples = self.samples.with_format(columns=columns)
        if len(self.samples) == 0:
            raise DataError(f"no trainable samples: all {len(tokenized)} lost their supervised tokens to truncation")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.samples[index]

    def unused_note(self) -> str:
        """``; unused fields: history (1 record), messages[].name (3 records)`` for the data summary line: what the
        records hold that nothing read, named once; empty when they hold nothing else."""
        if not self.unused_fields:
            return ""
        named = (f"{name} ({count} record{'s' if count != 1 else ''})" for name, count in self.unused_fields.items())
        return "; unused fields: " + ", ".join(named)

    @property
    def lengths(self) -> list[int]:
        return list(self.samples.with_format(None)["length"])

    @property
    def sources(self) -> list[str]:
        """The source (``--train_file`` entry) of each sample, for per-source counts and audits."""
        return list(self.samples.with_format(None)["source"])


class _Encoder:
    """The batched ``map`` function: decode and validate each record (errors name its file, line and field), render
    it with the chat template and tokenize it with its exact labels. A class, so worker processes get it pickled."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int | None,
        system_prompt: str | None,
        assistant_turns: AssistantTurns,
        formats: FormatOptions,
        thinking: ThinkingOptions,
        vision: ImageEncoding | None = None,
    ):
        self.tokenizer = tokenizer
        self.vision = vision
        self.max_length = max_length
        self.system_prompt = system_prompt
        self.assistant_turns = assistant_turns
        self.formats = formats
        self.source_formats: dict[str, FormatOptions] = {}
        self.thinking = thinking
        self.rules = TurnRules.of(tokenizer, thinking)
        self.locator = Locator(self.rules, assistant_turns)
        self.plain_text = PlainText(tokenizer)

    @cached_property
    def token_bytes(self) -> TokenBytes | None:
        """Built when the first batch is tokenized, not for a dataset its cache already holds."""
        return TokenBytes.of(self.tokenizer)

    def settings(self) -> list[Any]:
        """Everything besides the records that decides the output: vocabulary, template and options."""
        return [
            self.tokenizer.backend_tokenizer.to_str(),
            self.tokenizer.chat_template,
            self.max_length,
            self.system_prompt,
            self.assistant_turns,
            self.formats,
            sorted(self.source_formats.items()),
            vars(self.thinking),
            fingerprint(),  # a user's own record format too (hf_lora_ds.data.formats.registry)
            self.vision.settings() if self.vision else None,
        ]

    def conversations(self, batch: dict[str, list]) -> Iterator[dict[str, Any]]:
        """Each record of the batch validated and normalised; the first bad one raises, naming its location. A
        conversation whose training flags (or TRL prompt) choose its trained turns gets them as ``plan``/``turns``."""
        sources = batch["source"] if "source" in batch else repeat(None)  # a table of records and places alone
        for text, where, source in zip(batch["record"], batch["where"], sources):
            formats = self.source_formats.get(source, self.formats)
            record = decode_record(text, where)
            conversation = to_conversation(record, where, self.system_prompt, formats, images=self.vision is not None)
            if conversation["messages"] is None:  # plain text (TRL's standard kinds)
                yield conversation
                continue
            if self.vision is not None:
                conversation["messages"] = with_image_text(conversation["messages"], self.vision.image_text)
            conversation["messages"] = as_template_reads(conversation, self.rules.traits, where)
            plan = plan_turns(conversation, self.assistant_turns, where)
            if plan is not None:
                conversation["plan"], conversation["turns"] = plan, plan.located
            yield conversation

    def samples(self, conversation: dict[str, Any], where: str = "record") -> list[TrainingText]:
        """The training texts and spans of one conversation
        (``hf_lora_ds.data.masking.template_rule.render_samples``)."""
        return self.sample_lists([conversation], [where])[0]

    def sample_lists(self, conversations: list[dict[str, Any]], wheres: list[str]) -> list[list[TrainingText]]:
        """Each conversation's samples: located (``hf_lora_ds.data.masking.skeleton``) where that is proven exact, else
        by the prefix rule, which also raises, conversation by conversation, any error of either, naming the record."""
        chats = [conversation for conversation in conversations if conversation["messages"] is not None]
        located = iter(self.locator.samples(chats))
        samples = []
        for conversation, where in zip(conversations, wheres):
            if conversation["messages"] is None:
                samples.append([self.plain_text.sample(conversation)])
                continue
            found = next(located)
            samples.append(self._rule_samples(conversation, where, found))
        return samples

    def _rule_samples(
        self, conversation: dict[str, Any], where: str, located: list[TrainingText] | None = None
    ) -> list[TrainingText]:
        """The conversation's samples (``located`` by the skeleton, else by the prefix rule), with the user turns its
        flags train (``hf_lora_ds.data.masking.user_turns``); an error names the record."""
        turns, messages, tools = (
            conversation.get("turns", self.assistant_turns),
            conversation["messages"],
            conversation["tools"],
        )
        plan = conversation.get("plan")
        try:
            samples = located if located is not None else prefix_samples(self.rules, messages, turns, tools)
            return with_user_turns(self.rules, messages, tools, plan.users, samples) if plan and plan.users else samples
        except TemplateError as err:
            raise TemplateError(f"{where}: {err}") from None

    def masks(self, conversation: dict[str, Any], samples: list[TrainingText], where: str) -> list[TextMask | None]:
        """Each sample's characters switched off (or on) by the record's training flags (``turn_flags``)."""
        plan = conversation.get("plan")
        if plan is None:
            return [None] * len(samples)
        try:
            return [text_mask(plan, sample, conversation["messages"]) for sample in samples]
        except TemplateError as err:
            raise TemplateError(f"{where}: {err}") from None

    def validate(self, batch: dict[str, list]) -> None:
        """The validation pass: a ``map`` function that returns nothing, so datasets writes nothing."""
        for _ in self.conversations(batch):
            pass

    def __call__(self, batch: dict[str, list]) -> pa.Table:
        with _collector_paused():
            return self.encode(batch)

    def encode(self, batch: dict[str, list]) -> pa.Table:
        """A batch of records' samples: rendered, tokenized with offsets, labelled, as the samples' columns."""
        texts, spans, masks, places, notes, images = [], [], [], [], [], []
        conversations = list(self.conversations(batch))
        samples_of = self.sample_lists(conversations, batch["where"])
        for conversation, samples, where, source in zip(conversations, samples_of, batch["where"], batch["source"]):
            masks += self.masks(conversation, samples, where)
            plan = conversation.get("plan")
            for k, sample in enumerate(samples):
                texts.append(sample.text)
                spans.append(sample.spans)
                shown = self.vision.count(sample.text) if self.vision else 0
                images.append(conversation.get("images", [])[:shown])
                places.append((where, source))
                first = k == 0 and plan is not None
                notes.append(
                    (
                        ",".join(conversation["unused"]) if k == 0 else "",
                        plan.switched_off if first else 0,
                        plan.switched_on if first else 0,
                    )
                )
        flat = tokenized_labels(self.tokenizer, texts, spans, masks if any(masks) else None, self.token_bytes)
        if any(images):
            flat = self.vision.expand_batch(flat, texts, images, [where for where, _ in places])
        return self.table(flat, places, notes, images)

    def table(
        self, flat: FlatLabels, places: list[tuple[str, str]], notes: list[tuple[str, int, int]], images: list[list]
    ) -> pa.Table:
        """The samples' columns (``_SAMPLE_FEATURES``), built as Arrow arrays from flat numpy ones rather than from
        a Python list per sample: truncated to ``max_length``, with their lengths and supervised-token counts."""
        sample = np.repeat(np.arange(len(flat.lengths)), flat.lengths)  # the sample of each token
        lengths = flat.lengths if self.max_length is None else np.minimum(flat.lengths, self.max_length)
        starts = np.cumsum(flat.lengths) - flat.lengths
        kept = np.arange(len(flat.ids)) - starts[sample] < lengths[sample]
        image_cut = (
            self.vision.cut(flat.ids[~kept], sample[~kept], len(lengths))
            if self.vision
            else np.zeros(len(lengths), dtype=bool)
        )
        labels, sample = flat.labels[kept], sample[kept]
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]), type=pa.int32())
        supervised = np.bincount(sample[labels != IGNORE_INDEX], minlength=len(lengths))
        columns = {
            "where": pa.array([where for where, _ in places], type=pa.string()),
            "source": pa.array([source for _, source in places], type=pa.string()),
            "input_ids": pa.ListArray.from_arrays(offsets, flat.ids[kept]),
            "attention_mask": pa.ListArray.from_arrays(offsets, np.ones(len(labels), dtype=np.int8)),
            "labels": pa.ListArray.from_arrays(offsets, labels),
            "length": pa.array(lengths, type=pa.int32()),
            "num_supervised": pa.array(supervised, type=pa.int32()),
            "truncated": pa.array(flat.lengths > lengths),
            "unused": pa.array([unused for unused, _, _ in notes], type=pa.string()),
            "turns_off": pa.array([off for _, off, _ in notes], type=pa.int32()),
            "turns_on": pa.array([on for _, _, on in notes], type=pa.int32()),
            "tokens_masked": pa.array(flat.flag_counts[:, 0], type=pa.int32()),
            "tokens_on": pa.array(flat.flag_counts[:, 1], type=pa.int32()),
            "images": pa.array([[image_reference(image) for image in shown] for shown in images], type=_IMAGES_TYPE),
            "image_cut": pa.array(image_cut),
        }
        return pa.Table.from_pydict(columns, schema=_SAMPLE_FEATURES.arrow_schema)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off for one batch: the batch allocates a tuple per token offset, and each pass of
    the collector that this sets off walks the whole heap (torch and transformers hold millions of objects), which
    cost about an eighth of the tokenizing time. Reference counting frees what a batch allocates; the few cycles it
    makes (a new shape's first renders) are collected after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _cached(cache_file: Path, num_proc: int | None) -> bool:
    """Whether ``map`` will read its output from the cache: one file, or one per worker (datasets' shard names)."""
    if not num_proc:
        return cache_file.is_file()
    shards = (cache_file.with_name(f"{cache_file.stem}_{i:05d}_of_{num_proc:05d}.arrow") for i in range(num_proc))
    return all(shard.is_file() for shard in shards)


def _unused_counts(column: pa.ChunkedArray) -> dict[str, int]:
    """Records per unused field name, from the comma-joined names of each record's first sample, by name."""
    counts: Counter = Counter()
    for names, count in _count_values(column).items():
        for name in filter(None, names.split(",")):
            counts[name] += count
    return dict(sorted(counts.items()))


def _count_values(column: pa.ChunkedArray) -> Counter:
    """``Counter`` of a string column's values, counted by Arrow rather than over Python strings."""
    return Counter({item["values"].as_py(): item["counts"].as_py() for item in pc.value_counts(column)})


def _code_version() -> str:
    """A hash of the data package's modules, its subpackages' too (among them those that decide the tokenized
    output: the record formats), so a changed hf_lora_ds does not reuse old caches."""
    package = Path(__file__).parents[1]
    modules = [*(package / "data").rglob("*.py"), *(package / "vision").rglob("*.py")]
    return Hasher.hash([path.read_bytes() for path in sorted(modules)])
