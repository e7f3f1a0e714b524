"""The sum-to-x task: given ``{x}=``, answer ``<prefix>a + b`` with integers a + b = x.

The exact rule (what counts as an integer, where the prefix comes from, the one reason a wrong completion gets) is
``SumToXTask``'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hf_lora_ds.data.records import DataError
from hf_lora_ds.eval.tasks import EMPTY_OUTPUT, Sample, Task, Verdict

__all__ = ["DEFAULT_PREFIX", "SumToXTask"]

DEFAULT_PREFIX = "王大丫丫的回答是--->"

_INT = r"-?[0-9]+"
# `a + b` at the start of the text; the lookahead keeps `4.5` or `45` from being read as `4` plus extra text.
_LEADING_SUM = re.compile(rf"({_INT})\s*\+\s*({_INT})(?![0-9.])")
_REFERENCE = re.compile(rf"(.*?)\s*{_INT}\s*\+\s*{_INT}\s*", re.DOTALL)
_X = re.compile(rf"({_INT})\s*=")


@dataclass(frozen=True)
class _Target:
    x: int
    prefix: str


class SumToXTask(Task):
    """Score ``<prefix>a + b`` completions of ``{x}=`` prompts.

    The rule, decided here because "any two integers" leaves it open:

    - The answer is the prefix, then ``a + b``. Whitespace at either end of the completion, between the prefix and
      ``a``, and around ``+`` is ignored, so ``1+4`` counts like ``1 + 4``.
    - a and b are written as ``-?[0-9]+`` (ASCII digits, optional minus, leading zeros allowed). Zero and negative
      integers count: ``-3 + 8`` for x = 5 is a true answer, and the task asks for any two integers, not for positive
      ones. ``+3``, ``3.0``, ``1e3`` or full-width digits are not integers.
    - The prefix is whatever the record's reference output puts before its own ``a + b``, so a data set with another
      prefix needs no option; if the reference has no ``a + b`` at its end, the task's ``prefix`` (default
      ``王大丫丫的回答是--->``) is used. x is the last ``{x}=`` in the final user turn.

    A wrong completion gets exactly one reason, checked in this order: ``empty output``, ``no prefix``, ``not
    integers`` (what follows the prefix does not start with ``a + b``), ``extra text`` (a valid ``a + b`` followed by
    anything but whitespace, including a second line or a special token), ``wrong sum``.
    """

    name = "sum_to_x"

    def __init__(self, prefix: str = DEFAULT_PREFIX) -> None:
        self.prefix = prefix

    def target(self, prompt: list[dict[str, str]], reference: str, where: str) -> _Target:
        users = [message["content"] for message in prompt if message["role"] == "user"]
        found = _X.findall(users[-1]) if users else []
        if not found:
            raise DataError(
                f"{where}: field 'instruction' (or the last user message): sum_to_x needs the prompt to contain "
                f"'{{x}}=', e.g. '11='; got {(users or [''])[-1][:40]!r}"
            )
        matched = _REFERENCE.fullmatch(reference)
        return _Target(int(found[-1]), matched.group(1) if matched else self.prefix)

    def score(self, output: str, sample: Sample) -> Verdict:
        text = output.strip()
        if not text:
            return Verdict(False, None, EMPTY_OUTPUT)
        prefix = sample.target.prefix
        if not text.startswith(prefix):
            return Verdict(False, None, "no prefix")
        rest = text[len(prefix) :].lstrip()
        match = _LEADING_SUM.match(rest)
        if match is None:
            return Verdict(False, rest or None, "not integers")
        a, b = int(match.group(1)), int(match.group(2))
        answer = f"{a} + {b}"
        if rest[match.end() :].strip():
            return Verdict(False, answer, "extra text")
        if a + b != sample.target.x:
            return Verdict(False, answer, "wrong sum")
        return Verdict(True, answer)
