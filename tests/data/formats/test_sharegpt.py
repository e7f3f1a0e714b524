"""ShareGPT records (LLaMA-Factory's and axolotl's): exact label vectors from hand-written pieces, and their errors."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import SHAREGPT_TOOLS, TOOL, TOOL_MESSAGES, build, expected, tool_pieces


def test_sharegpt_with_system_exact_labels(chatml_tokenizer, tmp_path):
    record = {
        "system": "Be brief.",
        "conversations": [{"from": "human", "value": "Hello"}, {"from": "gpt", "value": "Bonjour!"}],
    }
    ds = build([record], chatml_tokenizer, tmp_path)
    input_ids, labels = expected(
        chatml_tokenizer,
        [
            (
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
                False,
            ),
            ("Bonjour!<|im_end|>", True),
            ("\n", False),
        ],
    )
    assert ds[0]["input_ids"] == input_ids
    assert ds[0]["labels"] == labels


def test_openai_style_string_arguments_and_sharegpt_tools_give_the_same_sample(tools_tokenizer, tmp_path):
    string_args = {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        TOOL_MESSAGES[0],
        {"role": "assistant", "content": None, "tool_calls": [string_args]},
        *TOOL_MESSAGES[2:],
    ]
    ds = build([{"messages": messages, "tools": [TOOL]}, SHAREGPT_TOOLS], tools_tokenizer, tmp_path)
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert [ds[0]["labels"], ds[1]["labels"]] == [labels, labels]
    assert ds[1]["input_ids"] == input_ids


@pytest.mark.parametrize(
    "record, message",
    [
        (
            {"conversations": [{"from": "robot", "value": "Hi"}, {"from": "gpt", "value": "Yo"}]},
            r"^src, line 3: field 'conversations\[0\].from': unknown speaker 'robot'; use one of .* --sharegpt_roles",
        ),
        (
            {"conversations": [{"from": "human", "value": "Hi"}, {"from": "function_call", "value": "{get_weather"}]},
            r"^src, line 3: field 'conversations\[1\].value': tool call is not valid JSON",
        ),
        (
            {"system": "Be brief.", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": " "}]},
            r"^src, line 3: field 'conversations\[1\].value' is empty$",
        ),
        (
            {"system": "Be brief.", "conversations": [{"from": "system", "value": "s"}, {"from": "gpt", "value": "a"}]},
            r"^src, line 3: field 'system': conversations\[0\] is a system turn already; keep one of them$",
        ),
    ],
)
def test_bad_sharegpt_records_name_source_record_and_field(record, message):
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "src, line 3")
    assert "\n" not in str(err.value)
