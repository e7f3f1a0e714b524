"""Eval tasks: how a record becomes a prompt and how a completion is judged, plus the registry that names them.

A task gives the prompt (the conversation up to the final assistant turn) and a ``Verdict`` with a reason when wrong,
so a report says why accuracy is low. What it needs from a record is parsed in ``Task.target`` before any generation,
so a bad record fails in seconds, not after an hour of generating. Add your own with a class or a function::

    @register_task(max_new_tokens=8)
    def yes_no(output: str, sample: Sample) -> bool:
        return output.strip().lower() == sample.reference.strip().lower()
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hf_lora_ds.data.formats import to_messages
from hf_lora_ds.data.records import DataError
from hf_lora_ds.errors import UserError

__all__ = [
    "Verdict",
    "Sample",
    "Task",
    "ExactMatchTask",
    "RegexTask",
    "NumericTask",
    "register_task",
    "get_task",
    "available_tasks",
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
    """One eval record split into what the model sees and what it is judged against."""

    prompt: list[dict[str, str]]
    reference: str
    target: Any = None
    where: str = "record"


class Task:
    """Base class: subclasses set ``name`` and implement :meth:`score`; override :meth:`target` to parse the record.

    ``max_new_tokens`` None lets :func:`~hf_lora_ds.eval.evaluate` size generation from the longest reference.
    """

    name: str = ""
    max_new_tokens: int | None = None

    def sample(self, record: Any, *, system_prompt: str | None = None, where: str = "record") -> Sample:
        """Validate ``record`` and split off its final assistant turn as the reference."""
        messages = to_messages(record, system_prompt, where)
        if messages[-1]["role"] != "assistant":
            raise DataError(
                f"{where}: field 'messages': the last turn is {messages[-1]['role']!r}; an eval record must end with "
                "the assistant turn to score against"
            )
        prompt, reference = messages[:-1], messages[-1]["content"]
        return Sample(prompt, reference, self.target(prompt, reference, where), where)

    def target(self, prompt: list[dict[str, str]], reference: str, where: str) -> Any:
        """What :meth:`score` compares against; raise ``DataError`` naming ``where`` if the record cannot be scored."""
        return reference

    def score(self, output: str, sample: Sample) -> Verdict:
        raise NotImplementedError(f"{type(self).__name__} must implement score(output, sample) -> Verdict")


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


class _FunctionTask(Task):
    """A task made from a scoring function ``fn(output, sample) -> Verdict | bool``."""

    def __init__(self, fn: Callable[[str, Sample], Verdict | bool], name: str, max_new_tokens: int | None) -> None:
        self.fn = fn
        self.name = name
        self.max_new_tokens = max_new_tokens

    def score(self, output: str, sample: Sample) -> Verdict:
        result = self.fn(output, sample)
        if isinstance(result, Verdict):
            return result
        return Verdict(bool(result), output.strip(), None if result else "incorrect")


_REGISTRY: dict[str, Callable[..., Task]] = {}


def _registry() -> dict[str, Callable[..., Task]]:
    """Every registered task, the demo's sum_to_x included: its module registers it, and is imported here rather
    than by the package (whose names load on first use: hf_lora_ds._lazy)."""
    import hf_lora_ds.eval.sum_to_x  # noqa: F401

    return _REGISTRY


def register_task(
    obj: type[Task] | Task | Callable[[str, Sample], Verdict | bool] | None = None,
    *,
    name: str | None = None,
    max_new_tokens: int | None = None,
    overwrite: bool = False,
) -> Any:
    """Register a ``Task`` subclass, a ``Task`` instance, or a scoring function under ``name``; usable as a decorator.

    A subclass is instantiated by :func:`get_task` with its keyword arguments; a function is wrapped so that a bare
    ``bool`` result becomes a ``Verdict`` with reason ``"incorrect"``. Returns ``obj`` unchanged.
    """
    if obj is None:
        return lambda inner: register_task(inner, name=name, max_new_tokens=max_new_tokens, overwrite=overwrite)
    if isinstance(obj, type) and issubclass(obj, Task):
        key, factory = name or obj.name, obj
    elif isinstance(obj, Task):
        key, factory = name or type(obj).name, _instance_factory(obj)
    elif callable(obj):
        key = name or obj.__name__
        factory = _instance_factory(_FunctionTask(obj, key, max_new_tokens))
    else:
        raise TypeError(f"register_task takes a Task subclass, a Task instance or a function, got {type(obj).__name__}")
    if not key:
        raise ValueError(f"{obj!r} has no task name; set the class attribute `name` or pass name=...")
    if key in _registry() and not overwrite:
        raise ValueError(f"a task named {key!r} is already registered; pick another name or pass overwrite=True")
    _REGISTRY[key] = factory
    return obj


def _instance_factory(task: Task) -> Callable[..., Task]:
    def factory(**kwargs: Any) -> Task:
        if kwargs:
            raise TypeError(f"task {task!r} was registered as an instance and takes no options, got {sorted(kwargs)}")
        return task

    return factory


def get_task(task: str | Task, **kwargs: Any) -> Task:
    """The task registered as ``task`` (built with ``kwargs``); a ``Task`` instance is returned as is."""
    if isinstance(task, Task):
        if kwargs:
            raise TypeError(f"options {sorted(kwargs)} only apply to a task looked up by name")
        return task
    if task not in _registry():
        raise UserError(
            f"unknown eval task {task!r}; registered tasks: {available_tasks()} (add yours with register_task)"
        )
    return _REGISTRY[task](**kwargs)


def available_tasks() -> list[str]:
    return sorted(_registry())


for _builtin in (ExactMatchTask, RegexTask, NumericTask):
    register_task(_builtin)
