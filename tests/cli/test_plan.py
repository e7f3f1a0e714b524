"""``python -m hf_lora_ds.plan``: the table and ``--json`` from flags or run_sft's YAML file, real Qwen2.5 shapes,
the batch search, and bad input as one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_lora_ds.cli.plan import main
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.resources import MODEL_CONFIGS

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(path.name for folder in ("ds_configs", "fsdp_configs") for path in (REPO / folder).glob("*.json"))
MODEL_7B = str(MODEL_CONFIGS / "qwen2.5-7b-instruct")
GPU_FLAGS = [
    "--device",
    "gpu",
    "--device_memory",
    "24GiB",
    "--max_length",
    "1024",
    "--per_device_train_batch_size",
    "4",
]


def plan_json(argv: list[str], capsys) -> list[dict]:
    main([*argv, "--json"])
    return json.loads(capsys.readouterr().out)


def row(rows: list[dict], config: str, gc: bool) -> dict:
    return next(r for r in rows if r["config"] == config and r["gradient_checkpointing"] == gc)


def test_json_has_a_row_per_configuration_and_checkpointing(capsys):
    rows = plan_json(["--model_name_or_path", MODEL_7B, "--world_size", "2", *GPU_FLAGS], capsys)
    assert sorted({r["config"] for r in rows}) == sorted(["none", *SHIPPED])
    assert len(rows) == 2 * (1 + len(SHIPPED))
    for r in rows:
        assert {"config", "gradient_checkpointing", "device_bytes", "host_bytes", "fits", "max_batch_size"} <= set(r)
        assert r["device_bytes"] == sum(r["device_items"].values())
        assert r["fits"] == (r["max_batch_size"] >= 4)  # the batch search agrees with the row's own verdict
    # 7B in bf16 (15.2 GB of weights) on 24 GiB cards: ZeRO-3 halves the weights, offload moves them out
    zero2, zero3 = row(rows, "stage2.json", True), row(rows, "stage3.json", True)
    assert zero3["device_items"]["frozen weights"] == zero2["device_items"]["frozen weights"] // 2 > 7 * 10**9
    assert zero3["device_bytes"] < zero2["device_bytes"] - 4 * 2**30  # less the weights it keeps gathered (1e9)
    assert row(rows, "stage3_offload.json", True)["device_bytes"] < row(rows, "stage3.json", True)["device_bytes"]
    assert not row(rows, "none", False)["fits"]


def test_yaml_file_plans_like_the_same_flags(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {"model_name_or_path": MODEL_7B, "max_length": 1024, "lora_rank": 32, "per_device_train_batch_size": 4}
        )
    )
    from_file = plan_json([str(config), "--world_size", "2", "--device", "gpu", "--device_memory", "24GiB"], capsys)
    from_flags = plan_json(
        ["--model_name_or_path", MODEL_7B, "--lora_rank", "32", "--world_size", "2", *GPU_FLAGS], capsys
    )
    assert from_file == from_flags
    rank8 = plan_json(["--model_name_or_path", MODEL_7B, "--world_size", "2", *GPU_FLAGS], capsys)
    assert (
        row(from_file, "none", True)["device_items"]["LoRA weights"]
        == 4 * row(rank8, "none", True)["device_items"]["LoRA weights"]
    )


def test_14b_on_two_32gb_gpus_needs_zero3(capsys):
    argv = [
        "--model_name_or_path",
        str(MODEL_CONFIGS / "qwen2.5-14b-instruct"),
        "--world_size",
        "2",
        "--device",
        "gpu",
        "--device_memory",
        "32GB",
        "--max_length",
        "1024",
        "--per_device_train_batch_size",
        "1",
    ]
    rows = plan_json(argv, capsys)
    assert not any(r["fits"] for r in rows if r["config"] in ("none", "stage0.json", "stage1.json", "stage2.json"))
    assert row(rows, "stage3.json", True)["fits"]
    main(argv)
    table = capsys.readouterr().out
    assert "Recommended: ds_configs/stage3.json with gradient checkpointing" in table


def test_train_file_lengths_are_used(tiny_model_dir, tmp_path, capsys):
    """With data and a tokenizer the worst batch is the data's, not max_length's: a smaller estimate."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"instruction": "2+3", "output": "5"}) + "\n" for _ in range(8)))
    argv = [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--max_length",
        "512",
        "--use_cpu",
        "true",
        "--dataset_cache_dir",
        str(tmp_path / "cache"),
    ]
    unknown = row(plan_json(argv, capsys), "none", False)["device_items"]
    real = row(plan_json([*argv, "--train_file", str(data)], capsys), "none", False)["device_items"]
    assert real["logits and loss"] < unknown["logits and loss"] / 20
    assert real["activations"] < unknown["activations"] / 10


@pytest.mark.parametrize(
    "argv, error, match",
    [
        (["--model_name_or_path", "/no/such/model"], MissingPathError, "--model_name_or_path /no/such/model: no such"),
        (["--model_name_or_path", MODEL_7B, "--device_memory", "lots"], UserError, "--device_memory 'lots'"),
        (["--model_name_or_path", MODEL_7B, "--headroom", "1.5"], UserError, "--headroom"),
        (["--model_name_or_path", MODEL_7B, "--world_size", "3", "--nproc_per_node", "2"], UserError, "whole nodes"),
    ],
)
def test_bad_input_is_a_user_error(argv, error, match):
    with pytest.raises(error, match=match):
        main(argv)


def test_deepspeed_configs_are_checked_against_the_world(tmp_path):
    fixed = tmp_path / "fixed.json"
    fixed.write_text(json.dumps({"train_batch_size": 6, "zero_optimization": {"stage": 2}}))
    with pytest.raises(UserError, match="train_batch_size"):
        main(["--model_name_or_path", MODEL_7B, "--deepspeed", str(fixed), "--world_size", "4"])
    unknown = tmp_path / "stage5.json"
    unknown.write_text(json.dumps({"zero_optimization": {"stage": 5}}))
    with pytest.raises(UserError, match="stage"):
        main(["--model_name_or_path", MODEL_7B, "--deepspeed", str(unknown)])


@pytest.mark.slow
def test_cli_error_is_one_line_with_exit_code_2():
    done = subprocess.run(
        [sys.executable, "-m", "hf_lora_ds.plan", "--model_name_or_path", MODEL_7B, "--device_memory", "32 potatoes"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("error: --device_memory '32 potatoes'")
    assert "Traceback" not in done.stderr


def test_first_line_names_what_is_planned_for(capsys):
    main(["--model_name_or_path", MODEL_7B, *GPU_FLAGS, "--world_size", "2"])
    assert capsys.readouterr().out.splitlines()[0] == "planning for 2 x GPU with 24 GiB"
    main(["--model_name_or_path", MODEL_7B, "--device", "cpu", "--device_memory", "23GiB", "--world_size", "2"])
    assert capsys.readouterr().out.splitlines()[0] == "planning for this CPU: 23 GiB host memory, 2 ranks"


@pytest.mark.skipif(__import__("torch").accelerator.is_available(), reason="plans this machine's accelerator")
def test_device_memory_without_device_plans_gpus_on_a_machine_without_one(capsys):
    main(["--model_name_or_path", MODEL_7B, "--device_memory", "24GiB", "--json"])
    captured = capsys.readouterr()
    assert "planning for 1 x GPU with 24 GiB" in captured.err  # stdout stays the JSON alone
    assert row(json.loads(captured.out), "none", False)["device_bytes"] > 14e9  # a 7B's bf16 weights: a GPU plan


def test_paths_are_checked_as_run_sft_checks_them(tmp_path):
    """A data file that is not there and a file where a directory is needed: one-line errors (the planner read the
    data anyway, and its cache directory, with tracebacks)."""
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(MissingPathError, match=f"--train_file {tmp_path}/gone.json: no such file"):
        main(["--model_name_or_path", MODEL_7B, "--train_file", str(tmp_path / "gone.json")])
    with pytest.raises(UserError, match=f"--dataset_cache_dir {afile}: {afile} is a file, not a directory"):
        main(["--model_name_or_path", MODEL_7B, "--dataset_cache_dir", str(afile)])
    with pytest.raises(MissingPathError, match=f"--fsdp_config {tmp_path}: no such file"):
        main(["--model_name_or_path", MODEL_7B, "--fsdp", "full_shard", "--fsdp_config", str(tmp_path)])


def test_a_sequence_too_long_for_one_device_is_planned_split(capsys):
    """Qwen2.5-7B at 32,768 tokens on 8 x 24 GiB: no configuration holds a whole sequence per GPU, so the DeepSpeed
    configurations come again at each sequence-parallel size the world and the 28 heads (4 key/value) allow, and the
    first that fits is recommended with the flag to pass."""
    argv = [
        "--model_name_or_path",
        MODEL_7B,
        "--world_size",
        "8",
        "--device",
        "gpu",
        "--device_memory",
        "24GiB",
        "--max_length",
        "32768",
        "--per_device_train_batch_size",
        "1",
    ]
    rows = plan_json(argv, capsys)
    assert not any(r["fits"] for r in rows if r["sequence_parallel"] == 1)
    assert sorted({r["sequence_parallel"] for r in rows}) == [1, 2, 4]  # 8 does not divide 28 heads
    split = [r for r in rows if r["sequence_parallel"] > 1]
    assert all(r["config"].startswith("stage") for r in split)
    one, two = (row([r for r in rows if r["sequence_parallel"] == size], "stage3.json", True) for size in (1, 2))
    assert two["device_items"]["activations"] <= one["device_items"]["activations"] // 2 + 1
    assert two["device_items"]["sequence-parallel exchange"] > 0
    main(argv)
    table = capsys.readouterr().out
    assert "Recommended: ds_configs/stage3.json + SP 2 with gradient checkpointing" in table
    assert "run with --sequence_parallel_size 2" in table


def test_python_m_plan_max_length_32768_names_the_devices_that_split_it(capsys):
    """The demo at --max_length 32768 (batch 32) on one 8 GiB GPU: nothing fits whole, and the plan names the
    smallest sequence-parallel group of such GPUs that does."""
    main(["--max_length", "32768", "--device", "gpu", "--device_memory", "8GiB"])
    out = capsys.readouterr().out
    assert "Nothing fits" in out
    assert (
        "With 4 devices, one sequence split over all of them (--sequence_parallel_size 4 --deepspeed stage0): "
        "ds_configs/stage0.json + SP 4 with gradient checkpointing" in out
    )
