"""A dataset's own names mapped to the ones the format readers know: ``--columns`` (a column for a known field,
``prompt``/``query``/``response`` as the alpaca fields) and ``--sharegpt_roles`` (ShareGPT speaker names), as
``FormatOptions``; each renamed field remembers the column it came from, so errors name what the user wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hf_lora_ds.data.formats.registry import format_of, known_fields
from hf_lora_ds.data.records import DataError

__all__ = [
    "FormatOptions",
    "FieldNames",
    "SHAREGPT_ROLES",
    "COLUMN_ALIASES",
    "map_columns",
    "parse_mapping",
]

# ShareGPT ``from`` values as LLaMA-Factory and axolotl write them.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "system": "system",
    "function_call": "function_call",  # an assistant turn whose value is a JSON tool call
    "observation": "tool",
    "tool": "tool",
}
# --columns keys that are other names for the alpaca fields.
COLUMN_ALIASES = {"prompt": "instruction", "query": "instruction", "response": "output"}


@dataclass(frozen=True)
class FormatOptions:
    """How records are read: ``columns`` maps a known field to the dataset's column, ``sharegpt_roles`` adds or
    overrides ShareGPT ``from`` names (values: user, assistant, system, tool or function_call), ``turn_keys`` are a
    ShareGPT turn's speaker and text keys (LLaMA-Factory's ``role_tag`` and ``content_tag``), ``image_dir`` is where
    relative image paths are found (LLaMA-Factory's ``media_dir``; None: beside the record's data file)."""

    columns: dict[str, str] = field(default_factory=dict)
    sharegpt_roles: dict[str, str] = field(default_factory=dict)
    turn_keys: tuple[str, str] = ("from", "value")
    image_dir: str | None = None

    def __post_init__(self) -> None:
        for key, column in self.columns.items():
            if COLUMN_ALIASES.get(key, key) not in (fields := known_fields()):
                known = sorted(fields | set(COLUMN_ALIASES))
                raise ValueError(f"--columns {key}={column}: unknown field {key!r}; map one of {known}")
        allowed = set(SHAREGPT_ROLES.values())
        for name, role in self.sharegpt_roles.items():
            if role not in allowed:
                raise ValueError(f"--sharegpt_roles {name}={role}: unknown role {role!r}; use one of {sorted(allowed)}")

    @classmethod
    def from_flags(cls, columns: str | None, sharegpt_roles: str | None) -> FormatOptions:
        return cls(parse_mapping(columns, "--columns"), parse_mapping(sharegpt_roles, "--sharegpt_roles"))


def parse_mapping(text: str | dict | None, flag: str) -> dict[str, str]:
    """``"a=b,c=d"`` (a flag) or a dict (the YAML file) as a ``{a: b, c: d}`` dict."""
    if not text:
        return {}
    if isinstance(text, dict):
        return {str(k): str(v) for k, v in text.items()}
    mapping = {}
    for pair in text.split(","):
        key, sep, value = (part.strip() for part in pair.partition("="))
        if not sep or not key or not value:
            raise ValueError(f"{flag} {text!r}: expected comma-separated key=value pairs, got {pair.strip()!r}")
        mapping[key] = value
    return mapping


class FieldNames(dict):
    """Known field -> the name the record gave it: the ``--columns`` column it was renamed from, else the field's
    own name, so that errors name what the user wrote (``field 'thought'``, not ``'reasoning'``)."""

    def __missing__(self, field_name: str) -> str:
        return field_name


def map_columns(record: dict, columns: dict[str, str], where: str) -> tuple[dict, FieldNames]:
    """Rename the dataset's columns to the known fields (``prompt``/``query`` → instruction, ``response`` → output),
    and say which column each renamed field came from.

    A record already in a known format needs none of the mapped columns, so one ``--columns`` serves a mixture of
    layouts; a record in no known format is told which mapped column it lacks.
    """
    names = FieldNames()
    if not columns:
        return record, names  # already the caller's own copy
    mapped = dict(record)
    missing = []
    for key, column in columns.items():
        if column in record:
            mapped[COLUMN_ALIASES.get(key, key)] = mapped.pop(column)
            names[COLUMN_ALIASES.get(key, key)] = column
        else:
            missing.append((key, column))
    if unmet := _unmet_columns(missing, mapped):
        key, column = unmet[0]
        raise DataError(
            f"{where}: missing field '{column}' (mapped to {key} by --columns); found fields {sorted(record)}"
        )
    return mapped, names


def _unmet_columns(missing: list[tuple[str, str]], mapped: dict) -> list[tuple[str, str]]:
    """The missing mapped columns the record needed: all of them when it is in no known format, else those of the
    fields its format needs that it still lacks (an alpaca record's instruction or output), so the user hears of their
    column, not of 'output' they never wrote."""
    if (record_format := format_of(mapped)) is None:
        return missing
    lacking = set(record_format.fields) - mapped.keys()
    return [(key, column) for key, column in missing if COLUMN_ALIASES.get(key, key) in lacking]
