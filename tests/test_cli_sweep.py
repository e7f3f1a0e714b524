"""One bad value for every argument of ``run_sft.py --help``, through the CLI's own entry and error boundary.

The values are generated from the parser's actions (the dataclass fields' types and choices): a word for a number,
a negative number, ``maybe`` for a boolean, an unknown choice; string arguments get a value from ``STRING_CASES``
or are listed in ``FREE_TEXT`` with the reason any text is valid. A new argument that is neither fails
``test_every_argument_is_swept``. Each case runs ``run_sft.main`` in-process inside ``errors.run_cli`` (a value that
slipped through would train one step of a tiny model and fail the test) and asserts exit code 2, no exception
escaping, and the flag named on the ``error`` line; ``test_cli_errors.py`` and ``test_real_launches`` below prove
this path is the one a real ``python run_sft.py`` takes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

import run_sft
from hf_lora_ds import SFTTrainingArguments
from hf_lora_ds.errors import run_cli as error_boundary
from tests.test_cli_errors import check_one_line, run_cli

REPO = Path(__file__).resolve().parents[1]
PARSER = HfArgumentParser(SFTTrainingArguments)
ARGUMENTS = {
    action.dest: action
    for action in PARSER._actions
    if action.option_strings and action.dest != "help" and not action.option_strings[0].startswith("--no_")
}

# Bad values for string arguments; "{tmp}" is a scratch directory holding a file named "afile".
STRING_CASES = {
    "output_dir": "{tmp}/afile",
    "dataset_cache_dir": "{tmp}/afile/cache",
    "model_name_or_path": "{tmp}/no-model",
    "train_file": "{tmp}/missing.jsonl",
    "eval_file": "{tmp}/missing.jsonl",
    "deepspeed": "{tmp}/missing.json",
    "fsdp_config": "{tmp}/missing.json",
    "accelerator_config": "{tmp}/missing.json",
    "resume_from_checkpoint": "{tmp}/no-checkpoint",
    "lr_scheduler_kwargs": "{not json",
    "gradient_checkpointing_kwargs": "{not json",
    "activation_checkpointing_kwargs": "{not json",
    "liger_kernel_config": "{not json",
    "parallelism_config": "not a config",
    "columns": "prompt",
    "sharegpt_roles": "bot=robot",
    "lora_target_modules": "no_such_proj",
    "lora_target_experts": "no_such_weight",
    "run_callbacks": "preemption,no_such_callback",
    "attn_implementation": "no_such_kernel",
    "report_to": "no_such_tracker",
    "torch_compile_backend": "no_such_backend",
    "torch_compile_mode": "no_such_mode",
    "fsdp": "no_such_option",
    "debug": "no_such_option",
    "device_memory": "lots",
    "eval_task": "no_such_task",
    "lora_init": "pissa_niter_x",
    "gguf_file": "missing.gguf",
    "dataset": "no_such_entry",
}
# String arguments any text is valid for, or that are read only with another flag that the sweep does not set.
FREE_TEXT = {
    "run_name": "a name",
    "project": "a name",
    "system_prompt": "any text",
    "hub_token": "a secret, used only with --push_to_hub",
    "hub_model_id": "a repository name, used only with --push_to_hub",
    "hub_revision": "a branch name, used only with --push_to_hub",
    "trackio_space_id": "a Space name, used only with --report_to trackio",
    "trackio_bucket_id": "a bucket name, used only with --report_to trackio",
    "trackio_static_space_id": "a Space name, used only with --report_to trackio",
    "optim_args": "free-form options, read only by some optimizers",
    "optim_target_modules": "module names, read only by GaLore/APOLLO optimizers",
    "metric_for_best_model": "a metric name, read only with --load_best_model_at_end",
    "include_for_metrics": "names, read only with compute_metrics (run_sft has none)",
    "label_names": "batch keys, read only by evaluation with compute_metrics",
    "length_column_name": "a column name, read only by datasets without lengths (run_sft's have them)",
}
NEGATIVE_IS_VALID = {"local_rank"}  # set by the launcher; -1 means none


def sweep_cases() -> list[tuple[str, str]]:
    """(dest, bad value) pairs: numbers get a word and (where negatives are invalid) -3."""
    cases = []
    for dest, action in ARGUMENTS.items():
        if action.choices:
            cases.append((dest, "no_such_choice"))
        elif action.type is string_to_bool:
            cases.append((dest, "maybe"))
        elif action.type in (int, float):
            cases.append((dest, "many"))
            if dest not in NEGATIVE_IS_VALID:
                cases.append((dest, "-3"))
        elif dest in STRING_CASES:
            cases.append((dest, STRING_CASES[dest]))
    return cases


def test_every_argument_is_swept():
    swept = {dest for dest, _ in sweep_cases()}
    unclassified = sorted(set(ARGUMENTS) - swept - set(FREE_TEXT))
    assert not unclassified, f"add a bad value to STRING_CASES or a reason to FREE_TEXT for {unclassified}"
    assert not (set(STRING_CASES) | set(FREE_TEXT)) - set(ARGUMENTS), "stale names in STRING_CASES/FREE_TEXT"
    assert len(swept) + len(FREE_TEXT) == len(ARGUMENTS) > 140


@pytest.fixture(scope="module")
def scratch(tmp_path_factory, tiny_model_dir) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "afile").write_text("not a directory")
    records = [{"instruction": f"{i}=", "output": f"1 + {i}"} for i in range(4)]
    (tmp / "train.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return {"tmp": str(tmp), "model": str(tiny_model_dir)}


def base_argv(scratch: dict[str, str]) -> list[str]:
    return [
        "--model_name_or_path",
        scratch["model"],
        "--train_file",
        f"{scratch['tmp']}/train.jsonl",
        "--eval_file",
        "",
        "--output_dir",
        f"{scratch['tmp']}/out",
        "--max_steps",
        "1",
    ]


@pytest.mark.parametrize("dest,value", sweep_cases(), ids=[f"{dest}={value}" for dest, value in sweep_cases()])
def test_bad_value(dest, value, scratch, capsys, monkeypatch):
    monkeypatch.delenv("HF_LORA_DS_DEBUG", raising=False)
    flag = ARGUMENTS[dest].option_strings[0]
    argv = base_argv(scratch) + [flag, value.replace("{tmp}", scratch["tmp"])]
    with pytest.raises(SystemExit) as leaving:  # any other exception is a traceback the user would see
        error_boundary(lambda: run_sft.main(argv))
    stderr = capsys.readouterr().err
    assert leaving.value.code == 2, f"{flag} {value} was accepted (exit {leaving.value.code}): {stderr[-2000:]}"
    error_lines = [line for line in stderr.splitlines() if "error: " in line]
    assert len(error_lines) == 1, stderr[-2000:]
    assert dest in error_lines[0] or flag in error_lines[0], error_lines[0]


# A handful as a user runs them: the in-process boundary above is the real one.
REAL_LAUNCHES = [
    ("lora_target_modules", "no_such_proj", "the model's linear and embedding modules are down_proj,"),
    ("output_dir", "{tmp}/afile", "is a file, not a directory"),
    ("learning_rate", "-3", "--learning_rate must be at least 0"),
]


@pytest.mark.slow
@pytest.mark.parametrize("dest,value,fragment", REAL_LAUNCHES, ids=[case[0] for case in REAL_LAUNCHES])
def test_real_launches(dest, value, fragment, scratch):
    argv = base_argv(scratch) + [ARGUMENTS[dest].option_strings[0], value.replace("{tmp}", scratch["tmp"])]
    check_one_line(run_cli(str(REPO / "run_sft.py"), *argv), fragment)


def test_one_typo_among_target_modules(tiny_model):
    """PEFT alone trains q_proj and silently drops the misspelt v_prj."""
    from peft import LoraConfig

    from hf_lora_ds.errors import UserError
    from hf_lora_ds.model.lora import wrap_with_lora

    with pytest.raises(UserError, match=r"q_proj,v_prj: v_prj matches no layer LoRA can adapt; .* v_proj "):
        wrap_with_lora(tiny_model, LoraConfig(target_modules=["q_proj", "v_prj"]))
