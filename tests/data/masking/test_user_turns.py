"""User turns that a record's flags train (axolotl's train / train_detail, ms-swift's loss): labels compared with
characters marked by hand in the text each template writes, the content and the end-of-turn token, never the header."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds._testing.tiny_models import template_tokenizer
from hf_lora_ds.data.audit.inference_prompts import round_trip
from hf_lora_ds.data.audit.mask_audit import show_samples
from hf_lora_ds.data.masking.template_rule import TemplateError
from tests.data.peer_records import (
    END,
    JOKE,
    axolotl_documented_example,
    axolotl_text,
    build,
    chatml,
    labels_of,
    sample,
)

TEXT = axolotl_text()
# (header the turn follows, trained text right after it), in order: each user turn its content and end of turn.
TRAINED = [
    ("<|im_start|>assistant\n", "Hello" + END),
    ("<|im_start|>user\n", "How are you?" + END),
    ("<|im_start|>assistant\nI'm doing", " very well"),
    (", thank you!", END),
    ("<|im_start|>user\n", JOKE + END),
    ("<|im_start|>assistant\n", "Hi there!" + END),
]


def marked(text: str, trained: list[tuple[str, str]]) -> list[bool]:
    chars, at = [False] * len(text), 0
    for before, part in trained:
        at = text.index(before + part, at) + len(before)
        chars[at : at + len(part)] = [True] * len(part)
        at += len(part)
    return chars


def test_axolotl_documented_example_trains_its_human_turns_once(chatml_tokenizer, tmp_path):
    dataset = build([axolotl_documented_example()], chatml_tokenizer, tmp_path)
    assert sample(dataset) == labels_of(chatml_tokenizer, TEXT, marked(TEXT, TRAINED))
    users = len(chatml_tokenizer("How are you?" + END + JOKE + END, add_special_tokens=False)["input_ids"])
    assert dataset.flag_counts["turns_on"] == 2 and dataset.flag_counts["tokens_on"] == users
    # What the audit shows a script (--show_samples_format jsonl): each flagged human turn in the trained spans once.
    shown = json.loads(show_samples(dataset, 1, "jsonl"))
    spans = [shown["text"][a:b] for a, b in shown["trained"]]
    assert spans.count("How are you?" + END) == 1 and spans.count(JOKE + END) == 1
    assert "Hello" + END in spans and "You are an AI assistant." + END not in spans
    assert round_trip(dataset).turns == 3  # a user turn follows no inference prompt: only replies round-trip


def test_ms_swift_loss_and_a_user_turns_train_detail(chatml_tokenizer, tmp_path):
    """loss: true trains the turn whole; train_detail without a flag trains its spans only, not the end of turn."""
    record = {
        "messages": [
            {"role": "user", "content": "Tell me a joke", "loss": True},
            {"role": "assistant", "content": "cats."},
            {
                "role": "user",
                "content": "Why so?",
                "train_detail": [{"begin_offset": 4, "end_offset": 6, "train": True}],
            },
            {"role": "assistant", "content": "on a mat"},
        ]
    }
    text = chatml(("user", "Tell me a joke"), ("assistant", "cats."), ("user", "Why so?"), ("assistant", "on a mat"))
    trained = [
        ("<|im_start|>user\n", "Tell me a joke" + END),
        ("<|im_start|>assistant\n", "cats." + END),
        ("<|im_start|>user\nWhy ", "so?"),
        ("<|im_start|>assistant\n", "on a mat" + END),
    ]
    assert sample(build([record], chatml_tokenizer, tmp_path)) == labels_of(
        chatml_tokenizer, text, marked(text, trained)
    )


def test_a_record_that_trains_only_a_user_turn_trains_it_in_the_whole_conversation(chatml_tokenizer, tmp_path):
    record = {
        "messages": [
            {"role": "user", "content": "Tell me a joke", "train": True},
            {"role": "assistant", "content": "cats.", "train": False},
        ]
    }
    text = chatml(("user", "Tell me a joke"), ("assistant", "cats."))
    expected = labels_of(chatml_tokenizer, text, marked(text, [("<|im_start|>user\n", "Tell me a joke" + END)]))
    assert sample(build([record], chatml_tokenizer, tmp_path)) == expected


def test_a_user_turn_is_trained_once_where_the_template_gives_a_turn_a_text_of_its_own(qwen3_tokenizer, tmp_path):
    """Qwen3 drops earlier reasoning: each reasoning turn has a text of its own, and each holds the first user turn."""
    record = {
        "messages": [
            {"role": "user", "content": "Hello there", "train": True},
            {"role": "assistant", "content": "the cat sat", "reasoning_content": "why how"},
            {"role": "user", "content": "Why so?"},
            {"role": "assistant", "content": "on a mat", "reasoning_content": "how 12"},
        ]
    }
    dataset = build([record], qwen3_tokenizer, tmp_path)
    assert len(dataset) == 2
    trained = [json.loads(line) for line in show_samples(dataset, 2, "jsonl").splitlines()]
    user = "Hello there<|im_end|>"
    assert [[s["text"][a:b] for a, b in s["trained"]].count(user) for s in trained] == [1, 0]


# A template that writes no generation prompt after a user turn: the user turn ends with the reply's header.
REPLY_HEADER_IN_USER_TURN = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{ '<|user|>' + m['content'] + '<|assistant|>' }}"
    "{% else %}{{ m['content'] + '<|end|>' }}{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    ("template", "trained"),
    [
        (REPLY_HEADER_IN_USER_TURN, "Hello"),  # <|assistant|> opens the reply: the header, not trained
        # GLM-4 closes a user turn with nothing: its content alone
        (
            "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] }}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}",
            "Hello",
        ),
    ],
)
def test_tokens_after_a_user_turn_that_open_the_reply_or_none_at_all(chatml_tokenizer, tmp_path, template, trained):
    tokenizer = template_tokenizer(chatml_tokenizer, template)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|user|>", "<|assistant|>", "<|end|>"]})
    record = {"messages": [{"role": "user", "content": "Hello", "train": True}, {"role": "assistant", "content": "Hi"}]}
    shown = json.loads(show_samples(build([record], tokenizer, tmp_path), 1, "jsonl"))
    spans = [shown["text"][a:b] for a, b in shown["trained"]]
    assert spans[0] == trained


def test_a_template_that_changes_a_trained_user_turn_is_refused_in_one_line(chatml_tokenizer, tmp_path):
    shouting = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] | upper + '<|im_end|>\n' }}"
    shouting += "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    tokenizer = template_tokenizer(chatml_tokenizer, shouting)
    record = {"messages": [{"role": "user", "content": "hello", "train": True}, {"role": "assistant", "content": "HI"}]}
    with pytest.raises(TemplateError, match=r"^record 0: the chat template does not write user turn 0 as its content"):
        build([record], tokenizer, tmp_path)
