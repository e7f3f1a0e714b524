"""Byte counts as a person reads them: ``687.8 MiB``, ``3.81 GiB`` (not ``4088000512``).

Binary units, as nvidia-smi, ``free -h`` and the run's memory tables use; MiB below one GiB, GiB from there, so a
size is never more than four digits before its decimals.
"""

from __future__ import annotations

__all__ = ["format_bytes"]

_MIB = 2**20
_GIB = 2**30


def format_bytes(n_bytes: float) -> str:
    """``4088000512`` -> ``"3.81 GiB"``, ``721223680`` -> ``"687.8 MiB"``. A size is never negative: a negative
    count is a bug in its caller (a difference taken the wrong way round), refused rather than shown."""
    if n_bytes < 0:
        raise ValueError(f"a size cannot be negative: {n_bytes} bytes")
    if n_bytes >= _GIB:
        return f"{n_bytes / _GIB:.2f} GiB"
    return f"{n_bytes / _MIB:.1f} MiB"
