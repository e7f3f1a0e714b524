"""The supervised character spans of a chat, derived from the template as inference uses it.

Assistant turn i is trained on what the model must generate after the prompt inference gives it: the text
``apply_chat_template(messages[:i], add_generation_prompt=True, enable_thinking=...)`` is followed, in its training
text, by whatever the template writes for the turn after that prompt, through its end-of-turn token: a think block's
reasoning and close (trained or not, ``hf_lora_ds.data.masking.thinking``), channel headers and wrappers, the content
(or the tool calls as the template writes them) and the end-of-turn special token, checked to contain the content and
the reasoning. ``enable_thinking`` is on for a turn with reasoning (and for every turn with ``empty_think="train"``),
off otherwise, as a thinking model is prompted for each. Where the template's history drops a think block its
generation prompt opens (DeepSeek-R1), the reply is what the model generates after that prompt: the reasoning, the
block's close, the answer. ``prefix_samples`` is that rule, rendering per turn; ``hf_lora_ds.data.masking.skeleton``
gives its answer from fewer renders where it can prove it the same; ``hf_lora_ds.data.tokens.labels`` turns spans into
labels.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from transformers import PreTrainedTokenizerBase

from hf_lora_ds.data.masking.template_probes import TemplateTraits, apply_template, closing_tag, probe_template
from hf_lora_ds.data.masking.thinking import ThinkingOptions
from hf_lora_ds.errors import UserError

__all__ = [
    "AssistantTurns",
    "IGNORE_INDEX",
    "TrainingText",
    "TemplateError",
    "TurnRules",
    "render_samples",
    "prefix_samples",
    "render_record",
    "trained_turns",
    "reply_spans",
    "token_difference",
    "spaced_end_of_turn",
    "end_of_turn_run",
]

IGNORE_INDEX = -100  # the label of a token not trained (transformers' loss ignores it); its one definition
_SPACE = re.compile(r"\s*")
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
    """What the label rule reads besides the rendered text: the tokenizer, the thinking options, the tokenizer's
    special and added tokens (slow to list) and the template's probed traits, found once per dataset rather than
    once a turn."""

    tokenizer: PreTrainedTokenizerBase
    thinking: ThinkingOptions
    end_of_turn: re.Pattern  # any added or special token, the longest first: an end-of-turn token is one of them
    special_tokens: tuple[str, ...]
    traits: TemplateTraits
    empty_block: re.Pattern  # an empty think block, or its close alone where the prompt opened it, with whitespace

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase, thinking: ThinkingOptions | None = None) -> TurnRules:
        specials = tuple(tokenizer.all_special_tokens)
        ends = sorted(set(tokenizer.get_added_vocab()) | set(specials), key=len, reverse=True)
        any_end = "|".join(map(re.escape, ends)) or "(?!)"  # (?!) matches nothing: no token, no end of turn
        traits = probe_template(tokenizer, specials)
        tag = traits.think_open or "<think>"
        empty = re.compile(rf"(?:{re.escape(tag)})?\s*{re.escape(closing_tag(tag))}\s*")
        return cls(tokenizer, thinking or ThinkingOptions(), re.compile(any_end), specials, traits, empty)

    def thinking_on(self, message: dict[str, Any]) -> bool:
        """``enable_thinking`` for the prompt of assistant turn ``message``: on for a turn with reasoning, and for
        one without when its empty think block is a target (the model learns to close the block itself)."""
        return bool(message.get("reasoning_content")) or self.thinking.empty_think == "train"


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


def trained_turns(messages: list[dict[str, Any]], assistant_turns: AssistantTurns | Sequence[int]) -> list[int]:
    """The message indices of the assistant turns that are trained: ``assistant_turns`` itself where it lists them
    (a record's training flags decided them, ``hf_lora_ds.data.masking.turn_flags``)."""
    if not isinstance(assistant_turns, str):
        return sorted(assistant_turns)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return turns[-1:] if assistant_turns == "last" else turns


def prefix_samples(
    rules: TurnRules,
    messages: list[dict[str, Any]],
    assistant_turns: AssistantTurns | Sequence[int],
    tools: list[dict] | None,
) -> list[TrainingText]:
    """``render_samples`` by the rule itself: the reference, and the fallback of ``hf_lora_ds.data.masking.skeleton``.

    It renders each trained turn's prompt and the conversation through it (a few renders per turn); the located
    path renders the conversation once and must give exactly what this gives."""
    pending = trained_turns(messages, assistant_turns)
    samples: list[TrainingText] = []
    end = len(messages)  # the first text renders the whole conversation; later ones end with their turn
    while pending:
        anchor = pending[-1]
        thinking = rules.thinking_on(messages[anchor])
        text = render_through(rules, messages, end, tools, thinking)
        spans = _turn_spans(rules, messages, anchor, (text, end, thinking), tools)
        if spans is None:
            end, text = anchor + 1, _generated_text(rules, messages, anchor, tools, thinking)
            spans = _turn_spans(rules, messages, anchor, (text, end, thinking), tools)
        if spans is None and (moved := _moved_system_text(rules, messages, anchor, tools, thinking)):
            text, reply = moved
            spans = reply_spans(rules, messages[anchor], anchor, text, reply)
        if spans is None:
            _refuse_unrendered_calls(rules, messages, anchor, tools, thinking)
            prompt = _ids(rules.tokenizer, render_record(rules.tokenizer, messages[:anchor], True, tools, thinking))
            difference = token_difference(rules.tokenizer, prompt, _ids(rules.tokenizer, text), "rendered turn")
            raise TemplateError(
                f"the chat template's generation prompt is not a prefix of assistant turn {anchor} as it renders it "
                f"({difference}), "
                "so the turn's tokens cannot be located exactly; use a template whose generation prompt starts the "
                "assistant turn it writes"
            )
        trained, left = [anchor], []
        for i in pending[:-1]:
            turn_spans = None
            if rules.thinking_on(messages[i]) == thinking:
                turn_spans = _turn_spans(rules, messages, i, (text, end, thinking), tools)
            if turn_spans is None:
                left.append(i)
            else:
                spans += turn_spans
                trained.append(i)
        samples.append(TrainingText(text, sorted(spans), sorted(trained)))
        pending, end = left, (left[-1] + 1 if left else end)
    return samples[::-1]


def render_through(
    rules: TurnRules, messages: list[dict[str, Any]], end: int, tools: list[dict] | None, thinking: bool
) -> str:
    """``messages[:end]`` rendered; for a template that writes no token after a final assistant turn (GLM), with
    the special token it writes there when the conversation goes on (its stop token, or eos), so the model learns to
    stop; for one that appends its thinking-off marker to whatever it renders (Hunyuan), the last turn as inference
    meets it (``_reply_after_prompt``)."""
    if rules.traits.off_suffix is not None and messages[end - 1]["role"] == "assistant":
        return _reply_after_prompt(rules, messages, end, tools, thinking)
    text = render_record(rules.tokenizer, messages[:end], tools=tools, enable_thinking=thinking)
    closers = rules.traits.turn_closers
    if closers is None or messages[end - 1]["role"] != "assistant":
        return text
    following = messages[end]["role"] if end < len(messages) else "user"
    return text + closers.get(following, closers.get("user", ""))


def _reply_after_prompt(
    rules: TurnRules, messages: list[dict[str, Any]], end: int, tools: list[dict] | None, thinking: bool
) -> str:
    """The conversation through assistant turn ``end - 1`` for a template that appends its thinking-off marker to
    every rendering (Hunyuan's empty ``<think>`` block, after a finished turn too): the turn's inference prompt, which
    ends with the marker where thinking is off, then the turn as the template writes it after its thinking-on prompt,
    which never holds the marker; where the model writes the think block itself (``reply_block``), the turn's
    reasoning in it first."""
    tokenizer, i = rules.tokenizer, end - 1
    prompt = render_record(tokenizer, messages[:i], add_generation_prompt=True, tools=tools, enable_thinking=thinking)
    bare = render_record(tokenizer, messages[:i], add_generation_prompt=True, tools=tools, enable_thinking=True)
    through = render_record(tokenizer, messages[:end], tools=tools, enable_thinking=True)
    if not through.startswith(bare):
        return render_record(tokenizer, messages[:end], tools=tools, enable_thinking=thinking)  # the rule says why
    block = ""
    if thinking and rules.traits.reply_block is not None:
        reasoning = (messages[i].get("reasoning_content") or "").strip()
        block = rules.traits.reply_block + reasoning + rules.traits.close
    return prompt + block + through[len(bare) :]


def _generated_text(
    rules: TurnRules, messages: list[dict[str, Any]], i: int, tools: list[dict] | None, thinking: bool
) -> str:
    """The training text of assistant turn ``i`` whose generation prompt opens a think block that the history,
    rendered through the turn, does not write as the prompt opened it (DeepSeek-R1 drops it, Nemotron 3 writes an
    empty one as ``<think></think>``): the prompt, then what the model generates after it, the reasoning, the
    block's close, and the turn as the template writes it after its block. Otherwise the rendered turn itself."""
    through = render_through(rules, messages, i + 1, tools, thinking)
    prompt = render_record(
        rules.tokenizer, messages[:i], add_generation_prompt=True, tools=tools, enable_thinking=thinking
    )
    tag, close = rules.traits.think_open, rules.traits.close
    opened = re.search(re.escape(tag) + r"\s*$", prompt) if tag and close else None
    if opened is None or through.startswith(prompt) or not through.startswith(prompt[: opened.start()]):
        return through
    rest = through[opened.start() :]
    if written := re.match(re.escape(tag) + r"\s*" + re.escape(closing_tag(tag)) + r"\s*", rest):
        rest = rest[written.end() :]  # the history's empty block, in its own spelling
    elif rest.startswith(tag):
        return through  # the history writes a block of its own: the rule reports what differs
    return prompt + (messages[i].get("reasoning_content") or "").strip() + close + rest


def _moved_system_text(
    rules: TurnRules, messages: list[dict[str, Any]], i: int, tools: list[dict] | None, thinking: bool
) -> tuple[str, tuple[int, int]] | None:
    """The training text of assistant turn ``i`` and its reply's bounds, for a template that writes the system
    prompt only into the last message's user turn (Mistral v0.3, Mistral-Nemo): the turn's inference prompt, which
    carries the system prompt, then the reply as the template writes it once the turn is written, when the system
    prompt is gone from the history. None unless the conversation through the turn renders exactly as it does
    without its system message (so the template dropped it there) and that rendering starts with the bare prompt."""
    if messages[0]["role"] != "system" or i < 2:
        return None
    tokenizer, bare = rules.tokenizer, messages[1:]
    through = render_through(rules, messages, i + 1, tools, thinking)
    bare_prompt = render_record(
        tokenizer, bare[: i - 1], add_generation_prompt=True, tools=tools, enable_thinking=thinking
    )
    if through != render_through(rules, bare, i, tools, thinking) or not through.startswith(bare_prompt):
        return None
    prompt = render_record(tokenizer, messages[:i], add_generation_prompt=True, tools=tools, enable_thinking=thinking)
    reply = through[len(bare_prompt) :]
    return prompt + reply, (len(prompt), len(prompt) + len(reply))


def _refuse_unrendered_calls(
    rules: TurnRules, messages: list[dict[str, Any]], i: int, tools: list[dict] | None, thinking: bool
) -> None:
    """Name a tool call the template does not write (GLM-4 skips a turn with no content whole), rather than the
    prompt mismatch that follows from it."""
    history = render_record(rules.tokenizer, messages[:i], tools=tools, enable_thinking=thinking)
    through = render_record(rules.tokenizer, messages[: i + 1], tools=tools, enable_thinking=thinking)
    for call in messages[i].get("tool_calls") or []:
        name = call["function"]["name"]
        if through.count(name) <= history.count(name):
            raise TemplateError(
                f"the chat template does not render the tool call {name!r} of assistant turn {i}; use a model "
                "whose chat template supports tools (Qwen2.5's does)"
            )


def token_difference(tokenizer: PreTrainedTokenizerBase, prompt: list[int], text: list[int], name: str) -> str:
    """Where a prompt's tokens first differ from a text's: the index and a few tokens of each, decoded."""
    k = next((j for j, (a, b) in enumerate(zip(prompt, text)) if a != b), min(len(prompt), len(text)))

    def tokens(ids: list[int]) -> list[str]:
        return [tokenizer.decode([t]) for t in ids[k : k + 4]]

    return f"token {k}: prompt {tokens(prompt)} vs {name} {tokens(text)}"


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _turn_spans(
    rules: TurnRules,
    messages: list[dict[str, Any]],
    i: int,
    rendered: tuple[str, int, bool],
    tools: list[dict] | None,
) -> list[tuple[int, int]] | None:
    """The spans of ``text`` (``rendered``: the training text of ``messages[:end]``, rendered with ``thinking``)
    that train assistant turn ``i``; None when ``text`` does not hold the turn after its inference prompt as the
    template renders the turn last (history that drops its reasoning, or ends it otherwise)."""
    text, end, thinking = rendered
    prompt = render_record(
        rules.tokenizer, messages[:i], add_generation_prompt=True, tools=tools, enable_thinking=thinking
    )
    # The conversation through the text's last message is the text itself, already rendered.
    through = text if i + 1 == end else render_through(rules, messages, i + 1, tools, thinking)
    if not (through.startswith(prompt) and text.startswith(through)):
        return None
    return reply_spans(rules, messages[i], i, text, (len(prompt), len(through)))


def reply_spans(
    rules: TurnRules, message: dict[str, Any], i: int, text: str, reply: tuple[int, int]
) -> list[tuple[int, int]]:
    """The trained spans of assistant turn ``i`` (``message``), whose reply is ``text[start:stop]`` (``reply``):
    the training text after the turn's inference prompt, through the end of the conversation rendered through it.
    Located by the rule or by ``hf_lora_ds.data.masking.skeleton``; the checks on what the template wrote are the same
    for both. The span runs from the reply's start (or, for a think block that is no target, from the answer's) through
    the end-of-turn token."""
    start, stop = reply
    written = text[start:stop]
    reasoning = (message.get("reasoning_content") or "").strip()
    after = written.find(reasoning) + len(reasoning) if reasoning else 0
    if after < len(reasoning):
        raise TemplateError(
            f"the chat template does not render the reasoning (reasoning_content) of assistant turn {i}, and its "
            "generation prompt opens no think block; use a thinking model's template (Qwen3's), or put the "
            "reasoning into the content to train it as written"
        )
    calls = message.get("tool_calls")
    content_at, end = (
        _tool_call_reply(rules, written, after, message, i) if calls else _answer(rules, written, after, message, i)
    )
    trained_from = 0
    if reasoning and not rules.thinking.train_reasoning:
        trained_from = _answer_start(rules, written, after, content_at)
    elif not reasoning and content_at and rules.thinking.empty_think == "mask":
        empty = rules.empty_block.match(written, 0, content_at)  # stays in the input, as no target
        trained_from = empty.end() if empty else 0
    return [(start + trained_from, start + end)]


def _answer(rules: TurnRules, written: str, after: int, message: dict[str, Any], turn: int) -> tuple[int, int]:
    """Where the content starts in the reply ``written`` (after ``after``, the end of its reasoning) and where the
    end-of-turn tokens after it end: the last place the content stands followed by such a token, so that a content
    that also occurs in a header (``assistant`` before GPT-OSS's ``<|channel|>``) cannot end the turn early."""
    content = message["content"]  # never empty without tool calls (hf_lora_ds.data.formats)
    at = written.rfind(content)
    if at >= after and (eot := rules.end_of_turn.match(written, at + len(content))):  # the common case, at once
        return at, end_of_turn_run(rules, written, eot.end())
    found = False
    for needle in dict.fromkeys((content, content.lstrip("\n"))):
        at = written.rfind(needle)
        while at >= after:
            found = True
            if eot := spaced_end_of_turn(rules, written, at + len(needle)):
                return at, end_of_turn_run(rules, written, eot)
            at = written.rfind(needle, after, at + len(needle) - 1)
    if not found:
        raise TemplateError(
            f"the chat template changes the content of assistant turn {turn} (rendered {written[after:][:60]!r}, "
            f"expected it to hold {content[:60]!r}); strip or normalise the content in your data first"
        )
    rest = written[written.rfind(content.lstrip("\n")) + len(content.lstrip("\n")) :]
    raise TemplateError(
        f"the chat template puts {rest[:30]!r} after the assistant content instead of an end-of-turn special token; "
        "the model would never learn to stop"
    )


def spaced_end_of_turn(rules: TurnRules, written: str, at: int) -> int | None:
    """The end of the end-of-turn token at ``at``, or after whitespace there (Mixtral-8x22B's ``' ' + eos_token``):
    the whitespace the template writes before the token is part of what the model generates, trained as written."""
    eot = rules.end_of_turn.match(written, _SPACE.match(written, at).end())
    return eot.end() if eot else None


def end_of_turn_run(rules: TurnRules, written: str, at: int) -> int:
    """The end of the tokens the template writes right after the first end-of-turn token of a reply, with no text
    between them (Command-A: ``<|END_RESPONSE|><|END_OF_TURN_TOKEN|>``): the model generates all of them."""
    while found := rules.end_of_turn.match(written, at):
        at = found.end()
    return at


def _answer_start(rules: TurnRules, written: str, after: int, content_at: int) -> int:
    """Where a reply's answer starts, past its reasoning and the template's close of it: the content, or for an
    empty content (tool calls only) the end of the close the template writes there."""
    close = rules.traits.close or ""
    if content_at > after or not close or not written.startswith(close, after):
        return content_at
    return after + len(close)


def _tool_call_reply(rules: TurnRules, reply: str, after: int, message: dict, turn: int) -> tuple[int, int]:
    """Where the content of an assistant turn with tool calls starts, and where its reply ends: through its
    end-of-turn token, inclusive.

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
    for call in message["tool_calls"]:
        name = call["function"]["name"]
        if name not in body[after:]:
            raise TemplateError(
                f"the chat template does not render the tool call {name!r} of assistant turn {turn}; use a model "
                "whose chat template supports tools (Qwen2.5's does)"
            )
    content = message["content"]
    at = body.find(content, after) if content else after
    if at < 0:
        raise TemplateError(
            f"the chat template changes the content of assistant turn {turn} (rendered {body[after:][:60]!r}, "
            f"expected it to hold {content[:60]!r}); strip or normalise the content in your data first"
        )
    return at, len(body)


def render_record(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    enable_thinking: bool | None = None,
) -> str:
    """The template's text for ``messages`` (``hf_lora_ds.data.masking.template_probes.apply_template``); an error the
    template raises (``raise_exception``, or any inside Jinja) is the record's, in one line."""
    try:
        return apply_template(tokenizer, messages, add_generation_prompt, tools, enable_thinking)
    except Exception as err:
        raised = "an exception" if type(err).__name__ == "TemplateError" else type(err).__name__
        raise TemplateError(
            f"the chat template raised {raised}: {err} (it does not take this record as it is: change the record "
            "or the template)"
        ) from None
