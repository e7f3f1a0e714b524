from __future__ import annotations

import json

import pytest
import torch
import yaml
from transformers import HfArgumentParser

from hf_lora_ds.config.arguments import SFTTrainingArguments, pinned_memory_helps
from hf_lora_ds.errors import UserError
from hf_lora_ds.launch.resolve import parse_run_arguments


@pytest.fixture
def train_file(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"instruction": "1=", "output": "0 + 1"}\n')
    return str(path)


def parse(argv):
    """The arguments object built from flags, with only its own (value) checks."""
    (args,) = HfArgumentParser(SFTTrainingArguments).parse_args_into_dataclasses(argv)
    return args


def resolved(argv):
    """The arguments as a run resolves them (hf_lora_ds.launch.resolve): with the checks that read files."""
    return parse_run_arguments(argv)


def test_cli_flags(train_file, tmp_path):
    args = parse(
        [
            "--model_name_or_path",
            "m",
            "--train_file",
            train_file,
            "--output_dir",
            str(tmp_path),
            "--lora_rank",
            "4",
            "--lora_target_modules",
            "q_proj,v_proj",
            "--assistant_turns",
            "last",
        ]
    )
    assert (args.lora_rank, args.lora_target_modules, args.assistant_turns) == (4, "q_proj,v_proj", "last")


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_config_file(train_file, tmp_path, suffix):
    config = {"model_name_or_path": "m", "train_file": train_file, "output_dir": str(tmp_path), "use_dora": True}
    path = tmp_path / f"config{suffix}"
    path.write_text(yaml.safe_dump(config) if suffix == ".yaml" else json.dumps(config))
    parser = HfArgumentParser(SFTTrainingArguments)
    (args,) = parser.parse_yaml_file(str(path)) if suffix == ".yaml" else parser.parse_json_file(str(path))
    assert args.use_dora and args.train_file == train_file


@pytest.mark.parametrize(
    "extra, error, pattern",
    [
        (["--lora_rank", "0"], ValueError, "--lora_rank must be a positive integer"),
        (["--lora_dropout", "1.0"], ValueError, r"--lora_dropout must be in \[0, 1\)"),
        (["--lora_alpha", "-1"], ValueError, "--lora_alpha must be positive"),
        (["--lora_target_modules", " , "], ValueError, "--lora_target_modules is empty"),
        (["--max_length", "1"], ValueError, "--max_length must be at least 2"),
        (["--batching", "padding_free", "--pad_to_multiple_of", "8"], ValueError, "--pad_to_multiple_of has no effect"),
        (["--batching", "padding_free", "--use_cache", "True"], ValueError, "needs --use_cache False"),
        (["--dtype", "float16", "--bf16"], ValueError, "use --fp16"),
        (["--dtype", "bfloat16", "--fp16"], ValueError, "use --bf16"),
        (["--eval_file", "missing.json"], FileNotFoundError, "--eval_file missing.json: no such file"),
        (["--eval_file", "e_dir:1,missing.jsonl:1"], FileNotFoundError, "--eval_file missing.jsonl: no such file"),
        (["--eval_file", "e_dir:1,other:0"], ValueError, "mixture source 'other': weight '0' is not a positive number"),
        (["--columns", "prompt"], ValueError, "--columns 'prompt': expected comma-separated key=value pairs"),
        (["--sharegpt_roles", "bot=robot"], ValueError, "--sharegpt_roles bot=robot: unknown role 'robot'"),
        (["--lora_init", "pissa", "--load_in_4bit"], ValueError, "--lora_init pissa with --load_in_4bit"),
        (["--lora_init", "loftq"], ValueError, "--lora_init loftq fits the adapter to the 4-bit quantisation error"),
        (
            ["--lora_optimizer", "lorafa", "--deepspeed", "ds_configs/stage2.json"],
            ValueError,
            r"--lora_optimizer lorafa with ZeRO stage 2 \(.*stage2.json\)",
        ),
    ],
)
def test_invalid_combinations_say_what_to_change(train_file, tmp_path, extra, error, pattern, no_launcher):
    with pytest.raises(error, match=pattern):
        resolved(["--model_name_or_path", "m", "--train_file", train_file, "--output_dir", str(tmp_path)] + extra)


def test_the_command_line_requires_a_model_and_a_train_file_and_code_does_not(train_file, tmp_path, no_launcher):
    """A script hands the trainer its model and records (hf_lora_ds.trainer.run_inputs); a command line must name
    them."""
    with pytest.raises(UserError, match="--model_name_or_path is required"):
        resolved(["--train_file", train_file, "--output_dir", str(tmp_path)])
    with pytest.raises(UserError, match="--train_file is required"):
        resolved(["--model_name_or_path", "m", "--output_dir", str(tmp_path)])
    args = parse(["--output_dir", str(tmp_path)])
    assert args.model_name_or_path is None and args.train_file is None


def test_auto_dtype_is_float32_without_a_bf16_gpu(train_file, tmp_path, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    args = parse(["--model_name_or_path", "m", "--train_file", train_file, "--output_dir", str(tmp_path)])
    assert args.dtype == "float32" and not args.bf16


def test_bfloat16_weights_turn_on_bf16_training(train_file, tmp_path):
    args = parse(
        [
            "--model_name_or_path",
            "m",
            "--train_file",
            train_file,
            "--output_dir",
            str(tmp_path),
            "--dtype",
            "bfloat16",
            "--use_cpu",
            "True",
        ]
    )
    assert args.bf16 and str(args.torch_dtype) == "torch.bfloat16"


def test_no_pinned_memory_without_an_accelerator(train_file, tmp_path, accelerator_seen):
    accelerator_seen(None)
    args = parse(["--model_name_or_path", "m", "--train_file", train_file, "--output_dir", str(tmp_path)])
    assert args.dataloader_pin_memory is False
    accelerator_seen(torch.device("cuda"))
    assert pinned_memory_helps(use_cpu=False) and not pinned_memory_helps(use_cpu=True)


def test_batches_reach_an_accelerator_without_a_synchronising_copy(train_file, tmp_path, accelerator_seen):
    """Pinned batches are copied to the device asynchronously (accelerate's non_blocking), unless
    --accelerator_config says otherwise; on the CPU nothing is pinned and nothing changes."""
    common = ["--model_name_or_path", "m", "--train_file", train_file, "--output_dir", str(tmp_path)]
    accelerator_seen(None)
    assert parse(common).accelerator_config.non_blocking is False
    accelerator_seen(torch.device("cuda"))
    assert parse(common).accelerator_config.non_blocking is True
    user = parse([*common, "--accelerator_config", '{"non_blocking": false}']).accelerator_config
    assert user.non_blocking is False
    assert parse([*common, "--dataloader_pin_memory", "false"]).accelerator_config.non_blocking is False


@pytest.mark.gpu
def test_auto_dtype_on_a_cuda_device(train_file, tmp_path):
    """On a real GPU: bf16 weights and bf16 training where the device supports it, float32 with --use_cpu."""
    common = ["--model_name_or_path", "m", "--train_file", train_file, "--output_dir", str(tmp_path)]
    args = parse(common)
    expected = "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    assert args.dtype == expected and args.bf16 == (expected == "bfloat16")
    assert parse([*common, "--use_cpu", "True"]).dtype == "float32"


def test_yaml_list_of_sources_becomes_the_mixture_flag(train_file, tmp_path):
    config = {
        "model_name_or_path": "m",
        "output_dir": str(tmp_path),
        "columns": "prompt=q",
        "train_file": [{"path": train_file, "weight": 0.7}, "org/set:zh:0.3"],
    }
    (args,) = HfArgumentParser(SFTTrainingArguments).parse_dict(config)
    assert args.train_file == f"{train_file}:0.7,org/set:zh:0.3"


FSDP2_CONFIG = str(__import__("hf_lora_ds.resources", fromlist=["FSDP_CONFIGS"]).FSDP_CONFIGS / "fsdp2.json")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--load_in_4bit", "true"], "--load_in_4bit with FSDP: bitsandbytes' quantized weights cannot be sharded"),
        (["--deepspeed", "stage3"], "--fsdp and --deepspeed stage3: choose one of FSDP and DeepSpeed"),
        (["--fsdp_config", "no_such.json"], "--fsdp_config no_such.json: no such file"),
    ],
    ids=["qlora", "deepspeed", "missing-config"],
)
def test_fsdp_combinations_refused_before_loading(train_file, tmp_path, flags, message, no_launcher):
    argv = [
        "--model_name_or_path",
        "m",
        "--train_file",
        train_file,
        "--output_dir",
        str(tmp_path),
        "--fsdp",
        "full_shard",
        "--fsdp_config",
        FSDP2_CONFIG,
        *flags,
    ]
    with pytest.raises(ValueError, match=message):
        resolved(argv)


@pytest.mark.skipif(torch.accelerator.is_available(), reason="an accelerator can offload")
def test_fsdp_offload_refused_without_an_accelerator(train_file, tmp_path, no_launcher):
    offload = FSDP2_CONFIG.replace("fsdp2.json", "fsdp2_offload.json")
    with pytest.raises(ValueError, match="FSDP cpu_offload moves parameters from an accelerator"):
        resolved(
            [
                "--model_name_or_path",
                "m",
                "--train_file",
                train_file,
                "--output_dir",
                str(tmp_path),
                "--fsdp",
                "full_shard",
                "--fsdp_config",
                offload,
            ]
        )
