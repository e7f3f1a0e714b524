from types import SimpleNamespace

import pytest

from hf_lora_ds.config.lora import check_lora_fields
from hf_lora_ds.errors import UserError


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"lora_rank": 0}, "--lora_rank must be a positive integer"),
        ({"lora_alpha": 0}, "--lora_alpha must be positive"),
        ({"lora_dropout": 1.0}, r"--lora_dropout must be in \[0, 1\)"),
        ({"lora_target_modules": " , "}, "--lora_target_modules is empty"),
        ({"lora_target_experts": " , "}, "--lora_target_experts is empty; use auto, none or names"),
        ({"lora_expert_rank": 0}, "--lora_expert_rank must be a positive integer, got 0"),
    ],
)
def test_lora_values_name_the_flag(changes, message):
    valid = {
        "lora_rank": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "lora_target_modules": "all-linear",
        "lora_target_experts": "auto",
        "lora_expert_rank": 4,
    }
    check_lora_fields(SimpleNamespace(**valid))
    with pytest.raises(UserError, match=message):
        check_lora_fields(SimpleNamespace(**{**valid, **changes}))
