"""Which of a run's arguments differ from their defaults: the report lists those first, the ~150 others folded away.

The baseline is each field's declared default, not a freshly built arguments object: building one runs
``__post_init__``, which sets up the devices and process state (on rank 0 alone, at the end of a distributed run)
and, for SFTTrainingArguments, needs a model and data to exist. ``__post_init__`` also rewrites some defaults into
an equivalent form (``report_to="none"`` -> ``[]``, ``gradient_checkpointing=None`` -> ``False``,
``accelerator_config=None`` -> its dict of defaults) and ``to_dict`` masks every ``*_token``; those count as
unchanged, so they do not bury what the user set. A default resolved into a choice (``dtype="auto"`` ->
``"float32"``) does count: the table shows it next to the default it came from.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from transformers import TrainingArguments
from transformers.trainer_pt_utils import AcceleratorConfig

__all__ = ["declared_defaults", "split_arguments"]

# What TrainingArguments.__post_init__ makes of its None default for these (a dict of the config object's fields).
_EXPANDED_DEFAULTS = {"accelerator_config": AcceleratorConfig}


def _plain(value: Any) -> Any:
    """A default in the form ``TrainingArguments.to_dict`` gives values: enums as their values."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def declared_defaults(args: TrainingArguments) -> dict[str, Any]:
    """Each init field's declared default for ``type(args)`` (fields without one, such as a required path, are
    left out and so always count as changed)."""
    defaults: dict[str, Any] = {}
    for field in dataclasses.fields(args):
        if not field.init:
            continue
        if field.default is not dataclasses.MISSING:
            defaults[field.name] = _plain(field.default)
        elif field.default_factory is not dataclasses.MISSING:
            defaults[field.name] = _plain(field.default_factory())
    return defaults


def _unset(value: Any) -> bool:
    """None and the empty forms ``__post_init__`` turns it into (``False``, ``[]``, ``"none"``); not 0."""
    if value is None or value is False:
        return True
    if isinstance(value, str):
        return value in ("", "none")
    return isinstance(value, (list, tuple, dict)) and not value


def _is_default(key: str, value: Any, default: Any) -> bool:
    if key.endswith("_token"):
        return True  # to_dict masks it: whether the user set one cannot be told (nor shown)
    if default is None and key in _EXPANDED_DEFAULTS and isinstance(value, dict):
        # compared on the keys the run's dict has: __post_init__ pops some (use_configured_state) after reading them
        expanded = _EXPANDED_DEFAULTS[key]().to_dict()
        return value.keys() <= expanded.keys() and all(expanded[name] == item for name, item in value.items())
    if value == default:
        return True
    return _unset(value) and _unset(default)


def split_arguments(
    arguments: dict[str, Any], defaults: dict[str, Any]
) -> tuple[dict[str, tuple[Any, Any]], dict[str, Any]]:
    """``(changed, unchanged)``, each sorted by name: ``changed`` maps a name to ``(value, default)``, the default
    None where there is none; ``unchanged`` maps a name to its value."""
    changed: dict[str, tuple[Any, Any]] = {}
    unchanged: dict[str, Any] = {}
    for key, value in sorted(arguments.items()):
        if key in defaults and _is_default(key, value, defaults[key]):
            unchanged[key] = value
        else:
            changed[key] = (value, defaults.get(key))
    return changed, unchanged
