"""The checks of a run's values on their own (hf_lora_ds.config's and those that read files): each bad value names its
flag and what it must be, before anything is loaded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.config.arguments import check_field_values
from hf_lora_ds.config.engine import check_engine_fields
from hf_lora_ds.config.lora import check_lora_fields as check_lora
from hf_lora_ds.config.ranges import RANGES, check_ranges
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.launch.checks import (
    check_command_line_needs,
    check_paths,
    check_run_values,
    check_sequence_parallel,
    check_training_flags,
)


def check_fields(values) -> None:
    """What a run checks before it builds its arguments: the values alone, then what reads files."""
    check_field_values(values)
    check_run_values(values)


def check_ulysses(values, world_size: int) -> None:
    """--sequence_parallel_size against the flags (hf_lora_ds.config.engine), then the launch and the model."""
    check_engine_fields(values)
    check_sequence_parallel(values, world_size)


def fields(tmp_path, **changes) -> SFTTrainingArguments:
    """Parsed values as the CLI reads them, valid unless ``changes`` says otherwise."""
    train = tmp_path / "train.jsonl"
    train.write_text("{}\n")
    values = dict(
        model_name_or_path="m",
        train_file=str(train),
        eval_file=None,
        columns=None,
        sharegpt_roles=None,
        preprocessing_num_workers=None,
        max_length=16,
        batching="auto",
        pad_to_multiple_of=None,
        use_cache=False,
        lora_rank=8,
        lora_alpha=16,
        lora_dropout=0.0,
        lora_target_modules="all-linear",
        output_dir=str(tmp_path / "run"),
        dataset_cache_dir=None,
        fsdp="",
        fsdp_config=None,
        lora_init="default",
        lora_init_samples=256,
        lora_optimizer="adamw",
        loraplus_lr_ratio=None,
        load_in_4bit=False,
        load_in_8bit=False,
        use_dora=False,
        gguf_file=None,
        dtype="auto",
        bf16=False,
        fp16=False,
        deepspeed=None,
        sequence_parallel_size=1,
        attn_implementation=None,
        **{name: None for name in RANGES},
    )
    return SFTTrainingArguments.unbuilt(**{**values, **changes})


@pytest.mark.parametrize(
    ("missing", "message"),
    [("model_name_or_path", "--model_name_or_path is required"), ("train_file", "--train_file is required")],
)
def test_a_command_line_names_a_model_and_training_data(missing, message):
    named = {"model_name_or_path": "m", "train_file": "train.json"}
    check_command_line_needs(SimpleNamespace(**named))
    with pytest.raises(UserError, match=message):
        check_command_line_needs(SimpleNamespace(**{**named, missing: None}))


def test_valid_fields_pass(tmp_path):
    check_fields(fields(tmp_path))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"learning_rate": -3.0}, "--learning_rate must be at least 0, got -3.0"),
        ({"max_steps": -3}, r"--max_steps must be -1 \(train for --num_train_epochs\) or at least 1, got -3"),
        ({"seed": 2**32}, r"--seed must be in \[0, 4294967295\]"),
        ({"adam_beta2": float("nan")}, "--adam_beta2 must be in"),
    ],
)
def test_numbers_out_of_range_name_the_flag(tmp_path, changes, message):
    with pytest.raises(UserError, match=message):
        check_ranges(fields(tmp_path, **changes))


def test_lora_numbers_and_targets(tmp_path):
    with pytest.raises(UserError, match="--lora_alpha must be positive"):
        check_lora(fields(tmp_path, lora_alpha=0))
    with pytest.raises(UserError, match="--lora_target_modules is empty"):
        check_lora(fields(tmp_path, lora_target_modules=" ,"))


def test_a_yaml_list_of_sources_becomes_the_flag_text_and_missing_files_are_named(tmp_path):
    values = fields(tmp_path)
    listed = fields(tmp_path, train_file=[f"{values.train_file}:2", {"path": values.train_file, "weight": 0.5}])
    check_fields(listed)
    assert listed.train_file == f"{values.train_file}:2,{values.train_file}:0.5"
    with pytest.raises(MissingPathError, match="--eval_file gone.jsonl: no such file"):
        check_fields(fields(tmp_path, eval_file="gone.jsonl"))


def test_a_file_where_a_directory_is_needed(tmp_path):
    (tmp_path / "taken").write_text("")
    for flag in ("output_dir", "dataset_cache_dir"):
        with pytest.raises(UserError, match=rf"--{flag} .*taken/run: .*taken is a file, not a directory"):
            check_paths(fields(tmp_path, **{flag: str(tmp_path / "taken" / "run")}))
        with pytest.raises(UserError, match=rf"--{flag} .*taken: .*taken is a file, not a directory"):
            check_fields(fields(tmp_path, **{flag: str(tmp_path / "taken")}))  # the run's own checks include it
    with pytest.raises(MissingPathError, match="--fsdp_config .*: no such file"):
        check_paths(fields(tmp_path, fsdp="full_shard", fsdp_config=str(tmp_path)))  # a directory
    values = SimpleNamespace(
        report_to="none",
        torch_compile_backend=None,
        torch_compile_mode=None,
        attn_implementation="flash_attention_9",
        eval_task="sum_to_x",
    )
    with pytest.raises(UserError, match="--attn_implementation flash_attention_9: unknown; use one of"):
        check_training_flags(values)
    values.attn_implementation = "varlen_attn"  # registered only when its model loads, known before
    check_training_flags(values)


def sequence_parallel(model_dir, **changes) -> SimpleNamespace:
    """The flags --sequence_parallel_size is checked against: 2 ranks of ZeRO-2 on the tiny model (4 heads, 2 key/value
    heads) with sdpa, padded batches, valid unless ``changes`` says otherwise."""
    values = dict(
        sequence_parallel_size=2,
        deepspeed="ds_configs/stage2.json",
        attn_implementation=None,
        batching="auto",
        model_name_or_path=str(model_dir),
        gguf_file=None,
        trust_remote_code=False,
        fsdp="",
    )
    return SimpleNamespace(**{**values, **changes})


def test_sequence_parallelism_passes_what_ulysses_can_run(tiny_model_dir):
    check_ulysses(sequence_parallel(tiny_model_dir), world_size=2)
    check_ulysses(sequence_parallel(tiny_model_dir, sequence_parallel_size=4), world_size=8)  # kv 2 | 4
    check_ulysses(sequence_parallel(tiny_model_dir, deepspeed=None, sequence_parallel_size=1), world_size=1)


@pytest.mark.parametrize(
    "changes, world_size, message",
    [
        ({"sequence_parallel_size": 0}, 2, "--sequence_parallel_size must be a positive integer, got 0"),
        ({"deepspeed": None}, 2, "--sequence_parallel_size 2 needs DeepSpeed .*add --deepspeed stage2"),
        ({}, 3, "--sequence_parallel_size 2 with 3 rank.*must be a multiple of 2"),
        (
            {"attn_implementation": "eager"},
            2,
            "--attn_implementation eager with --sequence_parallel_size 2: Ulysses discards the attention mask",
        ),
        (
            {"batching": "packed"},
            2,
            "--batching packed with --sequence_parallel_size 2 and sdpa attention: Ulysses "
            "drops the mask that keeps packed samples apart",
        ),
        ({"batching": "padding_free"}, 2, "--batching padding_free with --sequence_parallel_size 2"),
        ({"sequence_parallel_size": 3}, 3, "has 4 attention heads .*2 key/value heads.*use one of 2, 4"),
        ({"sequence_parallel_size": 8}, 8, "has 4 attention heads"),
    ],
)
def test_sequence_parallelism_refused_with_one_line(tiny_model_dir, changes, world_size, message):
    with pytest.raises(UserError, match=message) as refused:
        check_ulysses(sequence_parallel(tiny_model_dir, **changes), world_size=world_size)
    assert "\n" not in str(refused.value)


def test_packing_under_sequence_parallelism_is_left_to_flash_attention(tiny_model_dir):
    """flash's varlen path reads the sample boundaries from the gathered position_ids itself (a GPU-only kernel)."""
    check_ulysses(
        sequence_parallel(tiny_model_dir, batching="packed", attn_implementation="flash_attention_2"), world_size=2
    )
