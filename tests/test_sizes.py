"""Sizes read in MiB below one GiB and in GiB from there, never as raw byte counts."""

from __future__ import annotations

import pytest

from hf_lora_ds.sizes import format_bytes


@pytest.mark.parametrize(
    ("n_bytes", "shown"),
    [
        (4088000512, "3.81 GiB"),
        (721223680, "687.8 MiB"),
        (2**30, "1.00 GiB"),
        (2**30 - 2**20, "1023.0 MiB"),
        (0, "0.0 MiB"),
    ],
)
def test_format_bytes(n_bytes, shown):
    assert format_bytes(n_bytes) == shown


@pytest.mark.parametrize("n_bytes", [-1, -3 * 2**20, -2 * 2**30])
def test_a_negative_size_is_refused(n_bytes):
    with pytest.raises(ValueError, match="cannot be negative"):
        format_bytes(n_bytes)
