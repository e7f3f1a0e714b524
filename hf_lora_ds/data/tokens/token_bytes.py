"""Where a batch's spans fall in its tokens, from each token's length in bytes, for byte-level BPE tokenizers.

A byte-level BPE vocabulary (GPT-2's, Qwen's, Llama 3's, SmolLM's) spells every token in one character per byte, so
a token's UTF-8 length is its spelling's length, and a text's tokens end where the running sum of those lengths
says. The tokenizers library can then encode without tracking offsets (``encode_batch_fast``), which is most of
what tokenizing with offsets costs beyond the plain chat template's own tokenizing. Each span is placed only where
token boundaries fall on both its edges and its tokens decode to its text; otherwise the caller reads offsets.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np
from tokenizers import decoders, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = ["TokenBytes"]

# Unicode normal forms leave ASCII as it is: with one of them, only all-ASCII batches are placed by bytes.
_ASCII_PRESERVING = (normalizers.NFC, normalizers.NFD, normalizers.NFKC, normalizers.NFKD)


class TokenBytes:
    """The byte length of every token of one byte-level BPE tokenizer (-1: unknown), and a per-process tally of the
    batches placed this way: a template whose spans rarely are (a token merged across a reply's start) stops being
    tried once it has missed two batches more than it placed, so it does not tokenize twice."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, lengths: np.ndarray):
        self.tokenizer = tokenizer
        self.lengths = lengths
        self.placed = self.missed = 0

    def tally(self, placed: bool) -> None:
        if placed:
            self.placed += 1
        else:
            self.missed += 1

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> TokenBytes | None:
        """The table for ``tokenizer``, or None where its tokens are not spelt one character per byte, or where its
        class encodes otherwise than the tokenizers library does (an overridden ``__call__`` or ``_encode_plus``)."""
        kind, backend = type(tokenizer), getattr(tokenizer, "backend_tokenizer", None)
        if (
            backend is None
            or kind.__call__ is not PreTrainedTokenizerBase.__call__
            or kind._encode_plus is not PreTrainedTokenizerFast._encode_plus
            or not isinstance(backend.decoder, decoders.ByteLevel)
            or not (backend.normalizer is None or isinstance(backend.normalizer, _ASCII_PRESERVING))
        ):
            return None
        alphabet = set(pre_tokenizers.ByteLevel.alphabet())
        added = {index: token.content for index, token in tokenizer.added_tokens_decoder.items()}
        lengths = np.full(backend.get_vocab_size(with_added_tokens=True), -1, dtype=np.int64)
        for token, index in backend.get_vocab(with_added_tokens=True).items():
            if index in added:  # matched in the text as written, not byte-encoded
                lengths[index] = len(added[index].encode("utf-8"))
            elif alphabet.issuperset(token):
                lengths[index] = len(token)
        return cls(tokenizer, lengths)

    def encode(self, texts: Sequence[str]) -> list[list[int]] | None:
        """The texts' ids as ``tokenizer(texts, add_special_tokens=False)`` gives them, without offsets; None where
        this batch cannot be placed by bytes (so the caller encodes with offsets) or the tally says not to try."""
        backend = self.tokenizer.backend_tokenizer
        if (
            self.missed >= self.placed + 2
            or backend.truncation is not None  # settings a call of the tokenizer would reset first
            or backend.padding is not None
            or backend.encode_special_tokens != self.tokenizer.split_special_tokens
            or (backend.normalizer is not None and not all(text.isascii() for text in texts))
        ):
            return None
        return [encoding.ids for encoding in backend.encode_batch_fast(list(texts), add_special_tokens=False)]

    def token_ranges(
        self, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]], input_ids: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """``(ids, lengths, first, stop)``: the batch's ids end to end, each text's token count, and for each span in
        order the tokens ``first:stop`` whose bytes are exactly its own; None where any span's edge falls inside a
        token, a span is empty, or a text's tokens do not add up to its bytes (a normalizer changed it)."""
        lengths = np.array([len(ids) for ids in input_ids], dtype=np.int64)
        ids = np.fromiter(chain.from_iterable(input_ids), dtype=np.int32, count=int(lengths.sum()))
        sizes = self.lengths[ids]
        text_bytes = np.array([len(text) if text.isascii() else len(text.encode("utf-8")) for text in texts])
        bounds = np.concatenate([[0], np.cumsum(sizes)])  # the byte each token starts at, batch-wide, and the end
        text_starts = np.cumsum(text_bytes) - text_bytes
        if (sizes < 0).any() or not np.array_equal(bounds[np.cumsum(lengths)], text_starts + text_bytes):
            return None
        edges = [
            (text_starts[k] + _byte_at(texts[k], start), text_starts[k] + _byte_at(texts[k], end))
            for k, text_spans in enumerate(spans)
            for start, end in text_spans
        ]
        low, high = np.array(edges, dtype=np.int64).reshape(-1, 2).T
        first, stop = np.searchsorted(bounds, low), np.searchsorted(bounds, high)
        on_bounds = np.array_equal(bounds[np.minimum(first, len(ids))], low) and np.array_equal(
            bounds[np.minimum(stop, len(ids))], high
        )
        return (ids, lengths, first, stop) if on_bounds and (stop > first).all() else None


def _byte_at(text: str, char: int) -> int:
    return char if text.isascii() else len(text[:char].encode("utf-8"))
