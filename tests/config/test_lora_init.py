"""hf_lora_ds.config.lora_init: each --lora_init name parsed once into what its start is and needs."""

from __future__ import annotations

import pytest

from hf_lora_ds.config.lora_init import INITS, DataPass, lora_init_from_peft, parse_lora_init
from hf_lora_ds.errors import UserError

NAMES = ("default", "gaussian", "pissa", "pissa_niter_3", "olora", "eva", "corda", "loftq", "orthogonal")


def test_what_each_init_needs():
    inits = {name: parse_lora_init(name) for name in NAMES}
    assert [name for name, init in inits.items() if init.rewrites_base] == ["pissa", "pissa_niter_3", "olora", "corda"]
    assert {name: init.data_pass for name, init in inits.items() if init.data_pass} == {
        "eva": DataPass.EVA,
        "corda": DataPass.CORDA,
    }
    assert [name for name, init in inits.items() if init.loftq] == ["loftq"]
    assert [name for name, init in inits.items() if init.needs_even_rank] == ["orthogonal"]
    assert [name for name, init in inits.items() if init.plain] == ["default"]
    assert inits["pissa_niter_3"].family == "pissa"


@pytest.mark.parametrize(
    ("name", "peft_value"),
    [
        ("default", True),
        ("loftq", True),
        ("gaussian", "gaussian"),
        ("pissa_niter_4", "pissa_niter_4"),
        ("eva", "eva"),
        ("corda", "corda"),
    ],
)
def test_peft_s_value(name, peft_value):
    assert parse_lora_init(name).peft_value == peft_value


@pytest.mark.parametrize("name", ["svd", "pissa_niter_x", "pissa_niter_", "Default"])
def test_an_unknown_name_is_one_line(name):
    with pytest.raises(UserError, match=f"--lora_init {name}: ") as raised:
        parse_lora_init(name)
    assert "\n" not in str(raised.value)


def test_every_listed_name_but_the_pattern_parses():
    assert all(parse_lora_init(name).name == name for name in INITS if name != "pissa_niter_N")


def test_an_adapter_built_elsewhere_is_described_from_peft_s_value():
    assert lora_init_from_peft(True).plain
    assert lora_init_from_peft("olora").rewrites_base
    unlisted = lora_init_from_peft(False)
    assert (unlisted.name, unlisted.plain, unlisted.rewrites_base, unlisted.data_pass) == ("False", False, False, None)
