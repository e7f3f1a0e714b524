"""The record formats by name: what identifies a record of each, what it reads, and its converter. Add your own::

    @register_format(fields=("q", "a"))
    def qa(record: dict, reading: Reading) -> dict:
        q, a = reading.string(record, "q"), reading.string(record, "a")
        return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}

A record is of the first registered format that holds one of the fields identifying it (the built-ins come first, in
the order ``hf_lora_ds.data.formats`` registers them), and it is read by that format alone.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hf_lora_ds.data.formats.turns import Reading, validated

__all__ = [
    "RecordFormat",
    "register_format",
    "available_formats",
    "format_of",
    "accepted_kinds",
    "known_fields",
    "fingerprint",
]

Converter = Callable[[dict, Reading], dict]
COLUMNS_HINT = "other column names can be mapped with --columns (e.g. --columns prompt=question,response=answer)"


@dataclass(frozen=True)
class RecordFormat:
    """One record format. ``convert(record, reading)`` returns ``{"messages": [...], "tools": list | None}``, its
    turns already validated through ``reading`` (as the built-ins' are), or ``{"text", "prompt_chars", "messages":
    None, "tools": None}`` for a plain-text record; a function given to :func:`register_format` is wrapped so that
    what it returns is validated for it.

    ``fields``: a record that holds one of them is of this format, and needs them all (``--columns`` names the
    column it mapped to one that is missing); ``identified_by`` narrows the fields that identify it (a TRL
    ``prompt`` does; its ``completion`` alone does not). ``reads``: every field the format reads; any other field of
    a record is named as unused. ``describe``: how the refusal of a record of no format names this one."""

    name: str
    fields: tuple[str, ...]
    convert: Converter
    reads: frozenset[str] = frozenset()
    identified_by: tuple[str, ...] = ()
    describe: str = ""

    def __post_init__(self) -> None:
        if not self.name or not self.fields:
            raise ValueError(f"a record format needs a name and the fields a record of it holds, got {self!r}")
        object.__setattr__(self, "reads", frozenset(self.reads) | set(self.fields))
        object.__setattr__(self, "identified_by", tuple(self.identified_by) or self.fields)
        object.__setattr__(self, "describe", self.describe or f"{' and '.join(map(repr, self.fields))} ({self.name})")


_FORMATS: dict[str, RecordFormat] = {}
# (field, format) in the order records are recognised by, one flat list so that finding a record's format costs the
# few `in` tests an if/elif chain would.
_IDENTIFIERS: list[tuple[str, RecordFormat]] = []


def register_format(
    obj: RecordFormat | Converter | None = None,
    *,
    name: str | None = None,
    fields: Iterable[str] = (),
    reads: Iterable[str] = (),
    identified_by: Iterable[str] = (),
    describe: str = "",
    overwrite: bool = False,
) -> Any:
    """Register a ``RecordFormat``, or a converter function (named by ``name`` or its own name) with the fields a
    record of its format holds; usable as a decorator. A function's conversation is validated as the built-ins'
    turns are (roles, contents, tool calls, training flags). Returns ``obj`` unchanged.

    A name already registered is refused unless ``overwrite`` (the format keeps its place in the order)."""
    if obj is None:
        options = {"name": name, "fields": fields, "reads": reads, "identified_by": identified_by}
        return lambda inner: register_format(inner, **options, describe=describe, overwrite=overwrite)
    if isinstance(obj, RecordFormat):
        record_format = obj
    elif callable(obj):
        key = name or obj.__name__
        convert = validated(obj, key)
        record_format = RecordFormat(key, tuple(fields), convert, frozenset(reads), tuple(identified_by), describe)
    else:
        raise TypeError(f"register_format takes a RecordFormat or a converter function, got {type(obj).__name__}")
    if record_format.name in _FORMATS and not overwrite:
        raise ValueError(
            f"a record format named {record_format.name!r} is already registered; pick another name or pass "
            "overwrite=True"
        )
    _FORMATS[record_format.name] = record_format
    _IDENTIFIERS[:] = [(key, each) for each in _FORMATS.values() for key in each.identified_by]
    return obj


def available_formats() -> list[str]:
    """The registered formats' names, in the order a record is recognised by."""
    return list(_FORMATS)


def format_of(record: dict) -> RecordFormat | None:
    """The format of ``record``: the first registered one holding a field that identifies it."""
    for key, record_format in _IDENTIFIERS:
        if key in record:
            return record_format
    return None


def accepted_kinds() -> str:
    """What a record needs, every registered format named, for the refusal of a record of none."""
    kinds = [record_format.describe for record_format in _FORMATS.values()]
    listed = ", ".join(kinds[:-1]) + ", or " + kinds[-1] if len(kinds) > 1 else "".join(kinds)
    return f"{listed}; {COLUMNS_HINT}"


def known_fields() -> set[str]:
    """Every field some format reads: what ``--columns`` may map a column to."""
    return {name for record_format in _FORMATS.values() for name in record_format.reads}


def fingerprint() -> list[tuple]:
    """The registered formats as the tokenized cache's key sees them: each one's fields and the source of the module
    its converter is defined in, so that editing a converter (or a helper beside it) tokenizes the data again."""
    return [
        (each.name, each.fields, sorted(each.reads), each.identified_by, each.describe, _source(each.convert))
        for each in _FORMATS.values()
    ]


def _source(convert: Converter) -> bytes | str:
    function = inspect.unwrap(convert)
    try:
        return Path(inspect.getsourcefile(function)).read_bytes()
    except (TypeError, OSError):  # no file: a notebook cell's function, a callable object
        pass
    try:
        return inspect.getsource(function)
    except (TypeError, OSError):
        return repr(function)  # its address: never the same twice, so never a stale cache
