"""Real chat templates whose shapes the label rule meets nowhere in TRL's set, on plain and reasoning records: labels
compared with replies spelled out here from each model's documented format, after the prompt inference renders.

- GLM-4 (glm-4-9b-chat) writes no end-of-turn token after a reply: the next turn's role token (``<|user|>``) stops
  generation, so the reply is trained through it. With a tokenizer in which that role token is no token (only the
  template's literal tokens are), generation stops at eos: the reply is trained through eos, each turn in a text of
  its own (the history inference renders has no eos after a turn).
- Mixtral-8x22B-Instruct-v0.1's default template (Mistral's v3 tokenizer) writes ``' ' + content + ' ' + eos``:
  the space before ``</s>`` is trained as written.
- Mistral-7B-Instruct-v0.3 and Mistral-Nemo-Instruct-2407 write the system prompt only into the user turn that is
  the conversation's last message: each assistant turn is trained in a text of its own, its inference prompt (with
  the system prompt) then its reply.
- Hunyuan (the dense 0.5B-7B Instruct family's template and Hunyuan-A13B-Instruct's) append an empty think block to
  whatever they render with thinking off and write no reasoning: the model writes '<think>\nR\n</think>\n' and its
  answer (Tencent's training format), the dense one in '<answer>' tags it takes off history turns; each turn is
  trained in a text of its own, after the prompt inference builds.

The templates are in ``tests/data/masking/templates``, byte for byte as published (``SOURCES``); the tokenizers are the
tiny test vocabulary with each model's special tokens, bos and eos.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest

from hf_lora_ds._testing.tiny_models import template_tokenizer, train_chat_tokenizer
from hf_lora_ds.data.audit.inference_prompts import round_trip
from hf_lora_ds.data.audit.mask_audit import audit_dataset
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset, _Encoder
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.masking.template_rule import TemplateError
from hf_lora_ds.data.masking.thinking import ThinkingOptions

TEMPLATES = Path(__file__).parent / "templates"
SOURCES = {
    "glm4_9b_chat": "THUDM/glm-4-9b-chat tokenizer_config.json chat_template, as huggingface/huggingface.js "
    "packages/ollama-utils/src/chat-template-automap.ts (fe42e68) quotes it for library/glm4:9b (identical bytes)",
    "mixtral_8x22b_v3_default": "mistralai/Mixtral-8x22B-Instruct-v0.1 tokenizer_config.json chat_template 'default', "
    "as vllm-project/vllm issue #5309 quotes it",
    "mistral_7b_instruct_v0_3": "mistralai/Mistral-7B-Instruct-v0.3 tokenizer_config.json chat_template (the tool "
    "calling revision), as quoted whole in a public chat-template viewer script",
    "mistral_nemo_instruct_2407": "mistralai/Mistral-Nemo-Instruct-2407 chat_template, as its GGUF's "
    "tokenizer.chat_template metadata prints it",
    # The same template with a tokenizer that has only the tokens it writes literally: its next turn's role token
    # (written as '<|' + role + '|>') is no token of the vocabulary, so generation stops at eos.
    "glm4_9b_chat_literal_tokens": "glm4_9b_chat.jinja, with the special tokens the template writes as literals",
    "hunyuan_dense_instruct": "tencent/Hunyuan-1.8B-Instruct chat_template.jinja (the Hunyuan dense 0.5B-7B Instruct "
    "template), as mlx-community/Hunyuan-1.8B-Instruct-4bit (5a121ae) ships it, quoted whole in magicnight/Mac-MLX "
    "MacMLXCore/Tests/MacMLXCoreTests/Fixtures/hunyuan_v1_dense_chat_template_fixture.json",
    "hunyuan_a13b_instruct": "tencent/Hunyuan-A13B-Instruct chat_template, models/tokenizer_config.json of the "
    "Tencent-Hunyuan/Hunyuan-A13B repository (df832eb, as the fork tianyu1412/Hunyuan-A13B holds it)",
}
FILES = {"glm4_9b_chat_literal_tokens": "glm4_9b_chat"}  # a shape that shares its template file
MISTRAL_SPECIALS = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
]
TOKENS = {  # special tokens, eos, bos as each model's tokenizer_config.json has them
    "glm4_9b_chat": (
        [
            "[MASK]",
            "[gMASK]",
            "[sMASK]",
            "<sop>",
            "<eop>",
            "<|system|>",
            "<|user|>",
            "<|assistant|>",
            "<|observation|>",
        ],
        "<|endoftext|>",
        None,
    ),
    "mixtral_8x22b_v3_default": (MISTRAL_SPECIALS, "</s>", "<s>"),
    "mistral_7b_instruct_v0_3": (MISTRAL_SPECIALS, "</s>", "<s>"),
    "mistral_nemo_instruct_2407": (MISTRAL_SPECIALS, "</s>", "<s>"),
    "glm4_9b_chat_literal_tokens": (["<sop>", "<|system|>", "<|assistant|>"], "<|endoftext|>", None),
    "hunyuan_dense_instruct": (
        ["<｜hy_User｜>", "<｜hy_Assistant｜>", "<｜hy_place▁holder▁no▁3｜>"],
        "<｜hy_place▁holder▁no▁2｜>",
        "<｜hy_begin▁of▁sentence｜>",
    ),
    "hunyuan_a13b_instruct": (["<|startoftext|>", "<|extra_0|>", "<|extra_4|>", "<|extra_5|>"], "<|eos|>", None),
}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "call12345"}'


def _mistral_reply(space: str):
    """v0.3 writes a space after [/INST] and after [TOOL_CALLS]; Nemo writes neither."""
    return lambda content, reasoning=None: (
        f"[TOOL_CALLS]{space}[{CALL}]</s>" if content == "CALL" else f"{space}{content}</s>"
    )


def _hunyuan_reply(answer: str, eos: str):
    """Tencent's training data format for Hunyuan (Hunyuan-7B's train/README.md): '<think>\\n{think}\\n</think>\\n' then
    the answer, the block empty and in the prompt with thinking off; the dense template takes '<answer>' tags off
    history turns, so its model wraps its answer in them ('answer' formats the answer)."""

    def reply(content: str, reasoning: str | None = None) -> str:
        if content == "CALL":
            return '<tool_calls><tool_call>get_weather\n```json\n{"city": "Paris"}\n```</tool_call></tool_calls>' + eos
        block = f"<think>\n{reasoning}\n</think>\n" if reasoning else ""
        return block + answer.format(content) + eos

    return reply


# What the model generates after its inference prompt, spelled from each format: content (and reasoning) -> reply;
# a tool call turn as "CALL". GLM's reply runs through the token that starts the next turn (<|user|>, every record).
REPLIES = {
    "glm4_9b_chat": lambda content, reasoning=None: f"\n{content}<|user|>",
    "mixtral_8x22b_v3_default": lambda content, reasoning=None: f" {content} </s>",
    "mistral_7b_instruct_v0_3": _mistral_reply(" "),
    "mistral_nemo_instruct_2407": _mistral_reply(""),
    # what LLaMA-Factory trains too
    "glm4_9b_chat_literal_tokens": lambda content, reasoning=None: f"\n{content}<|endoftext|>",
    "hunyuan_dense_instruct": _hunyuan_reply("<answer>\n{}\n</answer>", "<｜hy_place▁holder▁no▁2｜>"),
    "hunyuan_a13b_instruct": _hunyuan_reply("{}", "<|eos|>"),
}

SYSTEM = {"role": "system", "content": "Be brief."}
TURNS = [
    {"role": "user", "content": "Hello there"},
    {"role": "assistant", "content": "the cat sat"},
    {"role": "user", "content": "Why so?"},
    {"role": "assistant", "content": "on a mat"},
]
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
    "single": {"messages": TURNS[:2]},
    "single_system": {"messages": [SYSTEM, *TURNS[:2]]},
    "multi": {"messages": TURNS},
    "multi_system": {"messages": [SYSTEM, *TURNS]},
    "alpaca": {"instruction": "Add 12 and 3", "input": "12 3", "output": "15", "system": "Be brief."},
    "reasoning": {
        "messages": [
            TURNS[0],
            {**TURNS[1], "reasoning_content": "why how"},
            TURNS[2],
            {**TURNS[3], "reasoning_content": "how 12 + 3"},
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
                    {
                        "type": "function",
                        "id": "call12345",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                    }
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "call12345"},
            {"role": "assistant", "content": "It is sunny."},
        ],
    },
}
# The records a template itself cannot take, and the line that says so.
REFUSED = {
    ("glm4_9b_chat", "tools"): "does not render the tool call 'get_weather' of assistant turn 1",  # no tool_calls
    ("glm4_9b_chat_literal_tokens", "tools"): "does not render the tool call 'get_weather' of assistant turn 1",
    ("mixtral_8x22b_v3_default", "single_system"): "raised an exception: Conversation roles must alternate",
    ("mixtral_8x22b_v3_default", "multi_system"): "raised an exception: Conversation roles must alternate",
    ("mixtral_8x22b_v3_default", "alpaca"): "raised an exception: Conversation roles must alternate",
    ("mixtral_8x22b_v3_default", "tools"): "raised an exception: Conversation roles must alternate",
    **{
        (name, "reasoning"): "does not render the reasoning"
        for name in (
            "glm4_9b_chat",
            "glm4_9b_chat_literal_tokens",
            "mistral_7b_instruct_v0_3",
            "mistral_nemo_instruct_2407",
        )
    },
    ("mixtral_8x22b_v3_default", "reasoning"): "does not render the reasoning",
}
# Shapes with no fixed expectation: Hunyuan-A13B's tools prompt holds the time of the render (strftime_now).
UNCHECKED = {("hunyuan_a13b_instruct", "tools")}


@functools.cache
def tokenizer(name: str):
    base = train_chat_tokenizer(["the cat sat on a mat. Hello there! why how 12 + 3 = 15, It is sunny."] * 10, 400)
    built = template_tokenizer(base, (TEMPLATES / f"{FILES.get(name, name)}.jinja").read_text(encoding="utf-8"))
    specials, eos, bos = TOKENS[name]
    bos_token = {"bos_token": bos} if bos else {}
    built.add_special_tokens({"additional_special_tokens": specials, "eos_token": eos, **bos_token})
    return built


@functools.cache
def encoder(name: str) -> _Encoder:
    return _Encoder(tokenizer(name), None, None, "all", FormatOptions(), ThinkingOptions())


def encode(name: str, record: dict):
    batch = {"record": [json.dumps(record)], "where": ["data.jsonl, line 1"], "source": ["data.jsonl"]}
    conversation = next(encoder(name).conversations(batch))
    return [(row["input_ids"], row["labels"]) for row in encoder(name)(batch).to_pylist()], conversation["messages"]


def ids(name: str, text: str) -> list[int]:
    return tokenizer(name)(text, add_special_tokens=False)["input_ids"]


def expected_turn(name: str, messages: list[dict], i: int) -> tuple[list[int], list[int]]:
    """Turn ``i``'s inference prompt ids (the template's render, as inference makes it) and its reply's ids."""
    reasoning = messages[i].get("reasoning_content")
    prompt = tokenizer(name).apply_chat_template(
        messages[:i],
        tools=_tools(messages),
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=bool(reasoning),
    )
    content = "CALL" if messages[i].get("tool_calls") else messages[i]["content"]
    return ids(name, prompt), ids(name, REPLIES[name](content, reasoning))


def _tools(messages: list[dict]) -> list[dict] | None:
    return TOOLS if any(m.get("tool_calls") for m in messages) else None


def check(name: str, kind: str) -> None:
    record = RECORDS[kind]
    if (name, kind) in REFUSED:
        with pytest.raises(TemplateError, match=r"^data\.jsonl, line 1: .*" + REFUSED[name, kind]) as err:
            encode(name, record)
        assert "\n" not in str(err.value)
        return
    rows, messages = encode(name, record)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    # The contents as the record gives them (and inference's history holds them), not as the dataset wrote them.
    given = iter([m["content"] for m in record.get("messages", []) if m["role"] == "assistant"] or [record["output"]])
    messages = [{**m, "content": next(given)} if m["role"] == "assistant" else m for m in messages]
    found = dict.fromkeys(turns, 0)
    for row_ids, labels in rows:
        expected = [IGNORE_INDEX] * len(row_ids)
        for i in turns:
            prompt, reply = expected_turn(name, messages, i)
            stop = len(prompt) + len(reply)
            if row_ids[: len(prompt)] == prompt and row_ids[len(prompt) : stop] == reply:
                found[i] += 1
                expected[len(prompt) : stop] = reply
        assert labels == expected, "a label outside every trained turn's reply, or a reply label missing"
    assert found == dict.fromkeys(turns, 1), f"turns trained {found} (each must be trained once)"


@pytest.mark.parametrize(
    ("name", "kind"), [(name, kind) for name in SOURCES for kind in RECORDS if (name, kind) not in UNCHECKED]
)
def test_labels_are_the_reply_after_the_inference_prompt(name, kind):
    check(name, kind)


@pytest.mark.parametrize("name", ["mistral_7b_instruct_v0_3", "mistral_nemo_instruct_2407"])
def test_a_system_prompt_only_the_last_user_turn_carries_gives_each_turn_its_own_text(name):
    rows, messages = encode(name, RECORDS["multi_system"])
    assert len(rows) == 2
    for (row_ids, _), turn in zip(rows, (2, 4)):
        prompt, reply = expected_turn(name, messages, turn)
        assert row_ids == prompt + reply  # the whole text: the prompt inference gives, with the system prompt
        assert "Be brief." in tokenizer(name).decode(prompt)


def test_the_audit_line_says_what_ends_a_reply_with_no_end_of_turn_token(tmp_path):
    records = [RECORDS["multi"], RECORDS["single"]]
    line = audit_dataset(ChatSFTDataset(records, tokenizer("glm4_9b_chat"), cache_dir=tmp_path)).line()
    assert "replies end in the next turn's role token (<|user|>" in line and "3/3 spans end in the end-of-turn" in line
    mistral = audit_dataset(ChatSFTDataset(records, tokenizer("mistral_nemo_instruct_2407"), cache_dir=tmp_path))
    assert "role token" not in mistral.line()
    literal = ChatSFTDataset(records, tokenizer("glm4_9b_chat_literal_tokens"), cache_dir=tmp_path)
    assert "replies end in eos (<|endoftext|>) where that role token is no token" in audit_dataset(literal).line()
    assert len(literal) == 3  # the two turns of the multi-turn record each in a text of its own


@pytest.mark.parametrize("name", list(SOURCES))
def test_every_trained_turn_round_trips_to_its_inference_prompt(name):
    # What run_sft checks at start and the audit on every record (hf_lora_ds.data.audit.inference_prompts).
    kinds = [kind for kind in RECORDS if (name, kind) not in REFUSED.keys() | UNCHECKED]
    table = datasets.Dataset.from_dict({"record": [json.dumps(RECORDS[kind]) for kind in kinds], "where": kinds})
    result = round_trip(SimpleNamespace(encoder=encoder(name), records=table))
    turns = sum(sum(m["role"] == "assistant" for m in encode(name, RECORDS[kind])[1]) for kind in kinds)
    assert (result.turns, result.failures, result.first) == (turns, 0, None)
