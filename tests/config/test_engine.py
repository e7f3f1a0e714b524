import base64
import json
from types import SimpleNamespace

import pytest

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.engine import Engine, check_engine_fields, engine_of, parallelism_config
from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.errors import UserError
from hf_lora_ds.launch import resolve
from hf_lora_ds.resources import DEEPSPEED_CONFIGS
from tests.launch.test_accelerate_launch import ZERO3_CPU


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
        # Kernels and batchings Ulysses would run with the samples' mask dropped (attending across samples)
        ({"deepspeed": "stage2", "sequence_parallel_size": 2, "attn_implementation": "eager"}, "eager with"),
        (
            {"deepspeed": "stage2", "sequence_parallel_size": 2, "attn_implementation": "flex_attention"},
            "flex_attention",
        ),
        (
            {"deepspeed": "stage2", "sequence_parallel_size": 2, "attn_implementation": "paged|sdpa"},
            r"--attn_implementation paged\|sdpa with",
        ),
        ({"deepspeed": "stage2", "sequence_parallel_size": 2, "batching": "packed"}, "--batching packed with"),
        (
            {"deepspeed": "stage2", "sequence_parallel_size": 2, "attn_implementation": "varlen_attn"},
            "--attn_implementation varlen_attn with --sequence_parallel_size 2: Ulysses is not proven",
        ),
        ({"deepspeed": "stage2", "sequence_parallel_size": 2, "batching": "padding_free"}, "--batching padding_free"),
    ],
)
def test_engine_values_refused_with_the_flag(changes: dict, message: str) -> None:
    """Each engine combination that would fail later, or train wrongly without a word, is refused naming its flag."""
    check_engine_fields(values())
    check_engine_fields(values(deepspeed="stage2", sequence_parallel_size=2))  # Ulysses on sdpa, padded: accepted
    with pytest.raises(UserError, match=message):
        check_engine_fields(values(**changes))


def test_no_parallelism_config_for_one_rank_per_sequence():
    assert parallelism_config(1, "sdpa") is None
    assert parallelism_config(2, "sdpa").sp_size == 2


def test_the_engine_kind_follows_the_flags():
    assert SFTTrainingArguments.unbuilt().engine == Engine("none")
    assert SFTTrainingArguments.unbuilt(fsdp="full_shard").engine == Engine("fsdp")
    assert SFTTrainingArguments.unbuilt(deepspeed="stage2").engine.kind == "deepspeed"


def test_a_shipped_short_name_is_read_from_its_file():
    engine = SFTTrainingArguments.unbuilt(deepspeed="stage3_offload").engine
    assert engine.deepspeed_file == DEEPSPEED_CONFIGS / "stage3_offload.json"
    assert engine.zero == ZeroSettings(3, "cpu", "cpu")


def test_a_json_path_base64_text_and_a_dict_give_the_same_decision(tmp_path):
    written = {"zero_optimization": {"stage": 1}}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(written))
    encoded = base64.urlsafe_b64encode(json.dumps(written).encode()).decode()
    from_file, from_text, from_dict = (
        SFTTrainingArguments.unbuilt(deepspeed=value).engine for value in (str(path), encoded, written)
    )
    assert from_file.deepspeed_file == path and from_text.deepspeed_file is None and from_dict.deepspeed_file is None
    assert from_file.zero == from_text.zero == from_dict.zero == ZeroSettings(1)


def test_auto_is_deepspeed_with_the_config_left_to_the_plan():
    engine = SFTTrainingArguments.unbuilt(deepspeed="auto").engine
    assert (engine.kind, engine.deepspeed_config, engine.deepspeed_file) == ("deepspeed", None, None)
    assert engine.zero.stage == 0


def test_the_config_transformers_built_is_the_one_read():
    """Once TrainingArguments is built, its live dict (Trainer fills its "auto" values in place) is the config."""
    built = {"zero_optimization": {"stage": 2}}
    engine = engine_of(
        SimpleNamespace(deepspeed="stage3", fsdp=None, hf_deepspeed_config=SimpleNamespace(config=built))
    )
    assert engine.deepspeed_config is built
    assert engine_of(SimpleNamespace(deepspeed=None, fsdp=[], hf_deepspeed_config=None)).deepspeed_config is None


def test_sequence_and_data_parallel_sizes():
    engine = SFTTrainingArguments.unbuilt(deepspeed="stage2", sequence_parallel_size=2).engine
    assert (engine.sequence_parallel, engine.data_parallel_size(8)) == (2, 4)
    assert SFTTrainingArguments.unbuilt().engine.data_parallel_size(8) == 8
    assert engine_of(SimpleNamespace(deepspeed=None, fsdp=None)).sequence_parallel == 1  # a plain TrainingArguments


def test_the_engine_is_decided_again_when_the_launch_resolves_its_flags(monkeypatch):
    monkeypatch.setattr(resolve, "recommended_deepspeed_config", lambda values: DEEPSPEED_CONFIGS / "stage1.json")
    values = SFTTrainingArguments.unbuilt(deepspeed="auto")
    resolve.resolve_launch(values)
    assert values.engine.zero.stage == 1


def test_an_accelerate_launch_deepspeed_config_is_the_engine(monkeypatch):
    for name, value in ZERO3_CPU.items():
        monkeypatch.setenv(name, value)
    values = SFTTrainingArguments.unbuilt()
    resolve.resolve_launch(values)
    engine = values.engine
    assert (engine.kind, engine.deepspeed_file, engine.zero) == ("deepspeed", None, ZeroSettings(3, "cpu", "cpu"))
