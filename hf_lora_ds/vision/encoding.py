"""Image records tokenized as the model sees them, with the text rule's exact labels carried over.

The text pipeline (hf_lora_ds.data.masking, hf_lora_ds.data.tokens) renders a conversation whose images stand as
the text its chat template writes for an image part (``template_image_text``) and labels it exactly. The processor
then expands each image's placeholder into the image's tokens, a number that depends on the image's size, and
tokenizes the expanded text; rather than re-deriving each family's expansion, the processor's own output is taken
and the text labels are carried onto it token by token (``expanded_labels``): the text between images tokenizes
alike in both, so only the image blocks (and a newline a family writes around them) differ. Every token of an image
is -100, and an image inside a trained answer is an error, never a guess.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

import numpy as np
from PIL import Image
from transformers import PreTrainedTokenizerBase, ProcessorMixin

from hf_lora_ds.data.masking.template_rule import IGNORE_INDEX, TemplateError
from hf_lora_ds.data.records.content_parts import IMAGE_MARK
from hf_lora_ds.data.tokens import FlatLabels
from hf_lora_ds.vision.images import load_image
from hf_lora_ds.vision.resolution import PixelBounds

__all__ = [
    "ImageEncoding",
    "expanded_labels",
    "image_reference",
    "template_image_text",
    "with_image_text",
]

_PROBE = "\x1f"  # a character no template writes, standing for the text beside the image


def template_image_text(tokenizer: PreTrainedTokenizerBase) -> str:
    """What the chat template writes for one ``{"type": "image"}`` part of a user turn: the difference between a
    turn of an image and a text and a turn of the text alone. A template that writes nothing for it is refused."""
    with_image = _render(tokenizer, [{"type": "image"}, {"type": "text", "text": _PROBE}])
    text_only = _render(tokenizer, [{"type": "text", "text": _PROBE}])
    head = len(os.path.commonprefix([with_image, text_only]))
    tail = len(os.path.commonprefix([with_image[head:][::-1], text_only[head:][::-1]]))
    written = with_image[head : len(with_image) - tail]
    if not written or _PROBE in written:
        raise TemplateError(
            "the chat template writes nothing for an image part ({'type': 'image'}) of a user turn, so the images "
            "of a record cannot be placed; use the model's own multimodal chat template"
        )
    return written


def _render(tokenizer: PreTrainedTokenizerBase, parts: list[dict]) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False)


def with_image_text(messages: list[dict], image_text: str) -> list[dict]:
    """``messages`` with each ``IMAGE_MARK`` of a content written as the template writes an image."""
    return [
        {**message, "content": message["content"].replace(IMAGE_MARK, image_text)}
        if isinstance(message.get("content"), str) and IMAGE_MARK in message["content"]
        else message
        for message in messages
    ]


def expanded_labels(
    text_ids: Sequence[int], text_labels: Sequence[int], expanded_ids: Sequence[int], image_ids: np.ndarray
) -> np.ndarray:
    """The labels of ``expanded_ids`` (the processor's tokens, images expanded) carried from the text's.

    Both sides are aligned with each run of image tokens standing as one token: equal tokens keep their label,
    tokens the expansion changed or added (a newline a family writes around an image, merged with the text's, or
    between two images) must be -100 in the text, else the image sits inside a trained answer: an error. Every image
    token is -100."""
    text_ids, expanded_ids = np.asarray(text_ids), np.asarray(expanded_ids)
    text_labels = np.asarray(text_labels)
    if (text_labels[np.isin(text_ids, image_ids)] != IGNORE_INDEX).any():
        raise TemplateError("an image inside a trained answer: images go in user turns")
    (text_seq, text_at), (expanded_seq, expanded_at) = (
        _collapsed(text_ids, image_ids),
        _collapsed(expanded_ids, image_ids),
    )
    labels = np.full(len(expanded_ids), IGNORE_INDEX, dtype=np.int64)
    matcher = SequenceMatcher(None, text_seq.tolist(), expanded_seq.tolist(), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            labels[expanded_at[j1:j2]] = text_labels[text_at[i1:i2]]
        elif (text_labels[text_at[i1:i2]] != IGNORE_INDEX).any():
            raise TemplateError("the text beside an image tokenizes into a trained answer's tokens")
    labels[np.isin(expanded_ids, image_ids)] = IGNORE_INDEX
    return labels


def _collapsed(ids: np.ndarray, image_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` with each run of image tokens as one -1, and the position in ``ids`` of each kept token."""
    is_image = np.isin(ids, image_ids)
    run_start = is_image & ~np.concatenate([[False], is_image[:-1]])
    kept = np.flatnonzero(~is_image | run_start)
    return np.where(is_image[kept], -1, ids[kept]), kept


@dataclass
class ImageEncoding:
    """What the dataset needs of a processor to tokenize image records: the processor, the text its template writes
    for an image, and the ids of every token that belongs to an image (never a label)."""

    processor: ProcessorMixin
    image_text: str
    image_ids: np.ndarray
    bounds: PixelBounds = field(default_factory=PixelBounds)

    @classmethod
    def of(cls, processor: ProcessorMixin, bounds: PixelBounds | None = None) -> ImageEncoding:
        """Read from the processor: the ids are the added tokens its output holds for one tiny image's text (its
        placeholders, start/end, row/column and soft tokens), the tokenizer's own bos/eos/pad left out."""
        tokenizer = processor.tokenizer
        image_text = template_image_text(tokenizer)
        probe = processor(text=[image_text], images=[Image.new("RGB", (32, 32))])["input_ids"][0]
        added = set(tokenizer.added_tokens_decoder) - {tokenizer.bos_token_id, tokenizer.eos_token_id}
        added.discard(tokenizer.pad_token_id)
        ids = np.array(sorted(added.intersection(probe)), dtype=np.int64)
        return cls(processor, image_text, ids, bounds or PixelBounds())

    def settings(self) -> list[Any]:
        """What decides the expanded tokens besides the records, for the dataset's cache key: the processor's own
        settings too (SmolVLM's ``image_seq_len``, InternVL's ``image_seq_length``: tokens per image), not only its
        image processor's."""
        return [self.image_text, self.image_ids.tolist(), self.processor.to_json_string(), self.bounds]

    def load(self, image: Any, where: str) -> Image.Image:
        """The image's pixels within the run's bounds (hf_lora_ds.vision.resolution)."""
        return self.bounds.apply(load_image(image, where))

    def count(self, text: str) -> int:
        """How many images a rendered text holds."""
        return text.count(self.image_text)

    def expand_batch(self, flat: FlatLabels, texts: list[str], images: list[list], wheres: list[str]) -> FlatLabels:
        """A batch's tokenized samples (``hf_lora_ds.data.tokens``) with their images expanded (``expand``)."""
        bounds = np.cumsum(flat.lengths)[:-1]
        ids, labels = np.split(flat.ids, bounds), np.split(flat.labels, bounds)
        for k, (text, shown, where) in enumerate(zip(texts, images, wheres)):
            if shown:
                ids[k], labels[k] = self.expand(text, ids[k], labels[k], shown, where)
        lengths = np.array([len(sample) for sample in ids], dtype=flat.lengths.dtype)
        return FlatLabels(
            np.concatenate(ids), np.concatenate(labels).astype(flat.labels.dtype), lengths, flat.flag_counts
        )

    def cut(self, cut_ids: np.ndarray, cut_samples: np.ndarray, count: int) -> np.ndarray:
        """Per sample of ``count``, whether the tokens truncation cut off (``cut_ids``, of ``cut_samples``) hold an
        image's: its pixels would then not match its tokens."""
        return np.bincount(cut_samples[np.isin(cut_ids, self.image_ids)], minlength=count) > 0

    def expand(
        self, text: str, ids: Sequence[int], labels: Sequence[int], images: list, where: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """The processor's ids for ``text`` with ``images`` and their labels (``expanded_labels``); an error names
        the record."""
        pictures = [self.load(image, where) for image in images]
        expanded = self.processor(text=[text], images=[pictures])["input_ids"][0]
        try:
            return np.asarray(expanded, dtype=np.int32), expanded_labels(ids, labels, expanded, self.image_ids)
        except TemplateError as err:
            raise TemplateError(f"{where}: {err}") from None


def image_reference(image: Any) -> dict[str, Any]:
    """An image as the dataset keeps it: ``{"path": ..., "bytes": None}`` for a file, its PNG bytes for an image
    given in code (a PIL image), a ``{"bytes", "path"}`` dict (``datasets.Image``'s) as it is."""
    if isinstance(image, str):
        return {"bytes": None, "path": image}
    if isinstance(image, dict):
        return {"bytes": image.get("bytes"), "path": image.get("path")}
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}
