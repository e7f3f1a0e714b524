"""Train-to-inference round trip: what a trained turn is taught to follow must be what inference will prompt it with.

The labels are derived from the template's rendering of the conversation; inference tokenizes
``apply_chat_template(history, add_generation_prompt=True, enable_thinking=...)`` on its own. Where the two differ (a
template whose ``enable_thinking=False`` prompt adds a think block the trained turn does not have, history rendered
another way, a prompt that tokenizes differently alone than inside the training text), the model is trained on
contexts it will never see. So for every trained turn the inference prompt's tokens must be the first tokens of its
training text: checked at start on a sample (``run_sft.py`` stops, naming the first differing tokens) and on every
record by the audit (``python -m hf_lora_ds.audit``), which adds the count. ``enable_thinking`` is on for a turn
with reasoning and off for one without (on with ``--empty_think train``), as the label rule prompts each
(``hf_lora_ds.data.masking.template_rule``); the training ids are the dataset's
(``hf_lora_ds.data.tokens.labels.sample_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from hf_lora_ds.data.dataset import ChatSFTDataset, TemplateError
from hf_lora_ds.data.masking.template_probes import apply_template
from hf_lora_ds.data.masking.template_rule import token_difference
from hf_lora_ds.data.tokens.labels import sample_tokens

__all__ = ["RoundTrip", "round_trip", "check_round_trip", "turn_difference"]

START_SAMPLE = 64  # records checked at start: enough to meet each shape of a mixture, cheap next to tokenizing
_BATCH = 256


@dataclass
class RoundTrip:
    """How many trained turns were checked, how many failed, and the first failure, named."""

    turns: int = 0
    failures: int = 0
    first: str | None = None

    def line(self) -> str:
        ok = self.turns - self.failures
        text = (
            f"train-to-inference round trip: {ok}/{self.turns} trained turns' inference prompts "
            "start their training text"
        )
        return text + (f"; first difference: {self.first}" if self.first else "")


def turn_difference(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    turn: int,
    tools: list[dict] | None,
    train_ids: list[int],
    thinking: bool,
) -> str | None:
    """None when the inference prompt of assistant turn ``turn`` (``enable_thinking=thinking``) is a token prefix of
    ``train_ids``; else where and how they first differ."""
    prompt = apply_template(
        tokenizer, messages[:turn], add_generation_prompt=True, tools=tools, enable_thinking=thinking
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if train_ids[: len(prompt_ids)] == prompt_ids:
        return None
    difference = token_difference(tokenizer, prompt_ids, train_ids, "training text")
    return f"assistant turn {turn} (enable_thinking={thinking}): {difference}"


def round_trip(dataset: ChatSFTDataset, limit: int | None = None) -> RoundTrip:
    """Check the trained turns of the dataset's first ``limit`` records (all when None)."""
    encoder, records = dataset.encoder, dataset.records
    tokenizer = encoder.tokenizer
    result = RoundTrip()
    count = len(records) if limit is None else min(limit, len(records))
    for begin in range(0, count, _BATCH):
        batch = records[begin : min(begin + _BATCH, count)]
        for conversation, where in zip(encoder.conversations(batch), batch["where"]):
            messages = conversation["messages"]
            for sample in encoder.samples(conversation, where):
                ids = sample_tokens(tokenizer, sample.text, sample.spans)
                for turn in sample.turns:
                    if messages[turn]["role"] != "assistant":  # a user turn a flag trains follows no prompt
                        continue
                    result.turns += 1
                    thinking = encoder.rules.thinking_on(messages[turn])
                    difference = turn_difference(tokenizer, messages, turn, conversation["tools"], ids, thinking)
                    if difference:
                        result.failures += 1
                        result.first = result.first or f"{where}, {difference}"
    return result


def check_round_trip(dataset: ChatSFTDataset, limit: int = START_SAMPLE) -> RoundTrip:
    """The start check: a sample of records round-trips, or a ``TemplateError`` names the first difference."""
    result = round_trip(dataset, limit)
    if result.failures:
        raise TemplateError(
            f"the chat template's inference prompt is not the start of the training text ({result.failures}/"
            f"{result.turns} trained turns of the first {limit} records): {result.first}; the model would be trained "
            "on contexts inference never gives it: fix the chat template"
        )
    return result
