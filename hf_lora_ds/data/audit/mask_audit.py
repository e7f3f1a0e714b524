"""Dataset-wide mask audit: what the model will actually be trained on, before a GPU-hour is spent.

``python -m hf_lora_ds.audit`` (run_sft's flags) prints the full report, one per source of a mixture; every run logs
its one-line summary first. It catches the silent failures: samples with no supervised token, answers cut by
truncation, spans that do not end in the end-of-turn token, inference prompts that do not start the training text.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Collection
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from hf_lora_ds.data.audit.inference_prompts import RoundTrip
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset

__all__ = [
    "ImageCounts",
    "MaskAudit",
    "audit_dataset",
    "image_token_ids",
    "audit_by_source",
    "render_supervision",
    "show_samples",
    "trained_spans",
]

OPEN, CLOSE = "[[", "]]"


@dataclass
class MaskAudit:
    samples: int
    supervised_min: int
    supervised_median: float
    supervised_max: int
    truncated: int
    dropped_empty: int
    spans: int
    spans_ending_in_eot: int
    spans_cut_by_truncation: int
    example: str
    round_trip: RoundTrip | None = None  # checked by the CLI on every record (hf_lora_ds.data.audit.inference_prompts)
    flags: dict[str, int] | None = None  # what the records' training flags changed (hf_lora_ds.data.masking.turn_flags)
    stop_tokens: tuple[str, ...] | None = None  # a template with no end-of-turn token: what ends a reply (GLM-4)
    eos_token: str | None = None
    images: ImageCounts | None = None  # a vision-language model's samples: their images and image tokens

    def images_line(self) -> str | None:
        return self.images.line() if self.images else None

    def stop_line(self) -> str | None:
        """What a reply is trained through where the template writes no end-of-turn token after it, or None."""
        if not self.stop_tokens:
            return None
        roles = [token for token in self.stop_tokens if token != self.eos_token]
        said = [f"the next turn's role token ({', '.join(roles)})"] if roles else []
        if self.eos_token in self.stop_tokens:
            said.append(f"eos ({self.eos_token}) where that role token is no token of the vocabulary")
        return (
            f"replies end in {' or '.join(said)}, which stops generation: the template writes no end-of-turn "
            "token, so a reply is trained through that token"
        )

    def flags_line(self) -> str | None:
        """What the records' per-turn training flags changed against ``--assistant_turns``, or None if nothing."""
        if not self.flags or not any(self.flags.values()):
            return None
        f = self.flags
        return (
            f"training flags: {f['turns_off']} turns switched off, {f['turns_on']} switched on; "
            f"{f['tokens_masked']} tokens masked inside located turns, {f['tokens_on']} trained in turns only the "
            "flags train"
        )

    @property
    def all_spans_end_in_eot(self) -> bool:
        return self.spans_ending_in_eot + self.spans_cut_by_truncation == self.spans

    def line(self) -> str:
        return (
            f"mask audit: {self.samples} samples, supervised tokens/sample min {self.supervised_min} "
            f"median {self.supervised_median:g} max {self.supervised_max}, {self.truncated} truncated, "
            f"{self.dropped_empty} dropped with no supervised token, "
            f"{self.spans_ending_in_eot}/{self.spans} spans end in the end-of-turn token"
            + (f" ({self.spans_cut_by_truncation} cut by truncation)" if self.spans_cut_by_truncation else "")
            + (f"; {self.round_trip.line()}" if self.round_trip else "")
            + (f"; {flags}" if (flags := self.flags_line()) else "")
            + (f"; {stop}" if (stop := self.stop_line()) else "")
            + (f"; {images}" if (images := self.images_line()) else "")
        )

    def __str__(self) -> str:
        verdict = "yes" if self.all_spans_end_in_eot else "NO: some answers would not teach the model to stop"
        return "\n".join(
            [
                f"samples:                          {self.samples}",
                f"supervised tokens per sample:     min {self.supervised_min}, median {self.supervised_median:g}, "
                f"max {self.supervised_max}",
                f"truncated samples:                {self.truncated}",
                f"dropped, no supervised token:     {self.dropped_empty}",
                f"every span ends in end-of-turn:   {verdict} ({self.spans_ending_in_eot}/{self.spans}, "
                f"{self.spans_cut_by_truncation} cut by truncation)",
                *([self.round_trip.line()] if self.round_trip else []),
                *([flags] if (flags := self.flags_line()) else []),
                *([stop] if (stop := self.stop_line()) else []),
                *([images] if (images := self.images_line()) else []),
                f"sample 0, supervised tokens in {OPEN} {CLOSE}:",
                self.example,
            ]
        )


@dataclass
class ImageCounts:
    """A dataset's images and the tokens they expand to, and how many of those are labels (never any)."""

    images: int
    samples_with_images: int
    image_tokens: int
    trained_image_tokens: int

    def line(self) -> str:
        trained = "none trained" if not self.trained_image_tokens else f"NO: {self.trained_image_tokens} trained"
        per_image = f", {self.image_tokens / self.images:.4g} per image" if self.images else ""
        return (
            f"images: {self.images} in {self.samples_with_images} samples, {self.image_tokens} image tokens"
            f"{per_image} ({trained})"
        )


def render_supervision(
    tokenizer: PreTrainedTokenizerBase, input_ids: list[int], labels: list[int], image_ids: Collection[int] = ()
) -> str:
    """Decode a sample with each supervised run wrapped in [[ ]], so the mask can be read at a glance; an image's
    run of placeholder tokens (``image_ids``) stands as one ``<image: N tokens>``."""
    pieces, run = [], []
    for start, end in _units(input_ids, image_ids):
        if end - start > 1:  # an image's placeholders: never a label
            pieces.append(_marker(end - start))
            continue
        token, label = input_ids[start], labels[start]
        if label != IGNORE_INDEX:
            run.append(token)
            continue
        if run:
            pieces.append(OPEN + tokenizer.decode(run) + CLOSE)
            run = []
        pieces.append(tokenizer.decode([token]))
    if run:
        pieces.append(OPEN + tokenizer.decode(run) + CLOSE)
    return "".join(pieces)


def _units(input_ids: list[int], image_ids: Collection[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each token, a run of one repeated image token as one unit."""
    units, i = [], 0
    while i < len(input_ids):
        end = i + 1
        if input_ids[i] in image_ids:
            while end < len(input_ids) and input_ids[end] == input_ids[i]:
                end += 1
        units.append((i, end))
        i = end
    return units


def _marker(tokens: int) -> str:
    return f"<image: {tokens} tokens>"


def trained_spans(
    tokenizer: PreTrainedTokenizerBase, input_ids: list[int], labels: list[int], image_ids: Collection[int] = ()
) -> tuple[str, list]:
    """A sample's text, decoded whole (each image's placeholders as one ``<image: N tokens>``), and its supervised
    runs as ``[start, end]`` character spans of that text: a run's span ends where the text decoded through it ends
    (runs start and end on character boundaries: at the template's text, or where training flags cut, which follow a
    token's first character)."""
    text = _decode(tokenizer, input_ids, image_ids)
    spans, start = [], None
    for i, label in enumerate([*labels, IGNORE_INDEX]):
        if label != IGNORE_INDEX and start is None:
            start = i
        elif label == IGNORE_INDEX and start is not None:
            before, through = input_ids[:start], input_ids[:i]
            spans.append([len(_decode(tokenizer, before, image_ids)), len(_decode(tokenizer, through, image_ids))])
            start = None
    return text, spans


def image_token_ids(dataset: ChatSFTDataset) -> frozenset[int]:
    """The ids of every token of an image in ``dataset``'s samples (none for a text-only model's)."""
    vision = dataset.encoder.vision
    return frozenset(vision.image_ids.tolist()) if vision is not None else frozenset()


def show_samples(dataset: ChatSFTDataset, count: int, style: str = "text") -> str:
    """The first ``count`` samples with what is trained: ``text``, the decoded sample with each supervised run in
    [[ ]]; ``jsonl``, one JSON object a sample (``sample``, ``where``, ``text``, ``trained``: character spans of
    ``text``), a stable interface for scripts."""
    wheres = dataset.samples.with_format(None).select_columns(["where"])
    image_ids = image_token_ids(dataset)
    lines = []
    for i in range(min(count, len(dataset))):
        sample, where = dataset[i], wheres[i]["where"]
        if style == "jsonl":
            text, spans = trained_spans(dataset.tokenizer, sample["input_ids"], sample["labels"], image_ids)
            lines.append(json.dumps({"sample": i, "where": where, "text": text, "trained": spans}, ensure_ascii=False))
        else:
            marked = render_supervision(dataset.tokenizer, sample["input_ids"], sample["labels"], image_ids)
            lines.append(f"--- sample {i} ({where}), supervised tokens in {OPEN} {CLOSE}:\n{marked}")
    return "\n".join(lines)


def _decode(tokenizer: PreTrainedTokenizerBase, ids: list[int], image_ids: Collection[int] = ()) -> str:
    """The text of ``ids``, decoded whole between images, each image's placeholders as one marker."""
    pieces, text = [], []
    for start, end in _units(ids, image_ids):
        if end - start > 1:
            pieces += [_decode_text(tokenizer, text), _marker(end - start)]
            text = []
        else:
            text.append(ids[start])
    pieces.append(_decode_text(tokenizer, text))
    return "".join(pieces)


def _decode_text(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def audit_dataset(dataset: ChatSFTDataset, source: str | None = None) -> MaskAudit:
    """The audit of every sample, or of those from one ``source`` (an entry of a mixture)."""
    end_of_turn_ids = set(dataset.tokenizer.all_special_ids) | set(dataset.tokenizer.get_added_vocab().values())
    if source is None:
        indices, truncated, dropped = range(len(dataset)), dataset.num_truncated, dataset.num_dropped
    else:
        indices = [i for i, name in enumerate(dataset.sources) if name == source]
        truncated, dropped = dataset.truncated_by_source[source], dataset.dropped_by_source[source]
    image_ids = image_token_ids(dataset)
    images = ImageCounts(0, 0, 0, 0)
    supervised, spans, ending_in_eot, cut = [], 0, 0, 0
    for i in indices:
        sample = dataset[i]
        labels = sample["labels"]
        supervised.append(sum(label != IGNORE_INDEX for label in labels))
        if image_ids:
            _count_images(images, sample, image_ids)
        for end in _run_ends(labels):
            spans += 1
            if labels[end] in end_of_turn_ids:
                ending_in_eot += 1
            elif end == len(labels) - 1 and len(labels) == dataset.max_length:
                cut += 1
    first = dataset[indices[0]]
    return MaskAudit(
        samples=len(indices),
        supervised_min=min(supervised),
        supervised_median=statistics.median(supervised),
        supervised_max=max(supervised),
        truncated=truncated,
        dropped_empty=dropped,
        spans=spans,
        spans_ending_in_eot=ending_in_eot,
        spans_cut_by_truncation=cut,
        example=render_supervision(dataset.tokenizer, first["input_ids"], first["labels"], image_ids),
        flags=dataset.flag_counts if source is None else None,
        stop_tokens=_stop_tokens(dataset),
        eos_token=dataset.tokenizer.eos_token,
        images=images if image_ids else None,
    )


def _count_images(counts: ImageCounts, sample: dict, image_ids: Collection[int]) -> None:
    shown = len(sample.get("images") or [])
    counts.images += shown
    counts.samples_with_images += shown > 0
    is_image = [token in image_ids for token in sample["input_ids"]]
    counts.image_tokens += sum(is_image)
    counts.trained_image_tokens += sum(
        image and label != IGNORE_INDEX for image, label in zip(is_image, sample["labels"])
    )


def _stop_tokens(dataset: ChatSFTDataset) -> tuple[str, ...] | None:
    """The tokens the label rule trains a reply through where the template writes none after it
    (``hf_lora_ds.data.masking.template_probes``: the token it writes when a user turn or a tool result follows, or
    eos)."""
    closers = dataset.encoder.rules.traits.turn_closers
    return tuple(dict.fromkeys(closers.values())) if closers else None


def audit_by_source(dataset: ChatSFTDataset) -> dict[str, MaskAudit]:
    """One audit per source of a mixture that kept any sample (a mixture's sources can differ a lot in shape)."""
    kept = set(dataset.sources)
    return {name: audit_dataset(dataset, name) for name in dataset.source_counts if name in kept}


def _run_ends(labels: list[int]) -> list[int]:
    """Index of the last token of every contiguous supervised run."""
    return [
        i
        for i, label in enumerate(labels)
        if label != IGNORE_INDEX and (i + 1 == len(labels) or labels[i + 1] == IGNORE_INDEX)
    ]
