"""One resolution of a run: every refusal of ``resolve_run`` is given the same one line from a command line
(``hf_lora_ds.cli.run.parse_args``) and from code (``LoraSFTTrainer(model, SFTTrainingArguments(...))``), the field
named ``--name value`` there and ``name="value"`` here, before any model loads."""

from __future__ import annotations

import json
import re

import pytest

from hf_lora_ds import LoraSFTTrainer, SFTTrainingArguments
from hf_lora_ds.cli.run import parse_args
from hf_lora_ds.errors import UserError
from hf_lora_ds.launch import resolve
from hf_lora_ds.resources import DEEPSPEED_CONFIGS
from hf_lora_ds.trainer import run_inputs

# (the values that are refused, a part of the command line's refusal): one case per place resolve_run refuses.
# "{tmp}" is the test's folder; files named in the values are written by the ``written`` fixture.
CASES: list[tuple[dict, str]] = [
    # check_field_values, part by part (SFTTrainingArguments.__post_init__ in code)
    ({"lora_rank": 0}, "--lora_rank must be a positive integer"),
    ({"learning_rate": -1.0}, "--learning_rate must be at least 0, got -1.0"),
    ({"load_in_4bit": True, "load_in_8bit": True}, "--load_in_4bit"),
    ({"fsdp": "full_shard", "deepspeed": "stage2"}, "choose one of FSDP and DeepSpeed"),
    ({"sequence_parallel_size": 0}, "--sequence_parallel_size must be a positive integer, got 0"),
    ({"sequence_parallel_size": 2}, "--sequence_parallel_size 2 needs DeepSpeed"),
    ({"lora_init": "pissa_niter_x"}, "--lora_init pissa_niter_x: N in pissa_niter_N"),
    # check_run_values: the paths, the data format, the LoRA variant
    ({"train_file": "{tmp}/missing.jsonl"}, "--train_file {tmp}/missing.jsonl: no such file"),
    ({"output_dir": "{tmp}/a_file/run"}, "--output_dir {tmp}/a_file/run: {tmp}/a_file is a file"),
    ({"fsdp": "full_shard", "fsdp_config": "{tmp}/missing.json"}, "--fsdp_config {tmp}/missing.json: no such file"),
    ({"columns": "nonsense=text"}, "--columns nonsense=text: unknown field"),
    ({"lora_init": "loftq"}, "--lora_init loftq fits the adapter to the 4-bit quantisation error"),
    ({"lora_init": "pissa", "load_in_4bit": True}, "--lora_init pissa with --load_in_4bit"),
    ({"lora_init": "orthogonal", "lora_rank": 7}, "--lora_init orthogonal needs an even --lora_rank, got 7"),
    ({"lora_init": "pissa", "fsdp": "full_shard"}, "--lora_init pissa with --fsdp"),
    ({"lora_init": "pissa", "use_dora": True}, "--lora_init pissa with --use_dora"),
    ({"lora_init_samples": 0}, "--lora_init_samples must be a positive integer, got 0"),
    ({"loraplus_lr_ratio": 4.0}, "--loraplus_lr_ratio 4.0 has no effect with --lora_optimizer adamw"),
    ({"lora_optimizer": "loraplus", "loraplus_lr_ratio": 0.5}, "--loraplus_lr_ratio must be a finite number"),
    ({"lora_optimizer": "lorafa", "use_dora": True}, "--lora_optimizer lorafa with --use_dora"),
    # the dict-valued flags (check_field_values), the names libraries list (check_training_flags)
    ({"accelerator_config": "{bad"}, "--accelerator_config '{bad': not valid JSON"),
    ({"accelerator_config": "{tmp}/missing.json"}, "--accelerator_config {tmp}/missing.json: no such file"),
    ({"report_to": "nowhere"}, "--report_to nowhere: unknown"),
    ({"torch_compile_backend": "nowhere"}, "--torch_compile_backend nowhere: unknown"),
    ({"torch_compile_mode": "nowhere"}, "--torch_compile_mode nowhere: unknown"),
    ({"attn_implementation": "nowhere"}, "--attn_implementation nowhere: unknown"),
    ({"eval_task": "nowhere"}, "--eval_task nowhere: unknown"),
    # check_engine: the DeepSpeed or FSDP config against the batch, the LoRA optimizer and a quantized base
    ({"deepspeed": "stage7"}, "--deepspeed stage7: no such file or shipped config"),
    ({"deepspeed": "{tmp}/stage7.json"}, "zero_optimization.stage is 7"),
    ({"deepspeed": "{tmp}/micro4.json", "per_device_train_batch_size": 2}, "train_micro_batch_size_per_gpu"),
    ({"lora_optimizer": "lorafa", "deepspeed": "stage2"}, "--lora_optimizer lorafa with ZeRO stage 2"),
    ({"lora_optimizer": "loraplus", "deepspeed": "{tmp}/with_optimizer.json"}, '"optimizer" section'),
    ({"lora_optimizer": "lorafa", "fsdp": "full_shard"}, "--lora_optimizer lorafa with FSDP"),
    ({"fsdp": "full_shard", "fsdp_config": "{tmp}/fsdp1.json"}, "--fsdp_config version 1: hf_lora_ds runs FSDP2"),
    ({"fsdp": "full_shard", "fsdp_config": "{tmp}/offload.json"}, "FSDP cpu_offload moves parameters"),
    ({"load_in_4bit": True, "deepspeed": "stage3_offload"}, "--load_in_4bit with a DeepSpeed config that offloads"),
    (
        {"sequence_parallel_size": 2, "deepspeed": "{tmp}/no_reduce_scatter.json", "world": 2},
        "--sequence_parallel_size 2 with ZeRO-3 and reduce_scatter false",
    ),
    # check_sequence_parallel: the launch and the model's heads
    ({"sequence_parallel_size": 2, "deepspeed": "stage2"}, "--sequence_parallel_size 2 with 1 rank(s)"),
    ({"sequence_parallel_size": 3, "deepspeed": "stage2", "world": 3}, "--sequence_parallel_size 3: "),
]


@pytest.fixture
def written(tmp_path, tiny_model_dir):
    """The run's valid base (the tiny model, one training record) and the files the cases name."""
    (tmp_path / "train.jsonl").write_text('{"instruction": "1=", "output": "0 + 1"}\n')
    (tmp_path / "a_file").write_text("")
    stage2 = json.loads((DEEPSPEED_CONFIGS / "stage2.json").read_text())
    stage3 = json.loads((DEEPSPEED_CONFIGS / "stage3.json").read_text())
    configs = {
        "stage7.json": {"zero_optimization": {"stage": 7}},
        "micro4.json": {**stage2, "train_micro_batch_size_per_gpu": 4},
        "with_optimizer.json": {**stage2, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}},
        "no_reduce_scatter.json": {
            **stage3,
            "zero_optimization": {**stage3["zero_optimization"], "reduce_scatter": False},
        },
        "fsdp1.json": {"version": 1},
        "offload.json": {"version": 2, "cpu_offload": True},
    }
    for name, config in configs.items():
        (tmp_path / name).write_text(json.dumps(config))
    return {
        "model_name_or_path": str(tiny_model_dir),
        "train_file": str(tmp_path / "train.jsonl"),
        "output_dir": str(tmp_path / "run"),
        "report_to": "none",
    }


@pytest.fixture
def no_model_loads(monkeypatch):
    """Reaching the model loader fails the test: every refusal comes before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("the model loader was reached")

    monkeypatch.setattr(run_inputs, "load_base_model", refuse)


def command_line(values: dict) -> list[str]:
    return [part for name, value in values.items() for part in (f"--{name}", str(value))]


def plain(line: str) -> str:
    """The refusal without its naming: ``--name`` and ``name="value"`` / ``name=value`` / ``name=True`` as ``name``
    and ``name value``."""
    line = re.sub(r"\b(\w+)=True\b", r"\1", line)
    line = re.sub(r'\b(\w+)="([^"]*)"', r"\1 \2", line)
    line = re.sub(r"\b(\w+)=(\S+)", r"\1 \2", line)
    return re.sub(r"--(\w+)", r"\1", line)


@pytest.mark.parametrize(("changes", "part"), CASES, ids=[part[:40] for _, part in CASES])
def test_each_refusal_is_the_same_line_from_the_command_line_and_from_code(
    changes, part, written, tmp_path, monkeypatch, no_launcher, no_model_loads
):
    changes = {
        name: value.replace("{tmp}", str(tmp_path)) if isinstance(value, str) else value
        for name, value in changes.items()
    }
    world = changes.pop("world", 1)
    monkeypatch.setattr(resolve, "launcher_world_size", lambda: world)  # a launch of that many ranks, for the checks
    values = {**written, **changes}
    with pytest.raises(UserError) as from_flags:
        parse_args(command_line(values))
    with pytest.raises(UserError) as from_code:
        LoraSFTTrainer(values["model_name_or_path"], SFTTrainingArguments(**values))
    flags_line, code_line = str(from_flags.value), str(from_code.value)
    assert part.replace("{tmp}", str(tmp_path)) in flags_line
    assert "\n" not in flags_line and "\n" not in code_line
    assert plain(code_line) == plain(flags_line)
    assert not any(f"--{name}" in code_line for name in values), code_line  # in code, no flag is named


def test_in_code_a_field_is_named_as_python_writes_it(written, no_launcher, no_model_loads):
    with pytest.raises(
        UserError, match='^lora_optimizer="lorafa" with ZeRO stage 2 \\(deepspeed=".*stage2.json"\\): LoRA-FA'
    ):
        LoraSFTTrainer(
            written["model_name_or_path"], SFTTrainingArguments(**written, lora_optimizer="lorafa", deepspeed="stage2")
        )
    with pytest.raises(UserError, match="^--lora_optimizer lorafa with ZeRO stage 2"):
        parse_args(command_line({**written, "lora_optimizer": "lorafa", "deepspeed": "stage2"}))


def test_arguments_resolved_from_a_command_line_are_not_checked_again(written, monkeypatch, no_launcher):
    args = parse_args(command_line(written))
    calls = []
    monkeypatch.setattr(resolve, "check_run", calls.append)
    assert resolve.resolve_arguments(args) is args and calls == []
    built = SFTTrainingArguments(**written)
    resolve.resolve_arguments(built)
    resolve.resolve_arguments(built)
    assert calls == [built]  # once, then resolved
