"""Spans placed from the tokens' byte lengths: the labels every token's offsets give, or no answer (never another)."""

from __future__ import annotations

import copy
import random

import pytest
from tokenizers import normalizers
from transformers import PreTrainedTokenizerFast

from hf_lora_ds.data.masking.template_rule import TemplateError
from hf_lora_ds.data.tokens.labels import tokenized_labels
from hf_lora_ds.data.tokens.token_bytes import TokenBytes

TEXTS = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nBonjour!<|im_end|>\n",
    "<|im_start|>user\n王大丫丫的回答是--->0123456789 + =<|im_end|>\n<|im_start|>assistant\nParis, é 🙂.<|im_end|>\n",
    "The quick brown fox jumps over the lazy dog.",
]


@pytest.fixture(scope="module")
def unnormalized(chatml_tokenizer):
    """The ChatML test tokenizer without its NFC normalizer: non-ASCII text is placed by bytes too."""
    tokenizer = copy.deepcopy(chatml_tokenizer)
    tokenizer.backend_tokenizer.normalizer = None
    return tokenizer


def _labelled(tokenizer, spans, token_bytes=None, masks=None):
    try:
        flat = tokenized_labels(tokenizer, TEXTS, spans, masks, token_bytes)
    except TemplateError as err:
        return str(err)
    return flat.ids.tolist(), flat.labels.tolist(), flat.lengths.tolist()


def _token_edges(tokenizer, text: str) -> list[int]:
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return sorted({0, len(text)} | {end for _, end in offsets} | {start for start, _ in offsets})


@pytest.mark.parametrize("seed", range(60))
def test_labels_placed_by_bytes_are_those_every_tokens_offsets_give(unnormalized, seed):
    """Spans on token edges, cut through a token (a multi-byte character's too) or empty: the same ids, labels and
    lengths, or the same error, as reading every token's offsets; and the batch is placed by bytes exactly when its
    every span is non-empty with both edges on token edges (else both answers would be the offsets' alone)."""
    rng = random.Random(seed)
    spans, token_edges = [], [set(_token_edges(unnormalized, text)) for text in TEXTS]
    for text, edges in zip(TEXTS, token_edges):
        edges = edges | {rng.randrange(len(text)) for _ in range(rng.randint(0, 1))}  # maybe inside a token
        picked = sorted(rng.sample(sorted(edges), min(len(edges), 2 * rng.randint(0, 2))))
        spans.append(list(zip(picked[0::2], picked[1::2])))
    if seed % 10 == 0:
        spans[0] = [(0, 0), *spans[0]]
    token_bytes = TokenBytes.of(unnormalized)
    assert _labelled(unnormalized, spans, token_bytes) == _labelled(unnormalized, spans, masks=[None] * len(TEXTS))
    on_edges = all(
        start < end and {start, end} <= edges
        for text_spans, edges in zip(spans, token_edges)
        for start, end in text_spans
    )
    assert (token_bytes.placed, token_bytes.missed) == ((1, 0) if on_edges else (0, 1))


def test_a_batch_on_token_edges_is_placed_without_offsets(unnormalized, monkeypatch):
    """The byte lengths place every span of a chat batch (non-ASCII included): the tokenizer is never called with
    offsets, and the labels are the offsets' ones."""
    spans = [[(len(text) - 20, len(text) - 1)] for text in TEXTS[:2]] + [[(4, 9)]]
    expected = _labelled(unnormalized, spans, masks=[None] * len(TEXTS))
    token_bytes = TokenBytes.of(unnormalized)
    monkeypatch.setattr(type(unnormalized), "_encode_plus", lambda *a, **k: pytest.fail("encoded with offsets"))
    assert _labelled(unnormalized, spans, token_bytes) == expected
    assert (token_bytes.placed, token_bytes.missed) == (1, 0)


def test_a_normalizer_keeps_non_ascii_batches_on_offsets(chatml_tokenizer):
    """NFC may change non-ASCII text (and its length), so such a batch is not placed by bytes; an ASCII one is."""
    token_bytes = TokenBytes.of(chatml_tokenizer)
    assert token_bytes.encode(TEXTS) is None
    assert (
        token_bytes.encode([TEXTS[0], TEXTS[2]])
        == chatml_tokenizer([TEXTS[0], TEXTS[2]], add_special_tokens=False)["input_ids"]
    )


def test_tokenizers_not_spelt_in_bytes_get_no_table(chatml_tokenizer):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    assert TokenBytes.of(PreTrainedTokenizerFast(tokenizer_object=words)) is None
    lowercased = copy.deepcopy(chatml_tokenizer)
    lowercased.backend_tokenizer.normalizer = normalizers.Lowercase()  # changes ASCII: bytes no longer match
    assert TokenBytes.of(lowercased) is None


@pytest.mark.parametrize("setting", ["truncation", "padding"])
def test_a_truncating_or_padding_backend_is_encoded_as_a_call_would(unnormalized, setting: str):
    """A tokenizer.json saved with truncation or padding on: a call of the tokenizer turns it off first; the bytes do
    not try (the backend's own encoding would cut or pad the ids)."""
    tokenizer = copy.deepcopy(unnormalized)
    if setting == "truncation":
        tokenizer.backend_tokenizer.enable_truncation(4)
    else:
        tokenizer.backend_tokenizer.enable_padding(pad_id=0, pad_token="<|endoftext|>")
    assert TokenBytes.of(tokenizer).encode(TEXTS) is None
    spans = [[(0, 5)]] * len(TEXTS)
    assert _labelled(tokenizer, spans, TokenBytes.of(tokenizer)) == _labelled(tokenizer, spans, masks=[None] * 3)


@pytest.mark.parametrize("split", [True, False])
def test_a_tokenizer_splitting_special_tokens_unlike_its_backend_gets_a_calls_ids(unnormalized, split: bool):
    """``split_special_tokens`` set on the tokenizer after loading (True), or left on the backend by a call that
    asked for it (False): a call of the tokenizer first sets its backend to the tokenizer's setting, so the package's
    ids are what such a call gives (``<|im_start|>`` spelt in bytes or one token), never the backend's stale ones."""
    tokenizer = copy.deepcopy(unnormalized)
    tokenizer.split_special_tokens = split
    tokenizer.backend_tokenizer.encode_special_tokens = not split
    spans = [[(0, len(text))] for text in TEXTS]  # every text whole: on token edges however it is split
    flat = tokenized_labels(tokenizer, TEXTS, spans, token_bytes=TokenBytes.of(tokenizer))
    expected = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    assert (len(expected[0]) > len(unnormalized(TEXTS[0], add_special_tokens=False)["input_ids"])) is split
    assert flat.ids.tolist() == flat.labels.tolist() == [token for ids in expected for token in ids]
    assert flat.lengths.tolist() == [len(ids) for ids in expected]


class _SplittingCall(PreTrainedTokenizerFast):
    """A tokenizer class whose own ``__call__`` encodes otherwise than its backend: special tokens spelt out."""

    def __call__(self, *args, **kwargs):
        return super().__call__(*args, **{**kwargs, "split_special_tokens": True})


class _SplittingEncodePlus(PreTrainedTokenizerFast):
    """The same through its own ``_encode_plus``, which every call of the tokenizer goes through."""

    def _encode_plus(self, *args, **kwargs):
        return super()._encode_plus(*args, **{**kwargs, "split_special_tokens": True})


@pytest.mark.parametrize("kind", [_SplittingCall, _SplittingEncodePlus])
def test_a_class_with_its_own_encoding_is_not_placed_by_bytes(unnormalized, kind: type):
    """A class that overrides ``__call__`` or ``_encode_plus`` gets no byte table, and the package's ids follow its
    encoding: byte placement would bypass it and train on the backend's ids (``<|im_start|>`` as one token)."""
    tokenizer = kind(tokenizer_object=copy.deepcopy(unnormalized.backend_tokenizer))
    assert not tokenizer.split_special_tokens and not tokenizer.backend_tokenizer.encode_special_tokens
    spans = [[(0, len(text))] for text in TEXTS]
    flat = tokenized_labels(tokenizer, TEXTS, spans, token_bytes=TokenBytes.of(tokenizer))
    expected = tokenizer(TEXTS, add_special_tokens=False)["input_ids"]
    assert expected != unnormalized(TEXTS, add_special_tokens=False)["input_ids"]  # the class's own encoding
    assert flat.ids.tolist() == [token for ids in expected for token in ids]
    assert flat.lengths.tolist() == [len(ids) for ids in expected]


def test_an_added_token_spelt_beyond_ascii_is_placed_by_bytes(unnormalized):
    """An added token is matched in the text as written, so its length is its content's UTF-8 bytes, not its
    spelling's characters (DeepSeek's ``<｜end▁of▁sentence｜>``: 19 characters, 27 bytes): its batches are placed."""
    tokenizer = copy.deepcopy(unnormalized)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<｜end▁of▁sentence｜>"]})
    texts = [TEXTS[0].replace("<|im_end|>", "<｜end▁of▁sentence｜>"), TEXTS[2]]
    spans = [[(len(texts[0]) - 28, len(texts[0]) - 1)], [(4, 9)]]  # "!<｜end▁of▁sentence｜>", "quick"
    expected = tokenized_labels(tokenizer, texts, spans, [None] * len(texts))
    token_bytes = TokenBytes.of(tokenizer)
    flat = tokenized_labels(tokenizer, texts, spans, token_bytes=token_bytes)
    assert (token_bytes.placed, token_bytes.missed) == (1, 0)
    assert (flat.ids.tolist(), flat.labels.tolist()) == (expected.ids.tolist(), expected.labels.tolist())


def test_a_template_whose_batches_miss_stops_being_tried(unnormalized):
    """Spans that cut through tokens miss every batch: after two misses more than placements, no second encoding."""
    token_bytes = TokenBytes.of(unnormalized)
    inside = [[(1, 3)]] * len(TEXTS)  # "<|" is no token edge: "<|im_start|>" is one token
    for _ in range(2):
        assert token_bytes.encode(TEXTS) is not None
        _labelled(unnormalized, inside, token_bytes)
    assert (token_bytes.placed, token_bytes.missed) == (0, 2)
    assert token_bytes.encode(TEXTS) is None
