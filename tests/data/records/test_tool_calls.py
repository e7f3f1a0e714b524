"""Tool schemas and calls as records write them (a list or its JSON string, arguments as an object or a JSON string, a
ShareGPT function_call turn), normalised to OpenAI's shape; each error in one line naming the field."""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.tool_calls import sharegpt_call, tool_call, tool_schemas

SCHEMA = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
NORMAL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}


def test_schemas_as_a_list_or_its_json_string():
    assert tool_schemas([SCHEMA], "r", "tools") == tool_schemas(json.dumps([SCHEMA]), "r", "tools") == [SCHEMA]
    assert tool_schemas("", "r", "tools") is None and tool_schemas([], "r", "tools") is None


def test_a_call_in_each_spelling_is_the_same_call():
    arguments = {"city": "Paris"}
    as_string = {"function": {"name": "get_weather", "arguments": json.dumps(arguments)}}
    assert tool_call(as_string, "r", "c") == tool_call(NORMAL, "r", "c") == NORMAL
    assert sharegpt_call(json.dumps({"name": "get_weather", "arguments": arguments}), "r", "c") == NORMAL
    assert tool_call({**NORMAL, "id": "call12345"}, "r", "c") == {**NORMAL, "id": "call12345"}  # Mistral's id


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ({"name": "f"}, r"^r: field 'c' must be an object with 'function'"),
        ({"function": {"name": " "}}, r"^r: field 'c.function.name' must be a non-empty string"),
        ({"function": {"name": "f", "arguments": "{x"}}, r"^r: field 'c.function.arguments': tool call is not valid"),
        ({"function": {"name": "f", "arguments": [1]}}, r"^r: field 'c.function.arguments' must be a JSON object"),
        ({**NORMAL, "id": 7}, r"^r: field 'c.id' must be a non-empty string, got 7"),
        ({**NORMAL, "id": ""}, r"^r: field 'c.id' must be a non-empty string"),
    ],
)
def test_a_call_that_is_not_one_is_refused_in_one_line(call, message):
    with pytest.raises(DataError, match=message):
        tool_call(call, "r", "c")


@pytest.mark.parametrize(
    ("tools", "message"),
    [("[{", r"^r: field 'tools' is not valid JSON"), ([1], r"^r: field 'tools' must be a list of tool schemas")],
)
def test_schemas_that_are_not_a_list_of_objects_are_refused(tools, message):
    with pytest.raises(DataError, match=message):
        tool_schemas(tools, "r", "tools")
