"""Thinking models' reasoning: where it comes from in a record and which of its tokens are trained.

Thinking templates write a turn's reasoning in their own spelling (Qwen3: ``<think>\nREASONING\n</think>\n\n``
before the answer; GPT-OSS: an ``analysis`` channel message; Qwen3.5 and DeepSeek-R1 open the block in the generation
prompt), take it from the message's ``reasoning_content`` (or split it off a ``<think>...</think>`` inside the content),
often drop it from turns before the last user query, and write an empty block for a turn that has none (the same
block their generation prompt adds with ``enable_thinking=False``). The label rule stays the template's: what it
writes for the trained turn after its inference prompt, through its end-of-turn token
(``hf_lora_ds.data.template_rule``); these options only say which of it is a target, on every family alike:

- ``train_reasoning``: a turn's reasoning and the template's close of it are trained (the model learns to reason
  like the data) or masked (the answer is learnt after the data's reasoning, the model's own reasoning style is
  left alone);
- ``empty_think``: a turn without reasoning is prompted with ``enable_thinking=False`` and its empty block is
  masked by default: it stays in the input, as it is in the prompt at inference, but is no target, so answers
  without reasoning do not teach a thinking model to skip its thinking; ``train`` prompts it with thinking on and
  teaches it to write (close) the empty block itself, i.e. to stop thinking.
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
