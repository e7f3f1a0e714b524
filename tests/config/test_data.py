from types import SimpleNamespace

import pytest

from hf_lora_ds.config.data import check_data_fields, join_sources
from hf_lora_ds.errors import UserError


def values(**changes):
    return SimpleNamespace(
        **{
            "train_file": "a.jsonl",
            "eval_file": None,
            "preprocessing_num_workers": None,
            "max_length": 16,
            "batching": "auto",
            "pad_to_multiple_of": None,
            "use_cache": False,
            **changes,
        }
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"max_length": 1}, "--max_length must be at least 2"),
        ({"batching": "packed", "use_cache": True}, "--batching packed needs --use_cache False"),
        ({"preprocessing_num_workers": 0}, "--preprocessing_num_workers must be a positive integer"),
    ],
)
def test_bad_data_values_name_the_flag(changes, message):
    check_data_fields(values())
    with pytest.raises(UserError, match=message):
        check_data_fields(values(**changes))


def test_a_yaml_list_of_sources_becomes_the_flag_text():
    listed = values(eval_file=["a.jsonl:2", {"path": "b", "weight": 0.5}, {"path": "c"}])
    join_sources(listed)
    assert listed.eval_file == "a.jsonl:2,b:0.5,c"
