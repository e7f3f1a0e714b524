"""The prefix rule's samples without its renders: located in a rendering of the conversation's roles.

The prefix rule (hf_lora_ds.data.masking.template_rule.prefix_samples) renders each conversation once per trained turn,
a few times the cost of tokenizing it. A template blind to the contents (hf_lora_ds.data.masking.template_blindness)
renders any conversation of the same roles as the same text around them, so the rule runs once per shape, on stand-in
contents, and each conversation's replies are located by shifting the skeleton's. The first conversation of each shape
in a batch is still rendered for real as a check; whatever the skeleton cannot locate (tools, reasoning, a template that
is not blind, any error) goes through the prefix rule itself.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_lora_ds.data.masking.template_blindness import content_blind
from hf_lora_ds.data.masking.template_rule import (
    AssistantTurns,
    TemplateError,
    TrainingText,
    TurnRules,
    render_record,
    reply_spans,
    trained_turns,
)

__all__ = ["Locator"]

_STAND_IN = "\ue000{}\ue001"  # private-use characters around the message index: no template writes them itself
_STAND_INS = re.compile("\ue000(\\d+)\ue001")
Place = tuple[int, int]  # (piece, offset in it) of a skeleton position that lies outside every stand-in
_PLAIN_KEYS = frozenset(("role", "content"))  # a message with nothing a template could read besides its text
Shape = tuple[str, ...]  # the roles of a conversation's messages (and the turns it trains, where a record chose them)


@dataclass(frozen=True)
class _Skeleton:
    """A shape's rendering with stand-ins: the text between them, whose content stands after each piece, and the
    places of each trained turn's reply start and end."""

    pieces: tuple[str, ...]
    order: tuple[int, ...]  # order[k]: the message whose content is written between pieces[k] and pieces[k + 1]
    turns: tuple[int, ...]
    replies: tuple[tuple[Place, Place], ...]

    def fill(self, contents: Sequence[str]) -> tuple[str, list[int]]:
        """The text with ``contents`` in place of the stand-ins, and where each piece starts in it."""
        parts, starts, at = [], [], 0
        for k, piece in enumerate(self.pieces):
            starts.append(at)
            parts.append(piece)
            at += len(piece)
            if k < len(self.order):
                parts.append(contents[self.order[k]])
                at += len(parts[-1])
        return "".join(parts), starts


class Locator:
    """Samples located in their shape's skeleton, where that is proven to be the prefix rule's answer."""

    def __init__(self, rules: TurnRules, assistant_turns: AssistantTurns):
        self.rules = rules
        self.assistant_turns = assistant_turns
        # A template that writes no token after a final turn gets one appended by the rule: not a plain render.
        self.blind = content_blind(rules.tokenizer.get_chat_template()) and rules.traits.turn_closers is None
        self.thinking = rules.thinking_on({})  # plain turns (no reasoning) are all prompted alike
        self._skeletons: dict[Shape, _Skeleton | None] = {}

    def samples(self, conversations: Sequence[dict[str, Any]]) -> list[list[TrainingText] | None]:
        """Each conversation's samples, or None where the prefix rule must give them."""
        shapes = [self._shape(conversation) for conversation in conversations]
        self._check_renders(conversations, shapes)
        return [
            None
            if shape is None or self._skeletons[shape] is None
            else self._located(self._skeletons[shape], conversation["messages"])
            for conversation, shape in zip(conversations, shapes)
        ]

    def _shape(self, conversation: dict[str, Any]) -> Shape | None:
        """The conversation's shape, its skeleton built on first sight; None when no skeleton can stand for it."""
        messages = conversation["messages"]
        plain = all(m.keys() == _PLAIN_KEYS and isinstance(m["content"], str) and m["content"] for m in messages)
        if not (self.blind and plain and not conversation["tools"]):
            return None  # tools, tool calls and reasoning are read by templates; an empty content tests false
        turns = conversation.get("turns")  # trained turns that a record's flags chose, part of the shape
        shape = (*(m["role"] for m in messages), *(() if turns is None else ("turns", *map(str, turns))))
        if shape not in self._skeletons:
            self._skeletons[shape] = self._build(shape[: len(messages)], turns)
        return shape

    def _check_renders(self, conversations: Sequence[dict[str, Any]], shapes: list[Shape | None]) -> None:
        """Render the first conversation of each located shape for real; a shape whose skeleton, filled in, is not
        that text goes back to the prefix rule for good."""
        firsts: dict[Shape, int] = {}
        for k, shape in enumerate(shapes):
            if shape is not None and self._skeletons[shape] is not None:
                firsts.setdefault(shape, k)
        if not firsts:
            return
        try:
            texts = self.rules.tokenizer.apply_chat_template(
                [conversations[k]["messages"] for k in firsts.values()], tokenize=False, enable_thinking=self.thinking
            )
        except Exception:  # a template error: the prefix rule raises it, after any error of an earlier conversation
            texts = [None] * len(firsts)
        for (shape, k), text in zip(firsts.items(), texts):
            if self._skeletons[shape].fill([m["content"] for m in conversations[k]["messages"]])[0] != text:
                self._skeletons[shape] = None

    def _build(self, shape: Shape, chosen: list[int] | None) -> _Skeleton | None:
        """The prefix rule's renders of the shape with stand-ins, training the ``chosen`` turns (None: those of
        ``assistant_turns``); None when its turns are not all in one text."""
        tokenizer = self.rules.tokenizer
        stand_ins = [{"role": role, "content": _STAND_IN.format(j)} for j, role in enumerate(shape)]
        turns = trained_turns(stand_ins, self.assistant_turns if chosen is None else chosen)
        try:
            text = render_record(tokenizer, stand_ins, enable_thinking=self.thinking)
            parts = _STAND_INS.split(text)
            pieces, order = tuple(parts[0::2]), tuple(int(j) for j in parts[1::2])
            replies = []
            for i in turns:
                prompt = render_record(
                    tokenizer, stand_ins[:i], add_generation_prompt=True, enable_thinking=self.thinking
                )
                if i + 1 == len(shape):
                    through = text
                else:
                    through = render_record(tokenizer, stand_ins[: i + 1], enable_thinking=self.thinking)
                if not (through.startswith(prompt) and text.startswith(through)):
                    return None
                replies.append((_place(pieces, order, len(prompt)), _place(pieces, order, len(through))))
        except Exception:  # the template fails on these roles: the prefix rule says how, with the real contents
            return None
        if not turns or max(order, default=0) >= len(shape) or None in (p for reply in replies for p in reply):
            return None
        return _Skeleton(pieces, order, tuple(turns), tuple(replies))

    def _located(self, skeleton: _Skeleton, messages: list[dict[str, Any]]) -> list[TrainingText] | None:
        """The conversation's one sample: its skeleton filled in, the replies' spans checked as the prefix rule
        checks them; None if a check fails (the prefix rule then raises its error)."""
        text, starts = skeleton.fill([m["content"] for m in messages])
        spans = []
        try:
            for turn, ((start_piece, start), (stop_piece, stop)) in zip(skeleton.turns, skeleton.replies):
                reply = (starts[start_piece] + start, starts[stop_piece] + stop)
                spans += reply_spans(self.rules, messages[turn], turn, text, reply)
        except TemplateError:
            return None
        return [TrainingText(text, spans, list(skeleton.turns))]


def _place(pieces: Sequence[str], order: Sequence[int], position: int) -> Place | None:
    """Where ``position`` of the skeleton text lies: (piece, offset), or None inside a stand-in."""
    at = 0
    for k, piece in enumerate(pieces):
        if position <= at + len(piece):
            return k, position - at
        if k == len(order):
            break
        at += len(piece) + len(_STAND_IN.format(order[k]))
        if position < at:
            return None
    return None
