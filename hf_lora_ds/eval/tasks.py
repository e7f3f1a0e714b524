"""Eval tasks: how a record becomes a prompt and how a completion is judged (hf_lora_ds.eval.task_registry names them).

A task gives the prompt (the conversation up to the final assistant turn) and a ``Verdict`` with a reason when wrong,
so a report says why accuracy is low. What it needs from a record is parsed in ``Task.target`` before any generation,
so a bad record fails in seconds, not after an hour of generating.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from hf_lora_ds.data.formats import to_conversation, to_messages
from hf_lora_ds.data.records import DataError
from hf_lora_ds.data.records.content_parts import IMAGE_MARK

__all__ = [
    "Verdict",
    "Sample",
    "Task",
    "ExactMatchTask",
    "RegexTask",
    "NumericTask",
]

EMPTY_OUTPUT = "empty output"


@dataclass(frozen=True)
class Verdict:
    """How one completion scored; ``reason`` is a short fixed phrase (``"wrong sum"``) so that reports can count it."""

    correct: bool
    answer: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class Sample:
    """One eval record split into what the model sees and what it is judged against; ``images``: the prompt's images
    in the order ``IMAGE_MARK`` stands in its text (``hf_lora_ds.data.formats.images``), for a vision-language
    model."""

    prompt: list[dict[str, str]]
    reference: str
    target: Any = None
    where: str = "record"
    images: tuple[Any, ...] = ()


class Task:
    """Base class: subclasses set ``name`` and implement :meth:`score`; override :meth:`target` to parse the record.

    ``max_new_tokens`` None lets :func:`~hf_lora_ds.eval.evaluate` size generation from the longest reference.
    """

    name: str = ""
    max_new_tokens: int | None = None

    def sample(
        self, record: Any, *, system_prompt: str | None = None, where: str = "record", images: bool = False
    ) -> Sample:
        """Validate ``record`` and split off its final assistant turn as the reference. ``images``: whether the
        model takes images (then the record's images are the sample's; else a record with images is refused)."""
        messages, pictures = _conversation(record, system_prompt, where, images)
        if messages[-1]["role"] != "assistant":
            raise DataError(
                f"{where}: field 'messages': the last turn is {messages[-1]['role']!r}; an eval record must end with "
                "the assistant turn to score against"
            )
        prompt, reference = messages[:-1], messages[-1]["content"]
        if images and IMAGE_MARK in reference:
            raise DataError(
                f"{where}: field 'messages': the last turn, the answer to score against, holds an image; images go "
                "in the prompt's turns"
            )
        return Sample(prompt, reference, self.target(prompt, reference, where), where, tuple(pictures))

    def target(self, prompt: list[dict[str, str]], reference: str, where: str) -> Any:
        """What :meth:`score` compares against; raise ``DataError`` naming ``where`` if the record cannot be scored."""
        return reference

    def score(self, output: str, sample: Sample) -> Verdict:
        raise NotImplementedError(f"{type(self).__name__} must implement score(output, sample) -> Verdict")


def _conversation(record: Any, system_prompt: str | None, where: str, images: bool) -> tuple[list[dict], list]:
    """The record's messages and, for a model that takes images, its images in mark order."""
    if not images:
        return to_messages(record, system_prompt, where), []
    conversation = to_conversation(record, where, system_prompt, images=True)
    if conversation["messages"] is None:  # plain text: to_messages refuses it, naming the record
        return to_messages(record, system_prompt, where), []
    return conversation["messages"], conversation["images"]


class ExactMatchTask(Task):
    """The completion, stripped of surrounding whitespace, equals the reference (optionally ignoring case)."""

    name = "exact_match"

    def __init__(self, ignore_case: bool = False) -> None:
        self.ignore_case = ignore_case

    def _norm(self, text: str) -> str:
        text = text.strip()
        return text.casefold() if self.ignore_case else text

    def score(self, output: str, sample: Sample) -> Verdict:
        answer = output.strip()
        if not answer:
            return Verdict(False, None, EMPTY_OUTPUT)
        if self._norm(answer) == self._norm(sample.target):
            return Verdict(True, answer)
        return Verdict(False, answer, "mismatch")


class RegexTask(Task):
    """Extract the answer with ``pattern`` (its first group, or the whole match) from completion and reference alike.

    The reference must match, so a pattern that cannot read the data fails before generation, not as 0% accuracy.
    """

    name = "regex"

    def __init__(self, pattern: str | None = None, ignore_case: bool = False) -> None:
        if not pattern:
            raise ValueError(
                'the regex task needs a pattern, e.g. get_task("regex", pattern=r"answer: (\\w+)") or '
                '--task_kwargs \'{"pattern": "answer: (\\\\w+)"}\''
            )
        self.ignore_case = ignore_case
        self.regex = re.compile(pattern, re.IGNORECASE if ignore_case else 0)

    def _extract(self, text: str) -> str | None:
        match = self.regex.search(text)
        if match is None:
            return None
        return (match.group(1) if self.regex.groups else match.group(0)).strip()

    def target(self, prompt: list[dict[str, str]], reference: str, where: str) -> str:
        expected = self._extract(reference)
        if expected is None:
            raise DataError(
                f"{where}: field 'output': the reference {reference[:60]!r} does not match the regex task's pattern "
                f"{self.regex.pattern!r}; fix the record or the pattern"
            )
        return expected

    def score(self, output: str, sample: Sample) -> Verdict:
        if not output.strip():
            return Verdict(False, None, EMPTY_OUTPUT)
        answer = self._extract(output)
        if answer is None:
            return Verdict(False, None, "no match")
        same = answer.casefold() == sample.target.casefold() if self.ignore_case else answer == sample.target
        return Verdict(same, answer, None if same else "wrong answer")


# An optional minus, digits with optional thousands separators, an optional fraction.
_NUMBER = re.compile(r"-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+")


def _last_number(text: str) -> float | None:
    """The last number in ``text`` (the usual convention: reasoning first, answer last), commas dropped."""
    numbers = _NUMBER.findall(text)
    return float(numbers[-1].replace(",", "")) if numbers else None


class NumericTask(Task):
    """The last number in the completion equals the last number in the reference, within a relative tolerance."""

    name = "numeric"

    def __init__(self, rel_tol: float = 1e-6, abs_tol: float = 0.0) -> None:
        self.rel_tol = rel_tol
        self.abs_tol = abs_tol

    def target(self, prompt: list[dict[str, str]], reference: str, where: str) -> float:
        value = _last_number(reference)
        if value is None:
            raise DataError(f"{where}: field 'output': the reference {reference[:60]!r} contains no number to compare")
        return value

    def score(self, output: str, sample: Sample) -> Verdict:
        if not output.strip():
            return Verdict(False, None, EMPTY_OUTPUT)
        value = _last_number(output)
        if value is None:
            return Verdict(False, None, "no number")
        same = math.isclose(value, sample.target, rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        return Verdict(same, f"{value:g}", None if same else "wrong number")
