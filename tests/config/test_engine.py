from types import SimpleNamespace

import pytest

from hf_lora_ds.config.engine import check_engine_fields, parallelism_config
from hf_lora_ds.errors import UserError


def values(**changes):
    return SimpleNamespace(
        **{
            "deepspeed": None,
            "fsdp": "",
            "sequence_parallel_size": 1,
            "attn_implementation": None,
            "batching": "auto",
            **changes,
        }
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"deepspeed": "auto"}, "--deepspeed auto is resolved from the command line"),
        ({"deepspeed": "stage2", "fsdp": "full_shard"}, "choose one of FSDP and DeepSpeed"),
        ({"sequence_parallel_size": 0}, "--sequence_parallel_size must be a positive integer"),
        ({"sequence_parallel_size": 2}, "needs DeepSpeed"),
    ],
)
def test_engine_values_refused_with_the_flag(changes, message):
    check_engine_fields(values())
    with pytest.raises(UserError, match=message):
        check_engine_fields(values(**changes))


def test_no_parallelism_config_for_one_rank_per_sequence():
    assert parallelism_config(1, "sdpa") is None
    assert parallelism_config(2, "sdpa").sp_size == 2
