"""Token labels from the supervised character spans of ``hf_lora_ds.data.masking.template_rule``: exact, or an error.

``labels_from_spans`` is the rule, one text at a time: a token inside a span is trained, one outside is -100, one
that straddles a span boundary is an error (the tokenizer merged template and content, so no exact mask exists), and
each span's tokens must decode to the span's text. ``batch_labels`` gives the same labels and the same first error
for a batch, without a Python loop over every token of every span: where the offsets run in order (as a fast
tokenizer's do), each span's tokens are found by binary search, and all of the batch's decode checks are one call.
``tokenized_labels`` tokenizes a batch and labels it, placing each span's tokens from its edges alone where that is
proven (reading every token's offsets is a Python tuple per token; a byte-level BPE tokenizer need not track them at
all: ``hf_lora_ds.data.tokens.token_bytes``); a token merged across the start of a span (the end of a turn's inference
prompt and the start of its reply: ``<think>\n`` + ``\n</think>``) is no error there but resolved as inference sees
it: the prompt is tokenized on its own, as inference tokenizes it, and the reply after it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from hf_lora_ds.data.masking.template_rule import IGNORE_INDEX, TemplateError
from hf_lora_ds.data.masking.turn_flags import TextMask, mask_labels
from hf_lora_ds.data.tokens.token_bytes import TokenBytes

__all__ = ["FlatLabels", "labels_from_spans", "batch_labels", "tokenized_labels", "sample_tokens"]


def labels_from_spans(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    spans: Sequence[tuple[int, int]],
    offsets: Sequence[tuple[int, int]],
    input_ids: Sequence[int],
) -> list[int]:
    """Labels for one tokenized text: the token id inside a supervised span, -100 elsewhere.

    A token that straddles a span boundary means the tokenizer merged template text into the answer (or the
    answer into the template), so no exact mask exists for it: that is an error, not a guess.
    """
    labels = [IGNORE_INDEX] * len(input_ids)
    for start, end in spans:
        picked = []
        for j, (token_start, token_end) in enumerate(offsets):
            if token_end <= start or token_start >= end:
                continue
            if token_start < start or token_end > end:
                raise _crossing(tokenizer, input_ids[j], start, end)
            labels[j] = input_ids[j]
            picked.append(input_ids[j])
        decoded = tokenizer.decode(picked, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if decoded != text[start:end]:
            raise _undecodable(decoded, text[start:end])
    return labels


@dataclass(frozen=True)
class FlatLabels:
    """A batch's token ids and labels, its texts' end to end (int32), and each text's token count."""

    ids: np.ndarray
    labels: np.ndarray
    lengths: np.ndarray
    flag_counts: np.ndarray | None = None  # per text: tokens masked and tokens switched on by training flags

    def __post_init__(self) -> None:
        if self.flag_counts is None:
            object.__setattr__(self, "flag_counts", np.zeros((len(self.lengths), 2), dtype=np.int64))


def batch_labels(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    offsets: Sequence[Sequence[tuple[int, int]]],
    input_ids: Sequence[Sequence[int]],
) -> FlatLabels:
    """``labels_from_spans`` of each text of a batch; the first error is the one it would raise."""
    lengths = np.array([len(ids) for ids in input_ids], dtype=np.int64)
    total = int(lengths.sum())
    ids = np.fromiter(chain.from_iterable(input_ids), dtype=np.int32, count=total)
    bounds = np.fromiter(chain.from_iterable(chain.from_iterable(offsets)), dtype=np.int64, count=2 * total)
    # Text k's offsets moved by k * width, past every earlier text's: one sorted array serves the whole batch.
    width = max(map(len, texts), default=0) + 1
    shift = np.repeat(np.arange(len(texts), dtype=np.int64) * width, lengths)
    starts, ends = bounds[0::2] + shift, bounds[1::2] + shift
    if np.any(starts[1:] < starts[:-1]) or np.any(ends[1:] < ends[:-1]):  # out of order: a search would miss
        labels = [labels_from_spans(tokenizer, *text) for text in zip(texts, spans, offsets, input_ids)]
        return FlatLabels(ids, np.fromiter(chain.from_iterable(labels), dtype=np.int32, count=total), lengths)
    flat = [(k, start, end) for k, text_spans in enumerate(spans) for start, end in text_spans]
    table = np.array(flat, dtype=np.int64).reshape(-1, 3)
    low, high = table[:, 0] * width + table[:, 1], table[:, 0] * width + table[:, 2]
    # The tokens the rule visits for a span: those that end after it starts and start before it ends.
    first, stop = np.searchsorted(ends, low, side="right"), np.searchsorted(starts, high, side="left")
    _check(tokenizer, texts, flat, ids, (starts, ends), (low, high), (first, stop))
    return FlatLabels(ids, _trained(ids, first, stop), lengths)


def _trained(ids: np.ndarray, first: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """``ids`` with every token outside the ranges ``first[j]:stop[j]`` set to -100."""
    covered = np.zeros(len(ids) + 1, dtype=np.int64)
    np.add.at(covered, first, 1)
    np.add.at(covered, np.maximum(first, stop), -1)
    return np.where(np.cumsum(covered[:-1]) > 0, ids, np.int32(IGNORE_INDEX))


def _labels_at_span_edges(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    input_ids: Sequence[Sequence[int]],
    encodings: Sequence[Any],
) -> FlatLabels | None:
    """``batch_labels``' answer without every token's offsets: each span's tokens are those from the one holding its
    first character to the one holding its last (the tokenizers library's ``char_to_token``), proven by decoding to
    the span's text; None where that fails for any span of the batch (a token across an edge decodes to more, a
    character no token covers has none, an empty span has no last character): the offsets then decide, and name any
    error."""
    lengths = np.array([len(ids) for ids in input_ids], dtype=np.int64)
    offset = np.cumsum(lengths) - lengths
    first, stop = [], []
    for k, (encoding, text_spans) in enumerate(zip(encodings, spans)):
        for start, end in text_spans:
            a = encoding.char_to_token(start) if end > start else None
            z = encoding.char_to_token(end - 1) if a is not None else None
            if z is None:
                return None
            first.append(offset[k] + a)
            stop.append(offset[k] + z + 1)
    ids = np.fromiter(chain.from_iterable(input_ids), dtype=np.int32, count=int(lengths.sum()))
    return _proven(
        tokenizer, texts, spans, (ids, lengths, np.array(first, dtype=np.int64), np.array(stop, dtype=np.int64))
    )


def _proven(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    placed: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> FlatLabels | None:
    """The batch's labels from ``placed`` = (ids, lengths, first, stop): span j, in text then span order, trained on
    tokens ``first[j]:stop[j]``; None unless each span's tokens decode to its text."""
    ids, lengths, first, stop = placed
    expected = [text[start:end] for text, text_spans in zip(texts, spans) for start, end in text_spans]
    if _decode(tokenizer, [ids[a:b].tolist() for a, b in zip(first, stop)]) != expected:
        return None
    return FlatLabels(ids, _trained(ids, first, stop), lengths)


def _labels_by_bytes(
    texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], token_bytes: TokenBytes
) -> FlatLabels | None:
    """The batch labelled from its tokens' byte lengths (``hf_lora_ds.data.tokens.token_bytes``), each span's tokens
    proven by decoding to its text as ``_labels_at_span_edges`` proves them; None where that fails for any span."""
    if (input_ids := token_bytes.encode(texts)) is None:
        return None
    placed = token_bytes.token_ranges(texts, spans, input_ids)
    flat = _proven(token_bytes.tokenizer, texts, spans, placed) if placed is not None else None
    token_bytes.tally(placed=flat is not None)
    return flat


def tokenized_labels(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    spans: Sequence[Sequence[tuple[int, int]]],
    masks: Sequence[TextMask | None] | None = None,
    token_bytes: TokenBytes | None = None,
) -> FlatLabels:
    """The texts tokenized and labelled (``batch_labels``); a text with a token across a span's start is tokenized
    in pieces cut at its spans' starts (``sample_tokens``), and only then can a crossing token be an error. Texts
    with a training-flag mask (``hf_lora_ds.data.masking.turn_flags``) then have its characters' tokens switched off.
    With the tokenizer's ``token_bytes`` the batch is first encoded without offsets and placed by its tokens' byte
    lengths (``_labels_by_bytes``); every token's offsets (millions of Python tuples) are read only where a span's
    edges cannot place its tokens (``_labels_at_span_edges``), or for a mask."""
    if masks is None and token_bytes is not None and (flat := _labels_by_bytes(texts, spans, token_bytes)):
        return flat
    encoded = tokenizer(list(texts), add_special_tokens=False, return_attention_mask=False)
    ids, encodings = encoded["input_ids"], encoded.encodings
    if masks is None and (flat := _labels_at_span_edges(tokenizer, texts, spans, ids, encodings)) is not None:
        return flat
    offsets = [encoding.offsets for encoding in encodings]
    try:
        flat = batch_labels(tokenizer, texts, spans, offsets, ids)
    except TemplateError:
        for k, (text, text_spans) in enumerate(zip(texts, spans)):
            if _crosses_a_start(offsets[k], text_spans):
                ids[k], offsets[k] = _pieces(tokenizer, text, text_spans)
        flat = batch_labels(tokenizer, texts, spans, offsets, ids)
    if masks is None:
        return flat
    labels, counts = mask_labels(flat.labels, flat.lengths, offsets, masks)
    return FlatLabels(flat.ids, labels, flat.lengths, counts)


def sample_tokens(tokenizer: PreTrainedTokenizerBase, text: str, spans: Sequence[tuple[int, int]]) -> list[int]:
    """One training text's token ids, as ``tokenized_labels`` gives them."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    if _crosses_a_start(encoded["offset_mapping"], spans):
        return _pieces(tokenizer, text, spans)[0]
    return encoded["input_ids"]


def _crosses_a_start(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> bool:
    starts = sorted({start for start, _ in spans})
    for token_start, token_end in offsets:
        k = bisect_right(starts, token_start)
        if k < len(starts) and starts[k] < token_end:
            return True
    return False


def _pieces(
    tokenizer: PreTrainedTokenizerBase, text: str, spans: Sequence[tuple[int, int]]
) -> tuple[list[int], list[tuple[int, int]]]:
    """``text`` tokenized in pieces cut at its spans' starts: ids and offsets into ``text``."""
    cuts = sorted({0, *(start for start, _ in spans), len(text)})
    pieces = [text[a:b] for a, b in zip(cuts, cuts[1:])]
    encoded = tokenizer(pieces, add_special_tokens=False, return_offsets_mapping=True, return_attention_mask=False)
    ids = [token for piece in encoded["input_ids"] for token in piece]
    offsets = [(a + at, b + at) for at, piece in zip(cuts, encoded["offset_mapping"]) for a, b in piece]
    return ids, offsets


def _check(
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    flat: list[tuple[int, int, int]],
    ids: np.ndarray,
    bounds: tuple[np.ndarray, np.ndarray],
    span_bounds: tuple[np.ndarray, np.ndarray],
    tokens: tuple[np.ndarray, np.ndarray],
) -> None:
    """Raise the rule's first error over the spans ``flat`` (text, start, end) in order: a token crossing a span's
    boundary, or a span whose tokens (``first:stop`` of ``ids``) do not decode to its text."""
    (starts, ends), (low, high), (first, stop) = bounds, span_bounds, tokens
    starts_before = crossing = np.zeros(len(flat), dtype=bool)
    if len(ids):  # offsets run in order: only a span's first token can start before it, only its last end after it
        starts_before = (stop > first) & (starts[np.minimum(first, len(ids) - 1)] < low)
        crossing = starts_before | ((stop > first) & (ends[np.maximum(stop - 1, 0)] > high))
    bad = int(np.argmax(crossing)) if crossing.any() else len(flat)
    decoded = _decode(tokenizer, [ids[a:b].tolist() for a, b in zip(first[:bad].tolist(), stop[:bad].tolist())])
    expected = [texts[k][start:end] for k, start, end in flat[:bad]]
    if decoded != expected:
        got, want = next((got, want) for got, want in zip(decoded, expected) if got != want)
        raise _undecodable(got, want)
    if bad < len(flat):
        token = first[bad] if starts_before[bad] else np.searchsorted(ends, high[bad], side="right")
        raise _crossing(tokenizer, int(ids[token]), *flat[bad][1:])


def _decode(tokenizer: PreTrainedTokenizerBase, sequences: list[list[int]]) -> list[str]:
    """What ``tokenizer.decode`` gives for each sequence: in one call of the tokenizers library where the
    tokenizer decodes as that library does, else by its own ``decode``, one at a time."""
    kind = type(tokenizer)
    if kind.decode is PreTrainedTokenizerBase.decode and kind._decode is PreTrainedTokenizerFast._decode:
        return tokenizer.backend_tokenizer.decode_batch(sequences, skip_special_tokens=False)
    return [tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) for ids in sequences]


def _crossing(tokenizer: PreTrainedTokenizerBase, token: int, start: int, end: int) -> TemplateError:
    return TemplateError(
        f"token {tokenizer.convert_ids_to_tokens(token)!r} crosses the boundary of an assistant turn "
        f"(chars {start}-{end}); the tokenizer merges template and content here"
    )


def _undecodable(decoded: str, expected: str) -> TemplateError:
    return TemplateError(f"supervised tokens decode to {decoded!r}, expected {expected!r}")
