"""Tool calling in a record: the tool schemas and each call, normalised to the OpenAI shape chat templates read.

A record's ``tools`` may be a list of schemas or that list as a JSON string (LLaMA-Factory stores it so); a call's
``arguments`` may be an object or a JSON string (templates serialise them themselves). A call written as JSON
(ShareGPT's ``function_call`` turn, LLaMA-Factory v1's ``tool_call`` part) is parsed by ``tool_call_json``.
"""

from __future__ import annotations

import json
from typing import Any

from hf_lora_ds.data.records import DataError

__all__ = ["tool_schemas", "tool_call", "tool_call_json", "sharegpt_call"]


def tool_schemas(tools: Any, where: str, name: str) -> list[dict] | None:
    """A record's tool schemas: a list of objects, or that list as a JSON string (LLaMA-Factory stores it so)."""
    if tools is None or tools == "" or tools == []:
        return None
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise DataError(f"{where}: field '{name}' is not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise DataError(f"{where}: field '{name}' must be a list of tool schemas (objects)")
    return tools


def tool_call_json(value: str, where: str, label: str) -> Any:
    """A tool call written as a JSON string (ShareGPT's function_call turn, LLaMA-Factory v1's tool-call part)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as err:
        raise DataError(
            f"{where}: field '{label}': tool call is not valid JSON ({err.msg} at column {err.colno})"
        ) from None


def sharegpt_call(value: str, where: str, name: str) -> dict[str, Any]:
    """A ShareGPT ``function_call`` turn's value: one call as JSON (``{"name", "arguments"}``), normalised."""
    call = tool_call_json(value, where, f"{name}.value")
    return tool_call({"function": call} if isinstance(call, dict) else call, where, f"{name}.value")


def tool_call(call: Any, where: str, name: str) -> dict[str, Any]:
    """An OpenAI-style call ``{"type": "function", "function": {"name", "arguments"}}``; ``arguments`` given as a
    JSON string is parsed, since chat templates (Qwen2.5's) serialise it themselves with ``tojson``."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise DataError(f"{where}: field '{name}' must be an object with 'function': {{name, arguments}}")
    fn_name = function.get("name")
    if not isinstance(fn_name, str) or not fn_name.strip():
        raise DataError(f"{where}: field '{name}.function.name' must be a non-empty string")
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as err:
            raise DataError(
                f"{where}: field '{name}.function.arguments': tool call is not valid JSON "
                f"({err.msg} at column {err.colno})"
            ) from None
    if not isinstance(arguments, dict):
        raise DataError(f"{where}: field '{name}.function.arguments' must be a JSON object")
    normal = {"type": "function", "function": {"name": fn_name, "arguments": arguments}}
    if (call_id := call.get("id")) is not None:  # the call's id, which Mistral's templates write, its result names
        if not isinstance(call_id, str) or not call_id.strip():
            raise DataError(f"{where}: field '{name}.id' must be a non-empty string, got {call_id!r:.40}")
        normal["id"] = call_id
    return normal
