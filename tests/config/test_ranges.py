from types import SimpleNamespace

import pytest

from hf_lora_ds.config.ranges import RANGES, check_ranges
from hf_lora_ds.errors import UserError


@pytest.mark.parametrize(
    "name, value", [("learning_rate", -3.0), ("max_steps", -3), ("seed", 2**32), ("adam_beta2", float("nan"))]
)
def test_a_value_out_of_range_names_its_flag(name, value):
    unset = {flag: None for flag in RANGES}
    check_ranges(SimpleNamespace(**unset))
    with pytest.raises(UserError, match=f"--{name} must be"):
        check_ranges(SimpleNamespace(**{**unset, name: value}))
