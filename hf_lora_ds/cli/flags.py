"""One spelling per flag across the commands: an old spelling is still accepted, with one line on stderr."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

__all__ = ["BASE_MODEL_SPELLINGS", "respell"]

# The base model is --model_name_or_path everywhere, as in run_sft.py; eval said --model and merge --base.
BASE_MODEL_SPELLINGS = {"--model": "--model_name_or_path", "--base": "--model_name_or_path"}


def respell(argv: Sequence[str], old_spellings: Mapping[str, str], command: str) -> list[str]:
    """``argv`` with each old flag spelling (``--old value`` or ``--old=value``) replaced by the current one, and a
    deprecation line on stderr for each old spelling used."""
    respelled = []
    for argument in argv:
        flag, equals, value = argument.partition("=")
        if flag in old_spellings:
            new = old_spellings[flag]
            print(f"{command}: {flag} is deprecated; use {new}", file=sys.stderr)
            argument = f"{new}{equals}{value}"
        respelled.append(argument)
    return respelled
