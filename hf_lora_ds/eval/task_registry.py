"""The registry that names eval tasks: the built-in ones, and yours. Add one with a class or a function::

@register_task(max_new_tokens=8)
def yes_no(output: str, sample: Sample) -> bool:
    return output.strip().lower() == sample.reference.strip().lower()
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hf_lora_ds.errors import UserError
from hf_lora_ds.eval.sum_to_x import SumToXTask
from hf_lora_ds.eval.tasks import ExactMatchTask, NumericTask, RegexTask, Sample, Task, Verdict

__all__ = ["register_task", "get_task", "available_tasks"]


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
    if key in _REGISTRY and not overwrite:
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
    if task not in _REGISTRY:
        raise UserError(
            f"unknown eval task {task!r}; registered tasks: {available_tasks()} (add yours with register_task)"
        )
    return _REGISTRY[task](**kwargs)


def available_tasks() -> list[str]:
    return sorted(_REGISTRY)


for _builtin in (ExactMatchTask, RegexTask, NumericTask, SumToXTask):
    register_task(_builtin)
