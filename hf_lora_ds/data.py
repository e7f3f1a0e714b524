"""Chat-template SFT data with exact labels: every token is -100 except what each trained assistant turn says.

Stock chat templates (Qwen's among them) have no ``{% generation %}`` block, so transformers' assistant mask comes
back all zeros with only a warning, and masking by response-marker strings breaks when the marker tokenizes
differently in context. Instead, the supervised spans are derived from the template itself: for assistant turn i,
the conversation rendered up to turn i with the generation prompt must be a prefix of the conversation rendered
through turn i, and what lies between is exactly the assistant content followed by an end-of-turn special token.
Those character spans are mapped to tokens with the fast tokenizer's offsets, and each decoded span is checked
against ``content + end_of_turn``. An assistant turn with tool calls is trained whole, as the template writes it
(Qwen2.5: ``<tool_call>`` JSON), through its end-of-turn special token; every call's name must appear in it.
Whatever the template does that breaks this (reformatting history, merging the header into the content) raises a
``TemplateError`` instead of training on a wrong mask.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import datasets
import torch
from datasets.fingerprint import Hasher
from transformers import PreTrainedTokenizerBase

from hf_lora_ds.distributed import process_group_exists
from hf_lora_ds.errors import UserError
from hf_lora_ds.formats import FormatOptions, to_conversation
from hf_lora_ds.records import DataError
from hf_lora_ds.sources import LoadedData, load_data

__all__ = ["ChatSFTDataset", "TemplateError", "IGNORE_INDEX", "supervised_char_spans", "tokenize_conversation"]

IGNORE_INDEX = -100
AssistantTurns = Literal["all", "last"]
EmptyLabelsPolicy = Literal["drop", "error"]


class TemplateError(UserError):
    """The chat template renders conversations in a way that no exact assistant mask can be derived from."""


def supervised_char_spans(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict[str, Any]],
    assistant_turns: AssistantTurns = "all",
    tools: list[dict] | None = None,
) -> tuple[str, list[tuple[int, int]]]:
    """Render ``messages`` (with ``tools``, if any) and return the text with the character spans to train on:
    content + end-of-turn, and for a turn with tool calls everything the template writes for them too."""
    text = _render(tokenizer, messages, tools=tools)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if assistant_turns == "last":
        turns = turns[-1:]
    spans = []
    for i in turns:
        prompt = _render(tokenizer, messages[:i], add_generation_prompt=True, tools=tools)
        through = _render(tokenizer, messages[: i + 1], tools=tools)
        if not (through.startswith(prompt) and text.startswith(through)):
            raise TemplateError(
                f"the chat template renders assistant turn {i} differently once later turns follow it (or the "
                "generation prompt is not a prefix of the rendered turn), so its tokens cannot be located exactly; "
                "train on the last assistant turn only (assistant_turns='last') or use a template that keeps history"
            )
        content = messages[i]["content"]
        reply = through[len(prompt) :]
        if not reply.startswith(content):
            raise TemplateError(
                f"the chat template changes the content of assistant turn {i} (rendered {reply[:60]!r}, "
                f"expected it to start with {content[:60]!r}); strip or normalise the content in your data first"
            )
        calls = messages[i].get("tool_calls")
        if calls:
            trained = _tool_call_reply(tokenizer, reply, calls, i)
        else:
            trained = content + _end_of_turn_after(tokenizer, reply[len(content) :])
        start = len(prompt)
        spans.append((start, start + len(trained)))
    return text, spans


def _tool_call_reply(tokenizer: PreTrainedTokenizerBase, reply: str, calls: list[dict], turn: int) -> str:
    """The trained part of an assistant turn with tool calls: the reply up to its end-of-turn token, inclusive.

    The template serialises the calls its own way (``<tool_call>`` JSON for Qwen2.5), so what the model must learn
    to write is whatever it rendered; a template that drops the calls (one without tool support) is refused.
    """
    body = reply.rstrip()
    # Special tokens only: Qwen2.5's <tool_call>/</tool_call> are added (non-special) tokens and end no turn.
    if not any(body.endswith(token) for token in tokenizer.all_special_tokens):
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


def tokenize_conversation(
    tokenizer: PreTrainedTokenizerBase,
    text: str,
    spans: Sequence[tuple[int, int]],
    offsets: Sequence[tuple[int, int]],
    input_ids: Sequence[int],
) -> list[int]:
    """Labels for one tokenized text: the token id inside a supervised span, -100 elsewhere.

    A token that straddles a span boundary means the tokenizer merged template text into the answer (or the
    answer into the template), so no exact mask exists for it: that is an error, not a guess.
    """
    labels = [IGNORE_INDEX] * len(input_ids)
    for start, end in spans:
        picked = []
        for j, (token_start, token_end) in enumerate(offsets):
            if token_end <= start or token_start >= end:
                continue
            if token_start < start or token_end > end:
                raise TemplateError(
                    f"token {tokenizer.convert_ids_to_tokens(input_ids[j])!r} crosses the boundary of an assistant "
                    f"turn (chars {start}-{end}); the tokenizer merges template and content here"
                )
            labels[j] = input_ids[j]
            picked.append(input_ids[j])
        decoded = tokenizer.decode(picked, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if decoded != text[start:end]:
            raise TemplateError(f"supervised tokens decode to {decoded!r}, expected {text[start:end]!r}")
    return labels


def _render(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[dict],
    add_generation_prompt: bool = False,
    tools: list[dict] | None = None,
) -> str:
    return tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=add_generation_prompt
    )


def _end_of_turn_after(tokenizer: PreTrainedTokenizerBase, rest: str) -> str:
    """The special token the template puts right after an assistant message (``<|im_end|>``, ``<|eot_id|>``...)."""
    specials = sorted(set(tokenizer.get_added_vocab()) | set(tokenizer.all_special_tokens), key=len, reverse=True)
    for token in specials:
        if rest.startswith(token):
            return token
    raise TemplateError(
        f"the chat template puts {rest[:30]!r} after the assistant content instead of an end-of-turn special token; "
        "the model would never learn to stop"
    )


class ChatSFTDataset(torch.utils.data.Dataset):
    """Tokenized chat SFT samples: ``ds[i]`` is a dict of ``input_ids``, ``attention_mask`` and ``labels`` lists.

    Args:
        data: a source or weighted mixture as ``--train_file`` takes it (see ``hf_lora_ds.sources``), records
            already loaded by ``sources.load_data``, or a list of records in any format of ``hf_lora_ds.formats``.
        tokenizer: a fast tokenizer whose chat template renders the conversations.
        max_length: truncate longer samples to this many tokens (right side); None keeps them whole.
        system_prompt: system turn to add to records that have none (a record's own system turn wins).
        assistant_turns: train on ``"all"`` assistant turns or only the ``"last"`` one.
        on_empty_labels: a sample left with no supervised token (by truncation) is ``"drop"``-ped and counted,
            or raises an ``"error"`` naming it.
        cache_dir: where the tokenized arrow file is cached; None uses the datasets cache.
        formats: column mapping and ShareGPT role names (``FormatOptions``); None: the defaults.
    """

    def __init__(
        self,
        data: str | Path | list[dict] | LoadedData,
        tokenizer: PreTrainedTokenizerBase,
        max_length: int | None = None,
        system_prompt: str | None = None,
        assistant_turns: AssistantTurns = "all",
        on_empty_labels: EmptyLabelsPolicy = "drop",
        cache_dir: str | Path | None = None,
        formats: FormatOptions | None = None,
    ):
        if not tokenizer.is_fast:
            raise TemplateError("a fast tokenizer is required (its offsets locate the assistant spans exactly)")
        if tokenizer.chat_template is None:
            raise TemplateError("the tokenizer has no chat_template; set tokenizer.chat_template first")
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.assistant_turns = assistant_turns
        loaded = data if isinstance(data, LoadedData) else load_data(data)
        self.source_counts = loaded.counts()
        # JSON text, not nested columns: tool schemas and call arguments differ from record to record.
        conversations = [
            json.dumps(to_conversation(r.data, r.where, system_prompt, formats), ensure_ascii=False)
            for r in loaded.records
        ]
        # Locations and sources are part of the cached output, so they key the cache as much as the conversations.
        columns = {"conversation": conversations, "where": [r.where for r in loaded.records], "source": loaded.sources}
        raw = datasets.Dataset.from_dict(columns)
        with _main_process_first():
            tokenized = raw.map(
                self._tokenize_batch,
                batched=True,
                remove_columns=["conversation"],
                cache_file_name=str(_cache_file(cache_dir, columns, tokenizer, max_length, assistant_turns)),
                desc="Tokenizing with the chat template",
            )
        empty = [i for i, n in enumerate(tokenized["num_supervised"]) if n == 0]
        if empty and on_empty_labels == "error":
            where = tokenized[empty[0]]["where"]
            raise DataError(
                f"{where}: sample {empty[0]} has no supervised token left after truncation to max_length={max_length} "
                f"({len(empty)} such samples); raise max_length or set on_empty_labels='drop'"
            )
        sources = tokenized["source"]
        self.dropped_by_source = Counter(sources[i] for i in empty)
        self.truncated_by_source = Counter(s for s, cut in zip(sources, tokenized["truncated"]) if cut)
        self.num_dropped = len(empty)
        self.num_truncated = sum(self.truncated_by_source.values())
        self.samples = tokenized.filter(lambda n: n > 0, input_columns="num_supervised") if empty else tokenized
        self.samples = self.samples.with_format(columns=["input_ids", "attention_mask", "labels"])
        if len(self.samples) == 0:
            raise DataError(f"no trainable samples: all {len(tokenized)} lost their supervised tokens to truncation")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.samples[index]

    @property
    def lengths(self) -> list[int]:
        return list(self.samples.with_format(None)["length"])

    @property
    def sources(self) -> list[str]:
        """The source (``--train_file`` entry) of each sample, for per-source counts and audits."""
        return list(self.samples.with_format(None)["source"])

    def _tokenize_batch(self, batch: dict[str, list]) -> dict[str, list]:
        rendered = []
        for conversation in map(json.loads, batch["conversation"]):
            rendered.append(
                supervised_char_spans(self.tokenizer, conversation["messages"], self.assistant_turns, conversation["tools"])
            )
        texts = [text for text, _ in rendered]
        encoded = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        out: dict[str, list] = {k: [] for k in ("input_ids", "attention_mask", "labels", "length")}
        out.update(num_supervised=[], truncated=[])
        for (text, spans), ids, offsets in zip(rendered, encoded["input_ids"], encoded["offset_mapping"]):
            labels = tokenize_conversation(self.tokenizer, text, spans, offsets, ids)
            truncated = self.max_length is not None and len(ids) > self.max_length
            if truncated:
                ids, labels = ids[: self.max_length], labels[: self.max_length]
            out["input_ids"].append(ids)
            out["attention_mask"].append([1] * len(ids))
            out["labels"].append(labels)
            out["length"].append(len(ids))
            out["num_supervised"].append(sum(label != IGNORE_INDEX for label in labels))
            out["truncated"].append(truncated)
        return out


@contextmanager
def _main_process_first() -> Iterator[None]:
    """Rank 0 tokenizes and writes the cache first; the other ranks then read it instead of redoing the work."""
    distributed = process_group_exists()
    is_main = not distributed or torch.distributed.get_rank() == 0
    if distributed and not is_main:
        torch.distributed.barrier()
    yield
    if distributed and is_main:
        torch.distributed.barrier()


def _cache_file(
    cache_dir: str | Path | None, columns: dict[str, list], tokenizer: PreTrainedTokenizerBase, *settings: Any
) -> Path:
    """A cache path keyed on everything in the cached output: data, vocabulary, template and settings."""
    root = Path(cache_dir or os.path.join(datasets.config.HF_DATASETS_CACHE, "hf_lora_ds"))
    root.mkdir(parents=True, exist_ok=True)
    key = Hasher.hash([columns, tokenizer.backend_tokenizer.to_str(), tokenizer.chat_template, settings])
    return root / f"chat_sft-{key}.arrow"
