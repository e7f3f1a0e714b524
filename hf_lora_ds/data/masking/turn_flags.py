"""Per-turn and per-span training flags, in each framework's spelling, honoured exactly by the labels.

Every peer lets a record say which turns are learnt, each in its own words (axolotl's ``train`` and ``train_detail``,
OpenAI's ``weight``, LLaMA-Factory's ``loss_weight``, ms-swift's ``loss`` and ``loss_scale``); all are read here.
Weights are 0 or 1: the loss is a plain mean, so a fractional weight is refused rather than rounded. A user turn is
trained where axolotl or ms-swift would train it (``train`` / ``loss`` true, or ``train_detail`` spans; located by
``hf_lora_ds.data.masking.user_turns``); OpenAI and LLaMA-Factory read their weights on assistant turns only.
Switched-off characters inside a located turn become a ``TextMask`` applied after tokenizing, only for texts that have
one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hf_lora_ds.data.masking.template_rule import IGNORE_INDEX, AssistantTurns, TemplateError, TrainingText
from hf_lora_ds.data.records import DataError

__all__ = [
    "FLAG_KEYS",
    "DETAIL_KEY",
    "TextMask",
    "TurnPlan",
    "message_flag",
    "train_detail",
    "plan_turns",
    "text_mask",
    "mask_labels",
]

# Message keys that switch a turn's training: axolotl, OpenAI, LLaMA-Factory v1, ms-swift (loss_scale and loss).
FLAG_KEYS = ("train", "weight", "loss_weight", "loss_scale", "loss")
USER_FLAG_KEYS = ("train", "loss")  # the keys whose frameworks train a user turn they switch on (axolotl, ms-swift)
TRAINABLE_ROLES = ("assistant", "user")
DETAIL_KEY = "train_detail"
Span = tuple[int, int]


def message_flag(message: dict, role: str, where: str, name: str) -> bool | None:
    """Whether the message says it is trained (True), not trained (False), or says nothing (None)."""
    said: dict[str, bool] = {}
    for key in FLAG_KEYS:
        value = message.get(key)
        if value is not None:
            said[key] = _flag_value(value, key, where, name)
    if len(set(said.values())) > 1:
        keys = ", ".join(f"{key}={message[key]!r}" for key in said)
        raise DataError(f"{where}: field '{name}': contradictory training flags ({keys})")
    flag = next(iter(said.values()), None)
    # A user turn is trained by the keys of the frameworks that train one (axolotl, ms-swift); OpenAI's weight and
    # LLaMA-Factory's loss_weight are read on assistant turns only, so switching a user turn on with them is refused.
    if flag and role != "assistant":
        if refused := [key for key in said if role != "user" or key not in USER_FLAG_KEYS]:
            raise DataError(
                f"{where}: field '{name}.{refused[0]}': a {role} turn cannot be trained by {refused[0]} (assistant "
                "turns are, and user turns by axolotl's train or ms-swift's loss); drop the flag or set it to false / 0"
            )
    return flag


def _flag_value(value: Any, key: str, where: str, name: str) -> bool:
    if key in ("train", "loss"):
        if not isinstance(value, bool):
            raise DataError(f"{where}: field '{name}.{key}' must be true or false, got {value!r:.40}")
        return value
    if isinstance(value, (bool, int, float)) and value in (0, 1):
        return bool(value)
    raise DataError(
        f"{where}: field '{name}.{key}' is {value!r:.40}: only 0 (not trained) or 1 (trained) is supported; this "
        "package trains an unweighted loss, so a fractional weight would not be honoured"
    )


def train_detail(message: dict, content: str, role: str, where: str, name: str) -> list[tuple[int, int, bool]] | None:
    """axolotl's ``train_detail`` of a message as ``(begin, end, train)`` content spans, ``end`` exclusive."""
    detail = message.get(DETAIL_KEY)
    if detail is None:
        return None
    label = f"{name}.{DETAIL_KEY}"
    if not isinstance(detail, list):
        raise DataError(f"{where}: field '{label}' must be a list of {{begin_offset, end_offset, train}} objects")
    spans = []
    for k, item in enumerate(detail):
        at = f"{label}[{k}]"
        if not isinstance(item, dict):
            raise DataError(f"{where}: field '{at}' must be an object with begin_offset, end_offset and train")
        begin, end, train = item.get("begin_offset"), item.get("end_offset"), item.get("train")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (begin, end)) or not isinstance(train, bool):
            raise DataError(f"{where}: field '{at}' needs integer begin_offset and end_offset and a boolean train")
        if not 0 <= begin <= end < len(content):
            raise DataError(
                f"{where}: field '{at}': offsets {begin}-{end} (inclusive) are outside the content's "
                f"{len(content)} characters"
            )
        spans.append((begin, end + 1, train))
    spans.sort()
    for (_, end, _), (begin, _, _) in zip(spans, spans[1:]):
        if begin < end:
            raise DataError(f"{where}: field '{label}': spans overlap (at character {begin}); give each character once")
    if role not in TRAINABLE_ROLES and any(train for _, _, train in spans):
        raise DataError(
            f"{where}: field '{label}': a {role} turn cannot be trained here (only assistant and user turns are)"
        )
    return spans if role in TRAINABLE_ROLES else None


@dataclass(frozen=True)
class TurnPlan:
    """Which turns a conversation trains: ``located`` (the assistant turns the template rule finds, in order),
    ``users`` (the user turns the flags train, located after them), the flag-decided state of each assistant turn
    and of those user turns, and what the flags changed against the defaults (which train no user turn)."""

    located: list[int]
    trained: dict[int, bool]
    default: frozenset[int]
    detail: dict[int, list[tuple[int, int, bool]]] = field(default_factory=dict)
    users: list[int] = field(default_factory=list)

    @property
    def switched_off(self) -> int:
        return sum(1 for i in self.default if not self.trained[i])

    @property
    def switched_on(self) -> int:
        return sum(1 for i, on in self.trained.items() if on and i not in self.default)


def plan_turns(conversation: dict[str, Any], assistant_turns: AssistantTurns, where: str) -> TurnPlan | None:
    """The conversation's trained turns where flags or a TRL prompt decide them; None when ``assistant_turns`` alone
    does (the common case: the template rule picks the turns itself).

    A turn's flag, where it has one, wins over ``--assistant_turns``; only assistant turns can be trained (a flag that
    would train another role is refused); ``train_detail`` spans (character offsets, both ends inclusive as axolotl
    counts them) override the turn's flag, and a token follows the span its first character lies in."""
    flags, detail = conversation.get("flags") or {}, conversation.get("detail") or {}
    start = conversation.get("completion_from", 0)
    if not (flags or detail or start):
        return None
    roles = [m["role"] for m in conversation["messages"]]
    assistants = [i for i, role in enumerate(roles) if role == "assistant"]
    eligible = [i for i in assistants if i >= start]
    default = frozenset(eligible[-1:] if assistant_turns == "last" else eligible)
    trained = {i: flags.get(i, i in default) for i in assistants}
    spans_on = {i for i, spans in detail.items() if any(on for _, _, on in spans)}
    located = [i for i in assistants if trained[i] or i in spans_on]
    users = [i for i, role in enumerate(roles) if role == "user" and (flags.get(i) or i in spans_on)]
    if not (located or users):
        raise DataError(f"{where}: no turn is trained (the record's training flags switch every assistant turn off)")
    trained |= {i: flags.get(i, False) for i in users}
    return TurnPlan(located, trained, default, {i: detail[i] for i in located + users if i in detail}, users)


@dataclass(frozen=True)
class TextMask:
    """Characters of a training text inside its located turns: ``off`` are not trained, ``on`` are trained parts
    of turns the defaults would not train (counted by the audit)."""

    off: list[Span]
    on: list[Span]


def text_mask(plan: TurnPlan, sample: TrainingText, messages: list[dict[str, Any]]) -> TextMask | None:
    """The mask of one training text, or None when the flags leave each of its located turns whole."""
    if len(sample.spans) != len(sample.turns):
        raise TemplateError("a trained turn was located as several spans; training flags cannot be applied to it")
    off, on = [], []
    for (start, end), turn in zip(sample.spans, sample.turns):
        state = plan.trained[turn]
        pieces = [(start, end, state)]
        if turn in plan.detail:
            at = _content_at(sample.text, messages[turn]["content"], (start, end), turn)
            pieces = _override([(start, end, state)], [(at + b, at + e, t) for b, e, t in plan.detail[turn]])
        off += [(a, b) for a, b, trained in pieces if not trained]
        if turn not in plan.default:
            on += [(a, b) for a, b, trained in pieces if trained]
    return TextMask(off, on) if off or on else None


def _content_at(text: str, content: str, span: Span, turn: int) -> int:
    """Where the turn's content stands in its span: the offsets of ``train_detail`` count from there."""
    at = text.rfind(content, *span)
    if at < 0:
        raise TemplateError(
            f"train_detail of assistant turn {turn}: the chat template does not write the content as the record "
            "gives it, so its character offsets cannot be placed"
        )
    return at


def _override(base: list[tuple[int, int, bool]], spans: list[tuple[int, int, bool]]) -> list[tuple[int, int, bool]]:
    """``base`` pieces with ``spans`` (sorted, disjoint, inside them) written over them."""
    ((start, end, state),) = base
    pieces, at = [], start
    for begin, stop, train in spans:
        if begin > at:
            pieces.append((at, begin, state))
        pieces.append((begin, stop, train))
        at = stop
    if at < end:
        pieces.append((at, end, state))
    return pieces


def mask_labels(
    labels: np.ndarray,
    lengths: np.ndarray,
    offsets: Sequence[Sequence[tuple[int, int]]],
    masks: Sequence[TextMask | None],
) -> tuple[np.ndarray, np.ndarray]:
    """Labels with each masked text's ``off`` tokens set to -100 (a token follows its first character), and per
    text the tokens masked that way and the tokens its ``on`` characters train."""
    labels = labels.copy()
    counts = np.zeros((len(masks), 2), dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    for k, mask in enumerate(masks):
        if mask is None:
            continue
        first = np.fromiter((start for start, _ in offsets[k]), dtype=np.int64, count=int(lengths[k]))
        rows = labels[starts[k] : starts[k] + lengths[k]]  # a view: written through
        trained = rows != IGNORE_INDEX
        switched = _inside(first, mask.off) & trained
        rows[switched] = IGNORE_INDEX
        counts[k] = switched.sum(), (_inside(first, mask.on) & (rows != IGNORE_INDEX)).sum()
    return labels, counts


def _inside(points: np.ndarray, spans: list[Span]) -> np.ndarray:
    inside = np.zeros(len(points), dtype=bool)
    for start, end in spans:
        inside |= (points >= start) & (points < end)
    return inside
