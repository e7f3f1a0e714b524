"""Thinking models' reasoning: where it comes from in a record and which of its tokens are trained.

Qwen3-class templates write an assistant turn as ``<think>\\nREASONING\\n</think>\\n\\nANSWER<|im_end|>``, take the
reasoning from the message's ``reasoning_content`` (or split it off a ``<think>...</think>`` inside the content),
drop it from turns before the last user query, and write an empty ``<think>\\n\\n</think>\\n\\n`` for a final turn
that has none (the same block their generation prompt adds with ``enable_thinking=False``). The label rule stays
the template's: what it writes for the trained turn, through its end-of-turn token; these options only say whether
the think block in front of the answer is a target:

- ``train_reasoning``: a non-empty block is trained (the model learns to reason like the data) or masked (the answer
  is learnt after the data's reasoning, the model's own reasoning style is left alone);
- ``empty_think``: an empty block (non-reasoning data) is masked by default: it stays in the input, as it is in the
  prompt at inference with ``enable_thinking=False``, but is no target, so answers without reasoning do not teach a
  thinking model to skip its thinking; ``train`` teaches it to write the empty block itself, i.e. to stop thinking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

__all__ = [
    "THINK_OPEN",
    "THINK_CLOSE",
    "ThinkingOptions",
    "renders_reasoning",
    "split_inline_think",
    "move_inline_reasoning",
    "think_block",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
EmptyThink = Literal["train", "mask"]
_PROBE = "reasoning-probe-7f3a"


@dataclass(frozen=True)
class ThinkingOptions:
    """Which think blocks are trained: one with reasoning (``train_reasoning``) and an empty one (``empty_think``)."""

    train_reasoning: bool = True
    empty_think: EmptyThink = "mask"

    def trains(self, block: str) -> bool:
        """Whether the think block ``block`` (tags included) is a training target."""
        empty = not block.replace(THINK_OPEN, "", 1).replace(THINK_CLOSE, "", 1).strip()
        return self.empty_think == "train" if empty else self.train_reasoning


def renders_reasoning(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the chat template writes an assistant message's ``reasoning_content`` (Qwen3's does, Qwen2.5's not)."""
    probe = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "reasoning_content": _PROBE}]
    return _PROBE in tokenizer.apply_chat_template(probe, tokenize=False)


def split_inline_think(content: str) -> tuple[str | None, str]:
    """``(reasoning, answer)`` of a content holding ``<think>...</think>``, split as Qwen3's template splits it."""
    if THINK_CLOSE not in content:
        return None, content
    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    return reasoning, content.split(THINK_CLOSE)[-1].lstrip("\n")


def move_inline_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant turns with ``<think>`` in their content get it as ``reasoning_content``, so the template renders it
    (and drops it from history) as it does at inference, and the label rule knows which text is reasoning. Used
    only for templates that render reasoning; for others the content is trained as written."""
    out = []
    for message in messages:
        if message["role"] == "assistant" and "reasoning_content" not in message:
            reasoning, answer = split_inline_think(message["content"])
            if reasoning is not None:
                message = {**message, "content": answer, "reasoning_content": reasoning}
        out.append(message)
    return out


def think_block(reply: str, content: str) -> str:
    """The think block the template wrote at the start of an assistant reply (with the whitespace after it), or
    ``""``; a ``<think>`` that is the message's own content (a template without reasoning support) is no block."""
    if not reply.startswith(THINK_OPEN) or content.startswith(THINK_OPEN) or THINK_CLOSE not in reply:
        return ""
    end = reply.index(THINK_CLOSE) + len(THINK_CLOSE)
    while end < len(reply) and reply[end] in "\r\n":
        end += 1
    return reply[:end]
