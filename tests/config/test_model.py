from types import SimpleNamespace

import pytest

from hf_lora_ds.config.model import check_model_fields
from hf_lora_ds.errors import UserError


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"dtype": "bfloat16", "fp16": True}, "use --bf16"),
        ({"dtype": "float16", "bf16": True}, "use --fp16"),
    ],
)
def test_model_values_name_the_flag(changes, message):
    valid = {"model_name_or_path": "m", "dtype": "float32", "bf16": False, "fp16": False}
    check_model_fields(SimpleNamespace(**valid))
    with pytest.raises(UserError, match=message):
        check_model_fields(SimpleNamespace(**{**valid, **changes}))
