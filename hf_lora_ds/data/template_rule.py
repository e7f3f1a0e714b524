"""The supervised character spans of a chat, derived from the template itself (see ``hf_lora_ds.data.dataset``).

For assistant turn i, the conversation rendered up to turn i with the generation prompt must be a prefix of the
conversation rendered through turn i, and what lies between is the trained reply: the think block a thinking
template writes (trained or not, ``hf_lora_ds.data.thinking``), the content (or the tool calls as the template writes
them), and the end-of-turn special token. ``prefix_samples`` is that rule, rendering per turn; ``hf_lora_ds.data.skeleton``
gives its answer from fewer renders where it can prove it the same; ``hf_lora_ds.data.labels`` turns spans into labels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

from hf_lora_ds.data.thinking import ThinkingOptions, think_block
from hf_lora_ds.errors import UserError

__all__ = [
    "AssistantTurns",
    "IGNORE_INDEX",
    "TrainingText",
    "TemplateError",
    "TurnRules",
    "render_samples",
    "prefix_samples",
    "render",
    "trained_turns",
    "reply_spans",
    "token_difference",
]

IGNORE_INDEX = -100
AssistantTurns = Literal["all", "last"]


class TemplateError(UserError):
    """The chat template renders conversations in a way that no exact assistant mask can be derived from."""


@dataclass(frozen=True)
class TrainingText:
    """One training text, the character spans trained in it, and the assistant turns (message indices) they belong
    to."""

    text: str
    spans: list[tuple[int, int]]
    turns: list[int]


@dataclass(frozen=True)
class TurnRules:
    """What the label rule reads besides the rendered text: the tokenizer, the thinking options and the tokenizer's
    special and added tokens, which are slow to list, so they are listed once per dataset rather than once a turn."""

    tokenizer: PreTrainedTokenizerBase
    thinking: ThinkingOptions
    end_of_turn: re.Pattern  # any added or special token, the longest first: an end-of-turn token is one of them
    special_tokens: tuple[str, ...]

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, thinking: ThinkingOptions | None = None) -> TurnRules:
        specials = tuple(tokenizer.all_special_tokens)
        ends = sorted(set(tokenizer.get_added_vocab()) | set(specials), key=len, reverse=True)
        any_end = "|".join(map(re.escape, ends)) or "(?!)"  # (?!) matches nothing: no token, no end of turn
        return cls(tokenizer, thinking or ThinkingOptions(), re.compile(any_end), specials)


def render_samples(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    assistant_turns: AssistantTurns = "all",
    tools: list[dict] | None = None,
    thinking: ThinkingOptions | None = None,
) -> list[TrainingText]:
    """Render ``messages`` (with ``tools``, if any) as the training texts of their trained assistant turns.

    Each turn is trained in the text the template writes for the conversation up to it, so the model learns it
    after exactly the prompt it gets at inference. One text serves every turn whose rendering it contains; a template
    that renders a turn differently once the conversation goes on (Qwen3 drops earlier turns' reasoning) gives that
    turn a text of its own, ending with it, in conversation order.
    """
    return prefix_samples(TurnRules.of(tokenizer, thinking), messages, assistant_turns, tools)


def trained_turns(messages: list[dict[str, Any]], assistant_turns: AssistantTurns) -> list[int]:
    """The message indices of the assistant turns that are trained."""
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return turns[-1:] if assistant_turns == "last" else turns


def prefix_samples(
    rules: TurnRules, messages: list[dict[str, Any]], assistant_turns: AssistantTurns, tools: list[dict] | None
) -> list[TrainingText]:
    """``render_samples`` by the prefix rule itself: the reference, and the fallback of ``hf_lora_ds.data.skeleton``.

    It renders each trained turn's prompt and the conversation through it (a few renders per turn); the located
    path renders the conversation once and must give exactly what this gives."""
    tokenizer = rules.tokenizer
    pending = trained_turns(messages, assistant_turns)
    samples: list[TrainingText] = []
    text, end = render(tokenizer, messages, tools=tools), len(messages)  # text renders messages[:end]
    while pending:
        anchor = pending[-1]
        if samples:  # the turns left are rendered differently in the longer text: this text ends with them
            end = anchor + 1
            text = render(tokenizer, messages[:end], tools=tools)
        spans, trained, left = [], [], []
        for i in pending:
            turn_spans = _turn_spans(rules, messages, i, (text, end), tools)
            if turn_spans is None:
                left.append(i)
            else:
                spans += turn_spans
                trained.append(i)
        if anchor not in trained:
            prompt = render(tokenizer, messages[:anchor], add_generation_prompt=True, tools=tools)
            raise TemplateError(
                f"the chat template's generation prompt is not a prefix of assistant turn {anchor} as it renders it "
                f"({token_difference(tokenizer, _ids(tokenizer, prompt), _ids(tokenizer, text), 'rendered turn')}), "
                "so the turn's tokens cannot be located exactly; use a template whose generation prompt starts the "
                "assistant turn it writes"
            )
        samples.append(TrainingText(text, spans, trained))
        pending = left
    return samples[::-1]


def token_difference(tokenizer: PreTrainedTokenizerBase, prompt: list[int], text: list[int], name: str) -> str:
    """Where a prompt's tokens first differ from a text's: the index and a few tokens of each, decoded."""
    k = next((j for j, (a, b) in enumerate(zip(prompt, text)) if a != b), min(len(prompt), len(text)))

    def tokens(ids: list[int]) -> list[str]:
        return [tokenizer.decode([t]) for t in ids[k : k + 4]]

    return f"token {k}: prompt {tokens(prompt)} vs {name} {tokens(text)}"


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _turn_spans(
    rules: TurnRules, messages: list[dict[str, Any]], i: int, rendered: tuple[str, int], tools: list[dict] | None
) -> list[tuple[int, int]] | None:
    """The spans of ``text`` (the rendering of ``messages[:end]``, given as ``rendered``) that train assistant turn
    ``i``: its think block (if trained), its answer and its end-of-turn token; None when ``text`` does not hold the
    turn as the template renders it last."""
    text, end = rendered
    prompt = render(rules.tokenizer, messages[:i], add_generation_prompt=True, tools=tools)
    # The conversation through the text's last message is the text itself, already rendered.
    through = text if i + 1 == end else render(rules.tokenizer, messages[: i + 1], tools=tools)
    if not (through.startswith(prompt) and text.startswith(through)):
        return None
    return reply_spans(rules, messages[i], i, text, (len(prompt), len(through)))


def reply_spans(
    rules: TurnRules, message: dict[str, Any], i: int, text: str, reply: tuple[int, int]
) -> list[tuple[int, int]]:
    """The trained spans of assistant turn ``i`` (``message``), whose reply is ``text[start:stop]`` (``reply``): the
    rendered turn after its prompt, through the end of the conversation rendered through it. Located by the prefix
    rule or by ``hf_lora_ds.data.skeleton``; the checks on what the template wrote are the same for both."""
    start, stop = reply
    written = text[start:stop]
    block = think_block(written, message["content"])
    reasoning = message.get("reasoning_content")
    if reasoning and reasoning.strip() not in block:
        raise TemplateError(
            f"the chat template does not render the reasoning (reasoning_content) of assistant turn {i}; use a "
            "thinking model's template (Qwen3's), or put the reasoning into the content to train it as written"
        )
    body = written[len(block) :]
    content = message["content"].lstrip("\n") if block else message["content"]
    if not body.startswith(content):
        raise TemplateError(
            f"the chat template changes the content of assistant turn {i} (rendered {body[:60]!r}, "
            f"expected it to start with {content[:60]!r}); strip or normalise the content in your data first"
        )
    calls = message.get("tool_calls")
    if calls:
        answer = _tool_call_reply(rules, body, calls, i)
    else:
        answer = content + _end_of_turn_after(rules, body[len(content) :])
    end = start + len(block) + len(answer)
    return [(start if not block or rules.thinking.trains(block) else start + len(block), end)]


def _tool_call_reply(rules: TurnRules, reply: str, calls: list[dict], turn: int) -> str:
    """The trained part of an assistant turn with tool calls: the reply up to its end-of-turn token, inclusive.

    The template serialises the calls its own way (``<tool_call>`` JSON for Qwen2.5), so what the model must learn
    to write is whatever it rendered; a template that drops the calls (one without tool support) is refused.
    """
    body = reply.rstrip()
    # Special tokens only: Qwen2.5's <tool_call>/</tool_call> are added (non-special) tokens and end no turn.
    if not any(body.endswith(token) for token in rules.special_tokens):
        raise TemplateError(
            f"the chat template ends the tool calls of assistant turn {turn} with {body[-30:]!r} instead of an "
            "end-of-turn special token; the model would never learn to stop"
        )
    for call in calls:
        name = call["function"]["name"]
        if name not in body:
            raise TemplateError(
                f"the chat template does not render the tool call {name!r} of assistant turn {turn}; use a model "
                "whose chat template supports tools (Qwen2.5's does)"
            )
    return body


def render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
) -> str:
    """The template's text for ``messages``, rendered the one way every path here renders it."""
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _end_of_turn_after(rules: TurnRules, rest: str) -> str:
    """The special token the template puts right after an assistant message (``<|im_end|>``, ``<|eot_id|>``...)."""
    if found := rules.end_of_turn.match(rest):
        return found.group()
    raise TemplateError(
        f"the chat template puts {rest[:30]!r} after the assistant content instead of an end-of-turn special token; "
        "the model would never learn to stop"
    )
