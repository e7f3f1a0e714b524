"""Thinking models' reasoning: where it comes from in a record and which of its tokens are trained.

Templates write reasoning in their own spelling (Qwen3's ``<think>`` block, GPT-OSS's ``analysis`` channel, a block
opened in the generation prompt), often drop it from earlier turns, and write an empty block for a turn without
reasoning. The label rule stays the template's (hf_lora_ds.data.template_rule); ``train_reasoning`` and
``empty_think`` (see their help texts) only say which of what it writes is a target, for every family alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hf_lora_ds.data.content_parts import drop_parts

__all__ = ["THINK_OPEN", "THINK_CLOSE", "ThinkingOptions", "split_inline_think", "move_inline_reasoning"]

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
