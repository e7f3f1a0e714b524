"""hf_lora_ds.launch.resolve: from a command line to a run's arguments, each step once: the DeepSpeed config in every
form ``--deepspeed`` takes (a path, a shipped short name, base64), ``--deepspeed auto``; the audit and the planner
read the same flags through the same parser."""

from __future__ import annotations

import base64
import json

import pytest

from hf_lora_ds.errors import UserError
from hf_lora_ds.launch import resolve as cli
from hf_lora_ds.resources import DEEPSPEED_CONFIGS


def encoded(name: str) -> str:
    """A shipped config as the base64 text transformers and accelerate take for ``--deepspeed``."""
    return base64.urlsafe_b64encode((DEEPSPEED_CONFIGS / name).read_bytes()).decode()


@pytest.fixture
def run_flags(tiny_model_dir, tmp_path):
    train = tmp_path / "train.jsonl"
    train.write_text('{"instruction": "1=", "output": "0 + 1"}\n')
    return ["--model_name_or_path", str(tiny_model_dir), "--train_file", str(train), "--output_dir", str(tmp_path)]


def counted(monkeypatch, module, name: str) -> list[int]:
    """Count the calls of ``module.name`` (as the module under test calls it)."""
    calls: list[int] = []
    original = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_each_check_and_each_config_load_happens_once(run_flags, monkeypatch, no_launcher):
    run_checks = counted(monkeypatch, cli, "check_run_values")
    config_loads = counted(monkeypatch, cli, "load_deepspeed_config")
    args = cli.parse_run_arguments([*run_flags, "--deepspeed", "stage2"])
    assert (len(run_checks), len(config_loads)) == (1, 1)
    assert args.deepspeed == str(DEEPSPEED_CONFIGS / "stage2.json")  # the short name, resolved as the file


@pytest.mark.parametrize("given", ["stage2", "file", "base64"])
def test_every_form_of_deepspeed_gives_the_same_run_config(given, run_flags, no_launcher):
    value = {"stage2": "stage2", "file": str(DEEPSPEED_CONFIGS / "stage2.json"), "base64": encoded("stage2.json")}
    args = cli.parse_run_arguments([*run_flags, "--deepspeed", value[given]])
    config = args.engine.deepspeed_config
    assert config["zero_optimization"]["stage"] == 2
    assert config["train_micro_batch_size_per_gpu"] == args.per_device_train_batch_size  # "auto" filled in


@pytest.mark.parametrize("form", ["file", "base64"])
def test_a_config_that_offloads_parameters_is_refused_with_4_bit_whatever_its_form(form, run_flags, no_launcher):
    value = str(DEEPSPEED_CONFIGS / "stage3_offload.json") if form == "file" else encoded("stage3_offload.json")
    with pytest.raises(UserError, match="--load_in_4bit with a DeepSpeed config that offloads parameters"):
        cli.parse_run_arguments([*run_flags, "--load_in_4bit", "--deepspeed", value])


def test_an_unknown_short_name_lists_the_shipped_configs(run_flags, no_launcher):
    with pytest.raises(UserError, match="--deepspeed stage7: no such file or shipped config; shipped: stage0, "):
        cli.parse_run_arguments([*run_flags, "--deepspeed", "stage7"])


def test_base64_that_is_not_a_json_object_is_one_line(run_flags, no_launcher):
    text = base64.urlsafe_b64encode(json.dumps([1, 2]).encode()).decode()
    with pytest.raises(UserError, match=r"--deepspeed \(base64\): the config must be a JSON object"):
        cli.parse_run_arguments([*run_flags, "--deepspeed", text])


def test_auto_is_planned_once_and_its_pick_trains(run_flags, monkeypatch, no_launcher, package_log):
    plans = counted(monkeypatch, cli, "recommended_deepspeed_config")
    args = cli.parse_run_arguments([*run_flags, "--deepspeed", "auto"])
    assert len(plans) == 1 and args.deepspeed == str(DEEPSPEED_CONFIGS / "stage0.json")
    assert "--deepspeed auto: " in package_log.read()


def test_checked_values_refuse_what_the_arguments_refuse(run_flags):
    with pytest.raises(UserError, match="--lora_rank must be a positive integer"):
        cli.read_checked_values([*run_flags, "--lora_rank", "0"])
    values = cli.read_checked_values(run_flags)
    assert values.learning_rate == 3e-3  # what is set nowhere is the demo's, as for run_sft.py


def test_unknown_flags_are_named(run_flags):
    with pytest.raises(UserError, match=r"unknown argument\(s\) \['--tokenizer', 'x'\]"):
        cli.read_run_values([*run_flags, "--tokenizer", "x"])


def test_arguments_built_in_code_check_the_config_before_anything_else(tmp_path, tiny_model_dir, no_launcher):
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 7}}))
    with pytest.raises(UserError, match="zero_optimization.stage is 7"):
        cli.build_run_arguments(
            output_dir=str(tmp_path),
            model_name_or_path=str(tiny_model_dir),
            train_file=str(config),
            deepspeed=str(config),
            report_to="none",
        )
