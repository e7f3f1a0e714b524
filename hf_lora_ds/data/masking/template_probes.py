"""What a chat template does around an assistant turn, found by rendering probes rather than read off a family table.

Templates spell thinking many ways (Qwen3's ``<think>`` block in the turn, DeepSeek-R1's in the generation prompt,
GPT-OSS's ``analysis`` channel) and a few end an assistant turn with no token of their own (GLM's stop token is the
next turn's ``<|user|>``; where that is no token of the vocabulary, generation stops at eos). The label rule
(hf_lora_ds.data.masking.template_rule) needs the facts in ``TemplateTraits``, each probed once per dataset with marker
strings no data contains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from hf_lora_ds.data.records.content_parts import PARTS_KEY

__all__ = ["TemplateTraits", "probe_template", "closing_tag", "apply_template"]

_QUERY, _ANSWER, _REASONING = "query-probe-7f3a", "answer-probe-7f3a", "reasoning-probe-7f3a"
# A tag that ends a generation prompt, with the whitespace after it: <think>, <seed:think>, [THINK].
_ENDING_TAG = re.compile(r"(<[^<>|\s/][^<>|\s]{0,38}>|\[[A-Z_]{2,30}\])(\s*)$")


@dataclass(frozen=True)
class TemplateTraits:
    """The probed facts; None where the template has no such thing."""

    close: str | None  # written between the reasoning and the answer
    think_open: str | None  # the think tag the generation prompt ends with
    turn_closers: dict[str, str] | None  # role of the next message -> the special token the template writes
    # after an assistant turn before it (GLM: <|user|>, <|observation|>), or eos where it writes none there (the
    # role token is no token of the vocabulary: generation stops at eos), where it writes none after a last turn
    iterates_parts: bool = False  # it writes the text of each part of a content given as a list of parts
    # What it appends to whatever it renders with thinking off (Hunyuan: an empty block after the prompt, and after
    # a finished conversation too): the prompt inference builds ends with it, the history never holds it.
    off_suffix: str | None = None
    # The opening of the think block the model writes in its reply, where the template writes no reasoning but
    # spells the block as its off_suffix (Hunyuan: '<think>\n'); ``close`` is then the block's close.
    reply_block: str | None = None
    # The tags the model writes around its answer where the template takes them off history turns (Hunyuan's
    # '<answer>\n' ... '\n</answer>'), as its own output has them.
    answer_tags: tuple[str, str] | None = None

    @property
    def writes_reasoning(self) -> bool:
        """Whether a turn's reasoning reaches the training text: written by the template, or generated after a
        block its prompt opens."""
        return self.close is not None


def apply_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
    enable_thinking: bool | None = None,
) -> str:
    """The template's text for ``messages``, rendered the one way every path here renders it (``enable_thinking``
    passed only when given: a template reads it as defined or not); a message's parts kept for a template that
    iterates them (``PARTS_KEY``) are its content."""
    extra = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    if any(PARTS_KEY in message for message in messages):
        messages = [_with_parts(message) for message in messages]
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )


def _with_parts(message: dict) -> dict:
    if PARTS_KEY not in message:
        return message
    return {**{key: value for key, value in message.items() if key != PARTS_KEY}, "content": message[PARTS_KEY]}


def closing_tag(tag: str) -> str:
    """``</think>`` for ``<think>``, ``[/THINK]`` for ``[THINK]``."""
    return f"[/{tag[1:]}" if tag.startswith("[") else f"</{tag[1:]}"


def probe_template(tokenizer: PreTrainedTokenizerBase, special_tokens: tuple[str, ...]) -> TemplateTraits:
    """The template's traits, from a few renders of a one-turn chat of markers. A probe the template raises on
    finds nothing: the records themselves then meet the template's error, named with their line."""
    user = {"role": "user", "content": _QUERY}
    think_open = _think_open(tokenizer, user)
    closers = _turn_closers(tokenizer, user, special_tokens)
    parts = _iterates_parts(tokenizer)
    close, suffix = _close(tokenizer, user, think_open), _off_suffix(tokenizer, user)
    block = _block_in_reply(suffix) if close is None and think_open is None else None
    return TemplateTraits(
        block[1] if block else close, think_open, closers, parts, suffix, block and block[0], _answer_tags(tokenizer)
    )


def _think_open(tokenizer: PreTrainedTokenizerBase, user: dict) -> str | None:
    try:
        prompt = apply_template(tokenizer, [user], add_generation_prompt=True, enable_thinking=True)
    except Exception:
        return None
    found = _ENDING_TAG.search(prompt)
    if found is None or closing_tag(found.group(1)) not in (tokenizer.chat_template or ""):
        return None  # a turn header (<|assistant|>, <|end_header_id|>) has no closing spelling
    return found.group(1)


def _close(tokenizer: PreTrainedTokenizerBase, user: dict, think_open: str | None) -> str | None:
    """What the template writes from the end of the reasoning to the answer; for a template that drops reasoning
    but opens a block in its prompt (DeepSeek-R1), the block's close as these models write it: the whitespace after
    the open tag, the closing tag, a blank line."""
    turn = {"role": "assistant", "content": _ANSWER, "reasoning_content": _REASONING}
    try:
        text = apply_template(tokenizer, [user, turn], enable_thinking=True)
    except Exception:
        text = ""
    at, answer = text.find(_REASONING), text.rfind(_ANSWER)
    if 0 <= at < answer:
        return text[at + len(_REASONING) : answer]
    if think_open is None:
        return None
    prompt = apply_template(tokenizer, [user], add_generation_prompt=True, enable_thinking=True)
    return prompt[prompt.rindex(think_open) + len(think_open) :] + closing_tag(think_open) + "\n\n"


def _off_suffix(tokenizer: PreTrainedTokenizerBase, user: dict) -> str | None:
    """What the template appends with thinking off both to a generation prompt and to a finished turn, or None
    (Qwen3 writes its empty block into the prompt only: None)."""
    turn = {"role": "assistant", "content": _ANSWER}
    try:
        renders = [
            [apply_template(tokenizer, chat, prompt, enable_thinking=on) for on in (True, False)]
            for chat, prompt in (([user], True), ([user, turn], False))
        ]
    except Exception:
        return None
    (prompt_on, prompt_off), (turn_on, turn_off) = renders
    suffix = prompt_off[len(prompt_on) :]
    if not suffix or not prompt_off.startswith(prompt_on) or turn_off != turn_on + suffix:
        return None
    return suffix


def _block_in_reply(suffix: str | None) -> tuple[str, str] | None:
    """The opening and close of the think block the model writes in its reply, spelled as the empty block the
    template appends with thinking off (``<think>\n\n</think>\n``: the reasoning goes between its blank lines)."""
    found = re.fullmatch(r"(<[^<>|\s/]{1,38}>)(\s*)(</[^<>|\s]{1,38}>)(\s*)", suffix or "")
    if found is None or found.group(3) != closing_tag(found.group(1)):
        return None
    tag, space, close, after = found.groups()
    return tag + space[: len(space) // 2], space[len(space) // 2 :] + close + after


def _answer_tags(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str] | None:
    """``('<answer>\n', '\n</answer>')`` where the template writes a history turn wrapped in them as its answer
    alone (Hunyuan), as the model wraps it; else None."""
    user, answer = {"role": "user", "content": _QUERY}, "7f3a-answer-probe-9"  # no letter of 'answer' at its ends
    tagged = {"role": "assistant", "content": f"<answer>\n{answer}\n</answer>"}
    try:
        history = apply_template(tokenizer, [user, tagged, user])
        plain = apply_template(tokenizer, [user, {"role": "assistant", "content": answer}, user])
    except Exception:
        return None
    return ("<answer>\n", "\n</answer>") if history == plain and answer in plain else None


def _iterates_parts(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether a user content given as two text parts renders as their texts, not as the list's Python spelling
    (what a template that writes the content as a string makes of a list)."""
    parts = [{"type": "text", "text": _QUERY}, {"type": "text", "text": _ANSWER}]
    try:
        text = apply_template(tokenizer, [{"role": "user", "content": parts}], add_generation_prompt=True)
    except Exception:
        return False
    return _QUERY in text and _ANSWER in text and "'type'" not in text and '"type"' not in text


def _turn_closers(
    tokenizer: PreTrainedTokenizerBase, user: dict, special_tokens: tuple[str, ...]
) -> dict[str, str] | None:
    turn = {"role": "assistant", "content": _ANSWER}
    try:
        last = apply_template(tokenizer, [user, turn])
    except Exception:
        return None
    if not last.endswith(_ANSWER):
        return None
    closers = {}
    for role in ("user", "tool"):
        try:
            longer = apply_template(tokenizer, [user, turn, {"role": role, "content": _QUERY}])
        except Exception:
            continue
        if not longer.startswith(last):
            continue
        # What stops generation there: the special token the next turn starts with, else eos (LLaMA-Factory's GLM-4
        # template appends it too).
        if token := next_special_token(longer[len(last) :], special_tokens) or tokenizer.eos_token:
            closers[role] = token
    return closers or None


def next_special_token(text: str, special_tokens: tuple[str, ...]) -> str | None:
    """The special token ``text`` starts with (the longest), or None."""
    return max((token for token in special_tokens if token and text.startswith(token)), key=len, default=None)
