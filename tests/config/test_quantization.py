from types import SimpleNamespace

import pytest

from hf_lora_ds.config.quantization import check_quantization_fields
from hf_lora_ds.errors import UserError


def test_one_quantization_and_no_fsdp():
    check_quantization_fields(SimpleNamespace(load_in_4bit=True, load_in_8bit=False, fsdp=""))
    with pytest.raises(UserError, match="--load_in_4bit and --load_in_8bit: choose one"):
        check_quantization_fields(SimpleNamespace(load_in_4bit=True, load_in_8bit=True, fsdp=""))
    with pytest.raises(UserError, match="--load_in_8bit with FSDP"):
        check_quantization_fields(SimpleNamespace(load_in_4bit=False, load_in_8bit=True, fsdp="full_shard"))
