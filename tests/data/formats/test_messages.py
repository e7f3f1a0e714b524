"""Chat-messages and tool-call records (TRL conversational, OpenAI): exact label vectors and their errors."""

from __future__ import annotations

import pytest

from hf_lora_ds.data.dataset import TemplateError
from hf_lora_ds.data.formats import to_conversation
from hf_lora_ds.data.records import DataError
from tests.data.peer_records import TOOL, TOOL_MESSAGES, build, expected, tool_pieces


def test_tool_call_conversation_trains_the_call_not_the_result(tools_tokenizer, tmp_path):
    ds = build([{"messages": TOOL_MESSAGES, "tools": [TOOL]}], tools_tokenizer, tmp_path)
    input_ids, labels = expected(tools_tokenizer, tool_pieces())
    assert ds[0]["input_ids"] == input_ids
    assert ds[0]["labels"] == labels


def test_template_without_tool_support_is_refused(chatml_tokenizer, tmp_path):
    with pytest.raises(TemplateError, match="does not render the tool call 'get_weather' of assistant turn 1"):
        build([{"messages": TOOL_MESSAGES, "tools": [TOOL]}], chatml_tokenizer, tmp_path)


@pytest.mark.parametrize(
    "record, message",
    [
        (
            {
                "messages": [
                    TOOL_MESSAGES[0],
                    {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": '{"city": Paris}'}}]},
                ]
            },
            r"^src, line 3: field 'messages\[1\].tool_calls\[0\].function.arguments': tool call is not valid JSON",
        ),
        (
            {"messages": [TOOL_MESSAGES[0], {"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]},
            r"^src, line 3: field 'messages\[1\].tool_calls\[0\].function.name' must be a non-empty string",
        ),
        (
            {"messages": TOOL_MESSAGES[:1], "tools": [TOOL]},
            r"^src, line 3: field 'messages': no assistant turn",
        ),
        (
            {"messages": TOOL_MESSAGES, "tools": "[{"},
            r"^src, line 3: field 'tools' is not valid JSON",
        ),
    ],
)
def test_bad_messages_records_name_source_record_and_field(record, message):
    with pytest.raises(DataError, match=message) as err:
        to_conversation(record, "src, line 3")
    assert "\n" not in str(err.value)
