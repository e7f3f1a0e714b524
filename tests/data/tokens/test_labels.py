"""``batch_labels`` (binary search, one batched decode) gives exactly what ``labels_from_spans`` gives text by text:
the same labels, or the same first error, on spans that fit the tokens, cut through one, decode to something else,
and on offsets out of order (where it falls back to the rule itself)."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest

from hf_lora_ds.data.dataset import TemplateError
from hf_lora_ds.data.tokens import labels
from hf_lora_ds.data.tokens.labels import FlatLabels, batch_labels, labels_from_spans

TEXTS = [
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nBonjour!<|im_end|>\n",
    "<|im_start|>user\n王大丫丫的回答是--->0123456789 + =<|im_end|>\n<|im_start|>assistant\nParis is.<|im_end|>\n",
    "The quick brown fox jumps over the lazy dog.",
]


def outcome_one_by_one(tokenizer, texts, spans, offsets, ids) -> list[list[int]] | str:
    try:
        return [labels_from_spans(tokenizer, *text) for text in zip(texts, spans, offsets, ids)]
    except TemplateError as err:
        return str(err)


def outcome_batched(tokenizer, texts, spans, offsets, ids) -> list[list[int]] | str:
    try:
        flat = batch_labels(tokenizer, texts, spans, offsets, ids)
    except TemplateError as err:
        return str(err)
    assert flat.ids.tolist() == [token for text_ids in ids for token in text_ids]
    ends = flat.lengths.cumsum()
    return [flat.labels[end - length : end].tolist() for end, length in zip(ends, flat.lengths)]


def tokenized(tokenizer, texts):
    encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return encoded["offset_mapping"], encoded["input_ids"]


def test_answer_spans_and_the_errors_of_the_rule(chatml_tokenizer):
    offsets, ids = tokenized(chatml_tokenizer, TEXTS)
    answer = TEXTS[0].index("Bonjour")
    fits = [[(answer, answer + len("Bonjour!<|im_end|>"))], [], [(0, 3)]]
    got = outcome_batched(chatml_tokenizer, TEXTS, fits, offsets, ids)
    assert got == outcome_one_by_one(chatml_tokenizer, TEXTS, fits, offsets, ids)
    assert isinstance(got, list) and sum(label != -100 for label in got[0]) > 1
    cut = [[(answer + 1, answer + 4)], [], []]  # through a token
    assert outcome_batched(chatml_tokenizer, TEXTS, cut, offsets, ids).startswith("token ")
    # The first text's span does not decode to its text (offsets moved): that error comes before the cut in text 2.
    moved = [[(start + 1, end + 1) for start, end in offsets[0]], *offsets[1:]]
    both = [[(answer + 1, answer + 1 + len("Bonjour!"))], [(20, 23)], []]
    got = outcome_batched(chatml_tokenizer, TEXTS, both, moved, ids)
    assert got == outcome_one_by_one(chatml_tokenizer, TEXTS, both, moved, ids)
    assert got.startswith("supervised tokens decode to")


@pytest.mark.parametrize("seed", range(200))
def test_random_spans_and_offsets_give_what_the_rule_gives(chatml_tokenizer, seed):
    rng = random.Random(seed)
    offsets, ids = tokenized(chatml_tokenizer, TEXTS)
    offsets = [list(text_offsets) for text_offsets in offsets]
    if rng.random() < 0.3:  # out of order, or a token of zero width
        k = rng.randrange(len(TEXTS))
        j = rng.randrange(len(offsets[k]) - 1)
        if rng.random() < 0.5:
            offsets[k][j], offsets[k][j + 1] = offsets[k][j + 1], offsets[k][j]
        else:
            offsets[k][j] = (offsets[k][j][0], offsets[k][j][0])
    spans = []
    for k, text in enumerate(TEXTS):
        bounds = sorted({0, len(text)} | {end for _, end in offsets[k]} | {rng.randrange(len(text)) for _ in range(2)})
        picked = sorted(rng.sample(bounds, min(len(bounds), 2 * rng.randint(0, 2))))
        spans.append(list(zip(picked[0::2], picked[1::2])))
    assert outcome_batched(chatml_tokenizer, TEXTS, spans, offsets, ids) == outcome_one_by_one(
        chatml_tokenizer, TEXTS, spans, offsets, ids
    )


def test_a_token_merged_across_a_replys_start_is_resolved_as_inference_tokenizes_the_prompt():
    # Qwen3.5's thinking prompt ends "<think>\n" and an empty reasoning's reply starts "\n</think>": whole, the text
    # tokenizes "\n\n" as one token across the boundary; inference tokenizes the prompt alone, then the reply.
    from hf_lora_ds._testing.tiny_models import train_chat_tokenizer
    from hf_lora_ds.data.tokens.labels import sample_tokens, tokenized_labels

    tokenizer = train_chat_tokenizer(["a\n\nb\n\nc\n\n"] * 20 + ["think"] * 5, vocab_size=300)
    prompt, reply = "<|im_start|>assistant\nthink\n", "\nb<|im_end|>"
    text, spans = prompt + reply, [(len(prompt), len(prompt + reply))]
    whole = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    with pytest.raises(TemplateError, match="crosses the boundary"):  # the merge the labels cannot cut
        labels_from_spans(tokenizer, text, spans, whole["offset_mapping"], whole["input_ids"])
    ids = lambda part: tokenizer(part, add_special_tokens=False)["input_ids"]  # noqa: E731
    expected = ids(prompt) + ids(reply)
    flat = tokenized_labels(tokenizer, [text, TEXTS[2]], [spans, [(4, 9)]])
    assert flat.ids[: flat.lengths[0]].tolist() == expected == sample_tokens(tokenizer, text, spans)
    assert flat.labels[: flat.lengths[0]].tolist() == [-100] * len(ids(prompt)) + ids(reply)
    assert flat.ids[flat.lengths[0] :].tolist() == ids(TEXTS[2])  # the other text keeps its whole tokenization


def _labelled(tokenizer, texts, spans, masks=None) -> tuple[list, list] | str:
    from hf_lora_ds.data.tokens.labels import tokenized_labels

    try:
        flat = tokenized_labels(tokenizer, texts, spans, masks)
    except TemplateError as err:
        return str(err)
    return flat.ids.tolist(), flat.labels.tolist()


def _spaces_uncovered_tokenizer():
    """Words split on whitespace: no token covers a space (as in tokenizers that drop what they split on)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({word for text in TEXTS for word in text.split()})
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.mark.parametrize("seed", range(100))
def test_labels_placed_at_span_edges_are_those_every_tokens_offsets_give(chatml_tokenizer, seed, monkeypatch):
    """tokenized_labels without masks places each span's tokens from its edges alone; with masks (here none that
    switch anything) it reads every token's offsets. Same ids and labels, or the same error, on spans that fit the
    tokens, cut through one, start at a character no token covers, hold nothing; and spans that fit the tokens are
    placed from their edges."""
    rng = random.Random(seed)
    tokenizer = chatml_tokenizer if seed % 2 else _spaces_uncovered_tokenizer()
    spans, token_edges = [], []
    for text in TEXTS:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        bounds = {0, len(text)} | {end for _, end in offsets} | {start for start, _ in offsets}
        token_edges.append(set(bounds))
        bounds |= {rng.randrange(len(text)) for _ in range(rng.randint(0, 1))}
        picked = sorted(rng.sample(sorted(bounds), min(len(bounds), 2 * rng.randint(0, 2))))
        spans.append(list(zip(picked[0::2], picked[1::2])))
    if seed % 10 == 0:  # an empty span, at the start (no character before it)
        spans[0] = [(0, 0), *spans[0]]
    placed: list[bool] = []
    at_span_edges = labels._labels_at_span_edges

    def watched(*args: Any) -> FlatLabels | None:
        flat = at_span_edges(*args)
        placed.append(flat is not None)
        return flat

    monkeypatch.setattr(labels, "_labels_at_span_edges", watched)
    at_edges = _labelled(tokenizer, TEXTS, spans)
    assert at_edges == _labelled(tokenizer, TEXTS, spans, [None] * len(TEXTS))
    # Placed at least where each span is non-empty, on token edges, ends in a character of one token (ASCII here: a
    # CJK character is several byte tokens, and the edge finds only its first) and decodes to its text (words of the
    # whitespace-split tokenizer decode joined by one space): else both answers would be the offsets' alone.
    at_token_edges = all(
        start < end
        and {start, end} <= edges
        and text[end - 1].isascii()
        and (tokenizer is chatml_tokenizer or text[start:end] == " ".join(text[start:end].split()))
        for text, text_spans, edges in zip(TEXTS, spans, token_edges)
        for start, end in text_spans
    )
    assert len(placed) == 1 and (placed[0] or not at_token_edges)


@pytest.mark.parametrize("method", ["decode", "_decode"])
def test_a_class_with_its_own_decode_is_proven_by_it(chatml_tokenizer, method: str):
    """A tokenizer class whose own ``decode`` (or ``_decode``) writes otherwise than its backend: a span's tokens are
    proven by that decode, as the rule proves them, so a span it does not give back is the rule's error, not trained
    tokens."""
    from transformers import PreTrainedTokenizerFast

    def question_marks(self: PreTrainedTokenizerFast, *args: Any, **kwargs: Any) -> str:
        return getattr(super(kind, self), method)(*args, **kwargs).replace("!", "?")

    kind = type("QuestionMarks", (PreTrainedTokenizerFast,), {method: question_marks})
    tokenizer = kind(tokenizer_object=copy.deepcopy(chatml_tokenizer.backend_tokenizer))
    answer = TEXTS[0].index("Bonjour")
    spans = [[(answer, answer + len("Bonjour!<|im_end|>"))], [], [(0, 3)]]
    offsets, ids = tokenized(tokenizer, TEXTS)
    rule = outcome_one_by_one(tokenizer, TEXTS, spans, offsets, ids)
    assert rule == "supervised tokens decode to 'Bonjour?<|im_end|>', expected 'Bonjour!<|im_end|>'"
    assert outcome_batched(tokenizer, TEXTS, spans, offsets, ids) == rule
    assert _labelled(tokenizer, TEXTS, spans) == rule  # placed at the spans' edges
