"""Thinking models' reasoning: where it comes from in a record and which of its tokens are trained.

Templates write reasoning in their own spelling (Qwen3's ``<think>`` block, GPT-OSS's ``analysis`` channel, a block
opened in the generation prompt), often drop it from earlier turns, and write an empty block for a turn without
reasoning. The label rule stays the template's (hf_lora_ds.data.masking.template_rule); ``train_reasoning`` and
``empty_think`` (see their help texts) only say which of what it writes is a target, for every family alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hf_lora_ds.data.masking.template_probes import TemplateTraits
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.content_parts import PARTS_KEY, drop_parts

__all__ = [
    "THINK_OPEN",
    "THINK_CLOSE",
    "ThinkingOptions",
    "split_inline_think",
    "move_inline_reasoning",
    "as_template_reads",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EmptyThink = Literal["train", "mask"]


@dataclass(frozen=True)
class ThinkingOptions:
    """Which think blocks are trained: one with reasoning (``train_reasoning``) and an empty one (``empty_think``)."""

    train_reasoning: bool = True
    empty_think: EmptyThink = "mask"


def split_inline_think(content: str) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a content holding ``<think>...</think>``, split as Qwen3's template splits it."""
    if THINK_CLOSE not in content:
        return None, content
    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    return reasoning, content.split(THINK_CLOSE)[-1].lstrip("\n")


def move_inline_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant turns with ``<think>`` in their content get it as ``reasoning_content``, so the template renders it
    (and drops it from history) as it does at inference, and the label rule knows which text is reasoning. Used
    only for templates that write reasoning or open a think block in their prompt; for others the content is
    trained as written."""
    out = []
    for message in messages:
        if message["role"] == "assistant" and "reasoning_content" not in message:
            reasoning, answer = split_inline_think(message["content"])
            if reasoning is not None:
                message = {**drop_parts(message), "content": answer, "reasoning_content": reasoning}
        out.append(message)
    return out


def as_template_reads(conversation: dict[str, Any], traits: TemplateTraits, where: str) -> list[dict[str, Any]]:
    """The conversation's messages as its template reads them: a content given as parts joined (unless the template
    iterates them), a ``<think>`` block in a content moved to ``reasoning_content`` (where the template writes
    reasoning), answers in the tags the model writes (``TemplateTraits.answer_tags``), whose length the turn's
    ``train_detail`` offsets then count past."""
    messages, detail = conversation["messages"], conversation.get("detail", {})
    if not traits.iterates_parts and any(PARTS_KEY in message for message in messages):  # it is given the joined text
        messages = [drop_parts(message) for message in messages]
    if traits.writes_reasoning:
        moved = move_inline_reasoning(messages)
        if changed := [i for i in detail if moved[i]["content"] != messages[i]["content"]]:
            raise DataError(
                f"{where}: train_detail of message {changed[0]}: its content holds a <think> block that the template "
                "writes apart, so its offsets cannot be placed; give the reasoning as reasoning_content"
            )
        messages = moved
    if traits.answer_tags:
        wrapped = wrap_answers(messages, traits.answer_tags)
        shift = len(traits.answer_tags[0])
        for i in [i for i in detail if wrapped[i]["content"] != messages[i]["content"]]:
            detail[i] = [(begin + shift, end + shift, train) for begin, end, train in detail[i]]
        messages = wrapped
    return messages


def wrap_answers(messages: list[dict[str, Any]], tags: tuple[str, str]) -> list[dict[str, Any]]:
    """Assistant answers in the ``tags`` their model writes around them (Hunyuan's ``<answer>``, which its template
    takes off history turns), unless the content already holds the opening tag; tool-call turns as they are."""
    opening, closing = tags
    return [
        {**drop_parts(message), "content": opening + message["content"] + closing}
        if message["role"] == "assistant"
        and not message.get("tool_calls")
        and opening.strip() not in message["content"]
        else message
        for message in messages
    ]
