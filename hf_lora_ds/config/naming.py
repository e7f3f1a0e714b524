"""A refusal names a field as its values were given: ``--lora_optimizer lorafa`` to a command line,
``lora_optimizer="lorafa"`` to code. The checks write the flag form once; the resolution of a run
(``SFTTrainingArguments.__post_init__``, hf_lora_ds.launch.resolve) re-words what they raise unless the values came
from a command line (``from_command_line``)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from hf_lora_ds.errors import UserError

__all__ = ["as_field", "from_command_line", "in_code_terms", "named_as_given"]

_COMMAND_LINE: ContextVar[bool] = ContextVar("hf_lora_ds_command_line", default=False)
# A flag and the word after it, which is its value when it reads as the field's value does.
_FLAG = re.compile(r"--(\w+)(?: ([^\s,:;()]+))?")


@contextmanager
def from_command_line() -> Iterator[None]:
    """The values resolved inside come from a command line: refusals keep the flag form."""
    token = _COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _COMMAND_LINE.reset(token)


def as_field(name: str, value: object) -> str:
    """``name="text"`` for a string, ``name=value`` for anything else: how the value is written in Python."""
    return f'{name}="{value}"' if isinstance(value, str) else f"{name}={value!r}"


def in_code_terms(message: str, values: object) -> str:
    """``message`` with each ``--name value`` of a field of ``values`` as ``name="value"`` (a flag set to True with no
    value after it as ``name=True``, any other as ``name``); other text, and names that are no field, as they are."""

    def reword(match: re.Match) -> str:
        name, word = match.group(1), match.group(2)
        if not hasattr(values, name):
            return match.group(0)
        value = getattr(values, name)
        if word is not None and word == str(value):
            return as_field(name, value)
        if value is True:
            return as_field(name, True) + (f" {word}" if word is not None else "")
        return name + (f" {word}" if word is not None else "")

    return _FLAG.sub(reword, message)


@contextmanager
def named_as_given(values: object) -> Iterator[None]:
    """A ``ValueError`` raised inside (a bad value or combination: the library's own too) is a ``UserError`` that names
    the fields of ``values`` as they were given (see the module docstring)."""
    try:
        yield
    except ValueError as err:
        kind = type(err) if isinstance(err, UserError) else UserError
        if _COMMAND_LINE.get():
            raise kind(str(err)) from None
        raise kind(in_code_terms(str(err), values)) from None
