"""Byte counts as a person reads them: ``687.8 MiB``, ``3.81 GiB`` (not ``4088000512``).

Binary units, as nvidia-smi, ``free -h`` and the run's memory tables use; MiB below one GiB, GiB from there, so a
size is never more than four digits before its decimals.
"""

from __future__ import annotations

__all__ = ["format_bytes"]

_MIB = 2**20
_GIB = 2**30


def format_bytes(n_bytes: float) -> str:
    """``4088000512`` -> ``"3.81 GiB"``, ``721223680`` -> ``"687.8 MiB"``."""
    if abs(n_bytes) >= _GIB:
        return f"{n_bytes / _GIB:.2f} GiB"
    return f"{n_bytes / _MIB:.1f} MiB"
