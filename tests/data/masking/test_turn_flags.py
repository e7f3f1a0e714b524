"""Per-turn and per-span training flags in each peer's spelling: labels compared with characters marked by hand."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import (
    END,
    JOKE,
    axolotl_documented_example,
    axolotl_text,
    build,
    chatml,
    expect,
    labels_of,
    sample,
    trained_chars,
)

TEXT = axolotl_text("Tell me a joke")


def axolotl_record(**last_turn) -> dict:
    """axolotl's documented example with its human turns unflagged (their training:
    tests/data/masking/test_user_turns.py) and its last question other than the answer before it."""
    record = axolotl_documented_example()
    turns = record["conversations"]
    del turns[3]["train"]
    turns[5] = {"from": "human", "value": "Tell me a joke"}
    turns[6] = {"from": "assistant", "value": "Hi there!", **last_turn}
    return record


def trained_tokens(tokenizer, trained: list[bool]) -> int:
    return sum(label != -100 for label in labels_of(tokenizer, TEXT, trained)[1])


def marked(spans: list[tuple[str, str]]) -> list[bool]:
    """Characters of TEXT trained: each (turn text located after the assistant header, trained substring)."""
    trained, at = [False] * len(TEXT), 0
    for whole, part in spans:
        at = TEXT.index("<|im_start|>assistant\n" + whole, at)
        offset = at + len("<|im_start|>assistant\n") + whole.index(part)
        for i in range(offset, offset + len(part)):
            trained[i] = True
    return trained


def test_axolotl_train_and_train_detail_are_honoured(chatml_tokenizer, tmp_path):
    """train_detail ends are inclusive: the docs' three spans tile the 31 characters. The detailed turn's end of
    turn follows the turn (trained: it has no train flag and every assistant turn is trained by default)."""
    dataset = build([axolotl_record(train=False)], chatml_tokenizer, tmp_path)
    trained = marked([("Hello" + END, "Hello" + END), (JOKE + END, " very well"), (JOKE + END, END)])
    assert sample(dataset) == labels_of(chatml_tokenizer, TEXT, trained)
    masked = trained_tokens(chatml_tokenizer, marked([(JOKE + END, JOKE)])) - trained_tokens(
        chatml_tokenizer, marked([(JOKE + END, " very well")])
    )  # the content's tokens its spans switched off
    assert dataset.flag_counts == {"turns_off": 1, "turns_on": 0, "tokens_masked": masked, "tokens_on": 0}


def test_a_token_straddling_a_span_edge_follows_its_first_character(chatml_tokenizer, tmp_path):
    content = "The quick brown fox jumps."
    encoded = chatml_tokenizer(content, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    start, end = next((a, b) for a, b in encoded if b - a > 2)  # a token of several characters
    cut = start + 1  # inside it
    record = {
        "messages": [
            {"role": "user", "content": "Hello"},
            {
                "role": "assistant",
                "content": content,
                "train_detail": [{"begin_offset": cut, "end_offset": len(content) - 1, "train": False}],
            },
        ]
    }
    text = chatml(("user", "Hello"), ("assistant", content))
    ids, labels = sample(build([record], chatml_tokenizer, tmp_path))
    at = text.index(content)
    trained = trained_chars(text, [content + END])
    for i in range(at + cut, at + len(content)):
        trained[i] = False
    assert (ids, labels) == labels_of(chatml_tokenizer, text, trained)
    token = next(
        k
        for k, (a, _) in enumerate(
            chatml_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        )
        if a == at + start
    )
    assert labels[token] == ids[token] and labels[token + 1] == -100  # straddler trained, the next token not


@pytest.mark.parametrize(
    ("key", "off", "on"),
    [("weight", 0, 1), ("loss_weight", 0.0, 1.0), ("loss_scale", 0, 1), ("loss", False, True), ("train", False, True)],
)
def test_each_peers_turn_flag_switches_turns_off_and_on(key, off, on, chatml_tokenizer, tmp_path):
    """OpenAI weight, LLaMA-Factory v1 loss_weight, ms-swift loss_scale / loss, axolotl train: the first assistant
    turn switched off; with --assistant_turns last, the first switched back on by its flag (the flag wins)."""
    messages = [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Bonjour!", key: off},
        {"role": "user", "content": "Tell me a joke"},
        {"role": "assistant", "content": "cats.", key: on},
    ]
    text = chatml(("user", "Hello"), ("assistant", "Bonjour!"), ("user", "Tell me a joke"), ("assistant", "cats."))
    dataset = build([{"messages": messages}], chatml_tokenizer, tmp_path)
    assert sample(dataset) == expect(chatml_tokenizer, text, ["cats." + END])
    assert dataset.flag_counts == {"turns_off": 1, "turns_on": 0, "tokens_masked": 0, "tokens_on": 0}
    messages[1][key] = on
    last = build([{"messages": messages}], chatml_tokenizer, tmp_path / "last", assistant_turns="last")
    assert sample(last) == expect(chatml_tokenizer, text, ["Bonjour!" + END, "cats." + END])
    switched_on = len(chatml_tokenizer("Bonjour!" + END, add_special_tokens=False)["input_ids"])
    assert last.flag_counts == {"turns_off": 0, "turns_on": 1, "tokens_masked": 0, "tokens_on": switched_on}


def test_span_training_inside_a_turn_the_flag_switches_off(chatml_tokenizer, tmp_path):
    """A turn with train: false keeps the spans its train_detail trains, and only those (no end of turn)."""
    dataset = build([axolotl_record()], chatml_tokenizer, tmp_path)  # turn 4 trained by default
    record = axolotl_record()
    record["conversations"][4]["train"] = False
    off = build([record], chatml_tokenizer, tmp_path / "off")
    hi = "Hi there!" + END
    trained = marked([("Hello" + END, "Hello" + END), (JOKE + END, " very well"), (hi, hi)])
    assert sample(off) == labels_of(chatml_tokenizer, TEXT, trained)
    # Against the defaults (every assistant turn whole), the turn is switched off but for the span it keeps.
    whole = trained_tokens(chatml_tokenizer, marked([(JOKE + END, JOKE + END)]))
    kept = trained_tokens(chatml_tokenizer, marked([(JOKE + END, " very well")]))
    assert off.flag_counts == {"turns_off": 1, "turns_on": 0, "tokens_masked": whole - kept, "tokens_on": 0}
    assert dataset.flag_counts["turns_off"] == 0


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            {"role": "assistant", "content": "a", "weight": 0.5},
            r"^record 0: field 'messages\[1\].weight' is 0.5: only 0 \(not trained\) or 1 \(trained\) is supported",
        ),
        ({"role": "assistant", "content": "a", "loss_scale": 2}, r"field 'messages\[1\].loss_scale' is 2: only 0"),
        ({"role": "assistant", "content": "a", "train": "yes"}, r"field 'messages\[1\].train' must be true or false"),
        (
            {"role": "assistant", "content": "a", "train": True, "weight": 0},
            r"field 'messages\[1\]': contradictory training flags \(train=True, weight=0\)",
        ),
        (
            {
                "role": "assistant",
                "content": "abc",
                "train_detail": [{"begin_offset": 1, "end_offset": 3, "train": True}],
            },
            r"field 'messages\[1\].train_detail\[0\]': offsets 1-3 \(inclusive\) "
            r"are outside the content's 3 characters",
        ),
        (
            {
                "role": "assistant",
                "content": "abc",
                "train_detail": [
                    {"begin_offset": 0, "end_offset": 1, "train": True},
                    {"begin_offset": 1, "end_offset": 2, "train": False},
                ],
            },
            r"field 'messages\[1\].train_detail': spans overlap \(at character 1\)",
        ),
        (
            {"role": "assistant", "content": "abc", "train_detail": [{"begin_offset": 0, "end_offset": 1}]},
            r"field 'messages\[1\].train_detail\[0\]' needs integer begin_offset and end_offset and a boolean train",
        ),
        ({"role": "assistant", "content": "a", "weight": 0}, r"^record 0: no turn is trained"),
    ],
)
def test_flags_that_cannot_be_honoured_exactly_are_refused_in_one_line(message, error, chatml_tokenizer, tmp_path):
    record = {"messages": [{"role": "user", "content": "q"}, message]}
    with pytest.raises(DataError, match=error) as err:
        build([record], chatml_tokenizer, tmp_path)
    assert "\n" not in str(err.value)


def test_a_flag_that_switches_a_user_turn_on_is_read_and_one_that_keeps_it_off_too():
    record = axolotl_record()
    record["conversations"][3]["train"] = True  # as axolotl's own example does
    assert to_conversation(record, "r")["flags"] == {0: False, 1: False, 2: True, 3: True}
    assert to_conversation(axolotl_record(), "r")["flags"] == {0: False, 1: False, 2: True}  # off: as they are


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            {"role": "user", "content": "q", "weight": 1},
            r"^r: field 'messages\[0\].weight': a user turn cannot be trained by weight \(assistant turns are, and "
            r"user turns by axolotl's train or ms-swift's loss\)",
        ),
        ({"role": "user", "content": "q", "loss_weight": 1.0}, r"field 'messages\[0\].loss_weight': a user turn"),
        ({"role": "user", "content": "q", "train": True, "weight": 1}, r"field 'messages\[0\].weight': a user turn"),
        ({"role": "system", "content": "q", "train": True}, r"field 'messages\[0\].train': a system turn cannot"),
        (
            {"role": "system", "content": "qq", "train_detail": [{"begin_offset": 0, "end_offset": 1, "train": True}]},
            r"field 'messages\[0\].train_detail': a system turn cannot be trained here \(only assistant and user",
        ),
    ],
)
def test_a_flag_that_would_train_a_turn_no_peer_trains_is_refused_in_one_line(message, error):
    """OpenAI's weight and LLaMA-Factory's loss_weight are read on assistant turns only; no peer trains a system
    turn."""
    record = {"messages": [message, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]}
    with pytest.raises(DataError, match=error) as err:
        to_conversation(record, "r")
    assert "\n" not in str(err.value)


def test_flags_keep_to_their_turn_when_a_system_turn_is_put_first(chatml_tokenizer, tmp_path):
    """ShareGPT's record-level system and --system_prompt both insert a turn before the flagged ones."""
    record = {
        "system": "Be brief.",
        "conversations": [
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Bonjour!", "weight": 0},
            {"from": "human", "value": "Tell me a joke"},
            {"from": "gpt", "value": "cats."},
        ],
    }
    text = chatml(
        ("system", "Be brief."),
        ("user", "Hello"),
        ("assistant", "Bonjour!"),
        ("user", "Tell me a joke"),
        ("assistant", "cats."),
    )
    assert sample(build([record], chatml_tokenizer, tmp_path)) == expect(chatml_tokenizer, text, ["cats." + END])
    del record["system"]
    prompted = build([record], chatml_tokenizer, tmp_path / "b", system_prompt="Be brief.")
    assert sample(prompted) == expect(chatml_tokenizer, text, ["cats." + END])
