"""Every original chat template TRL ships (``trl/chat_templates/*.jinja``, its ``_training`` variants left aside):
labels compared with an expectation built here from inference's own renders, not from the rule's output.

For each trained assistant turn the test renders, on its own, the inference prompt
(``apply_chat_template(history, add_generation_prompt=True, enable_thinking=...)``) and the conversation through the
turn; the reply is the rendered turn after the prompt, through its last special token (the end-of-turn; for GLM,
which writes none after a last turn, the token it writes when a user turn follows). Each is tokenized on its own, as
inference tokenizes the prompt. A sample's labels must then be -100 everywhere except, for each turn it trains, the
reply's tokens right after that turn's prompt tokens; every trained turn must be trained exactly once. Where the
template refuses a record itself (it raises, it drops the tool calls, or it neither writes reasoning nor opens a
think block), the dataset must refuse it with one line naming the record, and only then. The located fast path
(``hf_lora_ds.data.masking.skeleton``) must equal the rule wherever it locates.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest

from hf_lora_ds._testing.tiny_models import template_tokenizer, train_chat_tokenizer
from hf_lora_ds.data.audit.inference_prompts import round_trip
from hf_lora_ds.data.dataset import IGNORE_INDEX, _Encoder
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.masking.template_rule import TemplateError, prefix_samples
from hf_lora_ds.data.masking.thinking import ThinkingOptions

trl = pytest.importorskip("trl", reason="the templates come with TRL: pip install 'hf_lora_ds[test]'")
TEMPLATES = Path(trl.__file__).parent / "chat_templates"
# Multimodal templates whose content must be a list of parts: a text record's string content renders as nothing.
LIST_CONTENT = {"idefics3", "smolvlm", "llava_next"}
ORIGINALS = (path.stem for path in TEMPLATES.glob("*.jinja") if not path.stem.endswith("_training"))
NAMES = sorted(name for name in ORIGINALS if name not in LIST_CONTENT)
# DeepSeek-R1 and V3 drop a turn's reasoning from history though their prompt opens <think>: after the prompt the
# model generates its reasoning, then this, then the answer (their published generation format).
DEFAULTS = ThinkingOptions()
DEEPSEEK_CLOSE = "\n</think>\n\n"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
RECORDS = {
    "single": {
        "messages": [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "the cat sat"}]
    },
    "multi_system": {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "the cat sat"},
            {"role": "user", "content": "Why so?"},
            {"role": "assistant", "content": "on a mat"},
        ]
    },
    "alpaca": {"instruction": "Add 12 and 3", "input": "12 3", "output": "15"},
    "reasoning": {
        "messages": [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": "the cat sat", "reasoning_content": "why how"},
            {"role": "user", "content": "Why so?"},
            {"role": "assistant", "content": "on a mat", "reasoning_content": "how 12 + 3"},
        ]
    },
    "tools": {
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
    },
}


@functools.cache
def _base():
    return train_chat_tokenizer(["the cat sat on a mat. Hello there! why how 12 + 3 = 15, It is sunny."] * 10, 400)


@functools.cache
def encoder(name: str, thinking: ThinkingOptions = DEFAULTS) -> _Encoder:
    tokenizer = template_tokenizer(_base(), (TEMPLATES / f"{name}.jinja").read_text())
    return _Encoder(tokenizer, None, None, "all", FormatOptions(), thinking)


def encode(enc: _Encoder, record: dict):
    """The record's samples as the dataset writes them (ids and labels), and its conversation."""
    batch = {"record": [json.dumps(record)], "where": ["data.jsonl, line 1"], "source": ["data.jsonl"]}
    conversation = next(enc.conversations(batch))
    rows = enc(batch).to_pylist()
    return [(row["input_ids"], row["labels"]) for row in rows], conversation


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def expected_turn(enc: _Encoder, messages: list[dict], i: int, tools) -> tuple[list[int], list[int]]:
    """Turn ``i``'s inference prompt ids and the labels of what follows it, from renders made here."""
    tokenizer, options = enc.tokenizer, enc.thinking
    reasoning = (messages[i].get("reasoning_content") or "").strip()
    on = bool(reasoning) or options.empty_think == "train"
    prompt = tokenizer.apply_chat_template(
        messages[:i], tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=on
    )
    through = tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False, enable_thinking=on)
    specials = sorted(tokenizer.all_special_tokens, key=len, reverse=True)
    probe = tokenizer.apply_chat_template(
        messages[:i] + [{**messages[i], "reasoning_content": "PROBE"}], tools=tools, tokenize=False, enable_thinking=on
    )
    if not through.startswith(prompt) and probe.startswith(prompt) and "PROBE" in probe:
        through = probe.replace("PROBE", reasoning)  # Nemotron: an empty block written as <think></think>
    if not through.startswith(prompt):  # DeepSeek: history without the block the prompt opened
        assert prompt.endswith("<think>\n"), (prompt[-40:], through[-40:])
        base = prompt[: -len("<think>\n")]
        assert through.startswith(base)
        through = prompt + reasoning + DEEPSEEK_CLOSE + through[len(base) :]
    reply = through[len(prompt) :]
    # The end-of-turn: the special tokens right after the answer (Command-A writes two); Phi-3's eos after "\n"
    # ends the conversation, not the turn.
    if messages[i].get("tool_calls"):
        last = len(reply.rstrip())
        ends = reply[:last].endswith(tuple(specials))
    else:
        last = answer = reply.rfind(messages[i]["content"]) + len(messages[i]["content"])
        while token := next((t for t in specials if reply.startswith(t, last)), None):
            last += len(token)
        ends = last > answer
    if not ends:  # GLM writes no end-of-turn after a last turn: its stop token is the next turn's first
        follow = tokenizer.apply_chat_template(
            messages[: i + 1] + [{"role": "tool" if messages[i].get("tool_calls") else "user", "content": "x"}],
            tools=tools,
            tokenize=False,
            enable_thinking=on,
        )
        written = messages[i]["content"] or reply[:last]  # a tool call: what the turn wrote
        token = next(t for t in specials if follow.startswith(t, follow.rfind(written) + len(written)))
        reply, last = reply + token, len(reply) + len(token)
    reply = reply[:last]
    masked = ""
    if reasoning and not options.train_reasoning:
        masked = reply[: reply.index(messages[i]["content"], reply.index(reasoning) + len(reasoning))]
    elif not reasoning and options.empty_think == "mask":
        masked = re.match(r"(?:<think>)?\s*(?:</think>\s*)?", reply).group() if "</think>" in reply else ""
    if masked and not masked.strip():
        masked = ""
    target = ids(tokenizer, reply[len(masked) :])
    return ids(tokenizer, prompt), [IGNORE_INDEX] * len(ids(tokenizer, masked)) + target


def refusal(enc: _Encoder, record: dict, kind: str) -> str | None:
    """Why the template itself cannot take the record, judged from its renders here; None if it can."""
    tokenizer = enc.tokenizer
    conversation = next(enc.conversations({"record": [json.dumps(record)], "where": ["x"], "source": ["x"]}))
    messages, tools = conversation["messages"], conversation["tools"]
    try:
        for i in (i for i, message in enumerate(messages) if message["role"] == "assistant"):
            for on in (True, False):
                tokenizer.apply_chat_template(
                    messages[:i], tools=tools, tokenize=False, enable_thinking=on, add_generation_prompt=True
                )
                tokenizer.apply_chat_template(messages[: i + 1], tools=tools, tokenize=False, enable_thinking=on)
    except Exception:
        return "raised"
    full = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, enable_thinking=True)
    if kind == "tools" and "get_weather" not in full[full.index("Weather in Paris?") :]:
        return "tool call"
    if kind == "reasoning":
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            through = tokenizer.apply_chat_template(
                messages[: i + 1], tools=tools, tokenize=False, enable_thinking=True
            )
            prompt = tokenizer.apply_chat_template(
                messages[:i], tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=True
            )
            if message["reasoning_content"] not in through[len(prompt) :] and not prompt.endswith("<think>\n"):
                return "reasoning"
    return None


REFUSALS = {
    "raised": "the chat template raised",
    "tool call": "does not render the tool call 'get_weather'",
    "reasoning": "does not render the reasoning",
}


def check_labels(enc: _Encoder, record: dict, kind: str) -> None:
    why = refusal(enc, record, kind)
    if why is not None:
        with pytest.raises(TemplateError, match=r"^data\.jsonl, line 1: .*" + re.escape(REFUSALS[why])) as err:
            encode(enc, record)
        assert "\n" not in str(err.value)
        return
    rows, conversation = encode(enc, record)
    messages, tools = conversation["messages"], conversation["tools"]
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    found = {i: 0 for i in turns}
    for row_ids, labels in rows:
        expected = [IGNORE_INDEX] * len(row_ids)
        for i in turns:
            prompt, target = expected_turn(enc, messages, i, tools)
            stop = len(prompt) + len(target)
            if (
                row_ids[: len(prompt)] == prompt
                and labels[len(prompt) : stop] == target
                and any(label != IGNORE_INDEX for label in target)
            ):
                found[i] += 1
                assert row_ids[len(prompt) : stop] == [
                    t
                    for t in ids(
                        enc.tokenizer, enc.tokenizer.decode(row_ids[len(prompt) : stop], skip_special_tokens=False)
                    )
                ], "labels over other tokens"
                expected[len(prompt) : stop] = target
        assert labels == expected, "a label outside every trained turn's reply, or a reply label missing"
    assert found == {i: 1 for i in turns}, f"turns trained {found} (each must be trained once)"


@pytest.mark.parametrize("kind", list(RECORDS))
@pytest.mark.parametrize("name", NAMES)
def test_labels_are_the_inference_reply(name, kind):
    check_labels(encoder(name), RECORDS[kind], kind)


THINKING = [
    "qwen3",
    "qwen3_5_think",
    "qwen3_8",
    "deepseek_r1_distill",
    "gptoss",
    "nemotron_3_nano",
    "glm4moe",
    "muse_glimmer",
    "gemma4_v5",
]


@pytest.mark.parametrize("name", THINKING)
@pytest.mark.parametrize("thinking", [ThinkingOptions(train_reasoning=False), ThinkingOptions(empty_think="train")])
def test_thinking_options_mean_the_same_on_every_family(name, thinking):
    for kind in ("single", "reasoning"):
        check_labels(encoder(name, thinking), RECORDS[kind], kind)


@pytest.mark.parametrize("name", NAMES)
def test_located_path_equals_the_rule(name):
    enc = encoder(name)
    for kind in ("single", "multi_system", "alpaca"):
        batch = {"record": [json.dumps(RECORDS[kind])] * 2, "where": ["a", "b"], "source": ["s", "s"]}
        conversations = list(enc.conversations(batch))
        for conversation, located in zip(conversations, enc.locator.samples(conversations)):
            if located is not None:
                assert located == prefix_samples(enc.rules, conversation["messages"], "all", None)


@pytest.mark.parametrize("name", NAMES)
def test_every_trained_turn_round_trips_to_its_inference_prompt(name):
    # What run_sft checks at start and the audit on every record (hf_lora_ds.data.audit.inference_prompts).
    enc = encoder(name)
    kinds = [kind for kind, record in RECORDS.items() if refusal(enc, record, kind) is None]
    table = datasets.Dataset.from_dict({"record": [json.dumps(RECORDS[kind]) for kind in kinds], "where": kinds})
    result = round_trip(SimpleNamespace(encoder=enc, records=table))
    turns = sum(
        sum(m["role"] == "assistant" for m in RECORDS[kind].get("messages", [{"role": "assistant"}])) for kind in kinds
    )
    assert (result.turns, result.failures, result.first) == (turns, 0, None)
