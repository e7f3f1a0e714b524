"""User turns a record's training flags train (axolotl's ``train`` and ``train_detail``, ms-swift's ``loss``), located
in the training texts by the rule that locates a reply, without a prompt to follow.

The span is the turn as the template writes it: its content, then the end-of-turn tokens the template writes right
after it within the turn (ChatML's ``<|im_end|>``), never its role header. Where the template writes no generation
prompt of its own, the tokens closing a user turn open the reply (Mistral's ``[/INST]``, Hunyuan's assistant token):
those are the reply's header, not trained. A user turn stands in every training text after it; it is trained in the
first one, in conversation order, that holds it as the template renders the conversation through it: once.
"""

from __future__ import annotations

from typing import Any

from hf_lora_ds.data.masking.template_rule import (
    TemplateError,
    TrainingText,
    TurnRules,
    end_of_turn_run,
    render_record,
    spaced_end_of_turn,
)

__all__ = ["with_user_turns"]


def with_user_turns(
    rules: TurnRules, messages: list[dict[str, Any]], tools: list[dict] | None, users: list[int], samples: list
) -> list[TrainingText]:
    """``samples`` with the span of each user turn in ``users`` added to the first text that holds it; a
    conversation whose flags train no assistant turn gets one text, the whole conversation as the template writes it."""
    samples = list(samples) or [TrainingText(render_record(rules.tokenizer, messages, tools=tools), [], [])]
    for i in users:
        at, through, thinking = _holding(rules, messages, i, tools, samples)
        span = _user_span(rules, messages, i, through, (tools, thinking))
        sample = samples[at]
        pairs = sorted([*zip(sample.spans, sample.turns), (span, i)])
        samples[at] = TrainingText(sample.text, [span for span, _ in pairs], [turn for _, turn in pairs])
    return samples


def _holding(
    rules: TurnRules, messages: list[dict[str, Any]], i: int, tools: list[dict] | None, samples: list[TrainingText]
) -> tuple[int, str, bool | None]:
    """The first sample whose text starts with the conversation through user turn ``i``, and that rendering (tried
    with ``enable_thinking`` unset, off and on: a template may write a user turn as the text's thinking mode does)."""
    for thinking in (None, False, True):
        through = render_record(rules.tokenizer, messages[: i + 1], tools=tools, enable_thinking=thinking)
        for k, sample in enumerate(samples):
            if sample.text.startswith(through):
                return k, through, thinking
    raise TemplateError(
        f"user turn {i} is trained by the record's flags, but the chat template writes it differently once the "
        "conversation goes on, so its tokens cannot be located exactly"
    )


def _user_span(
    rules: TurnRules, messages: list[dict[str, Any]], i: int, through: str, rendering: tuple[list[dict] | None, Any]
) -> tuple[int, int]:
    """The span of user turn ``i`` in ``through`` (the conversation rendered through it with ``rendering``'s tools
    and thinking mode): the last place its content stands followed only by end-of-turn tokens and whitespace, through
    those tokens."""
    content = messages[i]["content"]
    at = through.rfind(content)
    while at >= 0:
        end = at + len(content)
        if closed := spaced_end_of_turn(rules, through, end):
            end = end_of_turn_run(rules, through, closed)
        if not through[end:].strip():
            return at, _without_reply_header(rules, messages[: i + 1], through, (at + len(content), end), rendering)
        at = through.rfind(content, 0, at + len(content) - 1)
    raise TemplateError(
        f"the chat template does not write user turn {i} as its content followed by an end-of-turn token (rendered "
        f"{through[-80:]!r}), so a training flag cannot train it exactly"
    )


def _without_reply_header(
    rules: TurnRules, messages: list[dict[str, Any]], through: str, closing: tuple[int, int], rendering: tuple
) -> int:
    """The end of the span: the end of the tokens after the content (``closing``), unless the template writes no
    generation prompt after the turn (``messages[-1]``), so that those tokens are the next reply's header: then the
    content's end."""
    end_of_content, end = closing
    if end == end_of_content:
        return end
    tools, thinking = rendering
    prompt = render_record(rules.tokenizer, messages, add_generation_prompt=True, tools=tools, enable_thinking=thinking)
    return end_of_content if prompt == through else end
