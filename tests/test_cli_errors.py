"""Every class of user error, through the real command lines: one ``error:`` line on stderr, exit code 2, no traceback.

Each command line (``python run_sft.py``, ``python -m hf_lora_ds.<cli>``) runs as a separate process, as a user runs
it, at least once, as does a case that needs a fresh interpreter (an environment variable read at import); each costs
about the interpreter's import time (~10 s here) and is marked slow. The other run_sft cases run the same
``run_cli(main)`` in this process (``run_sft_here``), in the quick tier: all of them fail before a model is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import run_sft as run_sft_module
from hf_lora_ds.errors import run_cli as run_cli_here
from tests.model.test_source import model_copy_without

REPO = Path(__file__).resolve().parents[1]
RECORD = {"instruction": "5=", "output": "王大丫丫的回答是--->1 + 4"}


@dataclass
class Failure:
    returncode: int
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error: ")]


def run_cli(*args: str, env: dict[str, str] | None = None) -> Failure:
    environment = {key: value for key, value in os.environ.items() if key != "HF_LORA_DS_DEBUG"}
    environment.update(PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false", **(env or {}))
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=environment, capture_output=True, text=True)
    return Failure(done.returncode, done.stderr)


def check_one_line(failure: Failure, *fragments: str) -> str:
    """Exit code 2, exactly one ``error:`` line holding every fragment, and no traceback."""
    assert failure.returncode == 2, failure.stderr[-3000:]
    assert "Traceback" not in failure.stderr, failure.stderr[-3000:]
    assert len(failure.error_lines) == 1, failure.stderr[-3000:]
    line = failure.error_lines[0]
    for fragment in fragments:
        assert fragment in line, line
    return line


@pytest.fixture
def train_file(tmp_path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(RECORD, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def sft_flags(model_dir, train_file, tmp_path, *extra: str) -> list[str]:
    return [
        "--model_name_or_path",
        str(model_dir),
        "--train_file",
        str(train_file),
        "--eval_file",
        "",
        "--output_dir",
        str(tmp_path / "out"),
        *extra,
    ]


def run_sft(model_dir, train_file, tmp_path, *extra: str, env: dict[str, str] | None = None) -> Failure:
    return run_cli(str(REPO / "run_sft.py"), *sft_flags(model_dir, train_file, tmp_path, *extra), env=env)


@pytest.fixture
def run_sft_here(capsys, monkeypatch):
    """``run_sft``'s command line run in this process, as run_sft.py runs it: ``run_cli(main)``."""
    monkeypatch.delenv("HF_LORA_DS_DEBUG", raising=False)

    def run(model_dir, train_file, tmp_path, *extra: str) -> Failure:
        capsys.readouterr()
        with pytest.raises(SystemExit) as exited:
            run_cli_here(lambda: run_sft_module.main(sft_flags(model_dir, train_file, tmp_path, *extra)))
        return Failure(exited.value.code, capsys.readouterr().err)

    return run


# ---- data files ----


def test_data_file_in_another_encoding(tiny_model_dir, tmp_path, train_file, run_sft_here):
    train_file.write_bytes(train_file.read_bytes() + '{"instruction": "café"}\n'.encode("latin-1"))
    offset = len(json.dumps(RECORD, ensure_ascii=False).encode()) + 1 + len('{"instruction": "caf')
    check_one_line(
        run_sft_here(tiny_model_dir, train_file, tmp_path),
        f"{train_file}, line 2 (byte offset {offset}): not UTF-8 text (byte 0xe9)",
    )


def test_corrupt_parquet_file(tiny_model_dir, tmp_path, run_sft_here):
    data = tmp_path / "train.parquet"
    data.write_bytes(b"PAR1 this is not a parquet file")
    check_one_line(run_sft_here(tiny_model_dir, data, tmp_path), f"{data}: not a readable parquet file")


def test_corrupt_json_file(tiny_model_dir, tmp_path, run_sft_here):
    data = tmp_path / "train.json"
    data.write_text('[\n  {"instruction": "5=", "output": "x"},\n  {"instruction": "6=", "output": }\n]')
    check_one_line(run_sft_here(tiny_model_dir, data, tmp_path), f"{data}, line 3: malformed JSON")


# ---- model paths ----


@pytest.mark.slow
def test_model_directory_does_not_exist(tmp_path, train_file):
    check_one_line(run_sft(tmp_path / "no-model", train_file, tmp_path), "no-model: no such directory")


def test_model_directory_lacks_a_part(tiny_model_dir, tmp_path, train_file, run_sft_here):
    """The tokenizer case, whose old message was the most misleading; test_model_source covers config and weights."""
    model = model_copy_without(tiny_model_dir, tmp_path, "tokenizer*")
    check_one_line(
        run_sft_here(model, train_file, tmp_path), f"--model_name_or_path {model}: the directory has no tokenizer"
    )


@pytest.mark.slow
def test_hub_id_offline_and_not_cached(tmp_path, train_file):
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub-cache")}
    check_one_line(
        run_sft("no-such-org/no-such-model", train_file, tmp_path, env=env),
        "no-such-org/no-such-model",
        "not in the local cache while HF_HUB_OFFLINE is set",
    )


# ---- flags ----


def test_bad_flag_combination_from_transformers(tiny_model_dir, tmp_path, train_file, run_sft_here):
    """TrainingArguments' own ValueError (several lines) is made one line; ours are UserErrors already."""
    line = check_one_line(
        run_sft_here(
            tiny_model_dir,
            train_file,
            tmp_path,
            "--load_best_model_at_end",
            "true",
            "--eval_strategy",
            "steps",
            "--save_strategy",
            "epoch",
        )
    )
    assert "load_best_model_at_end" in line


def test_sequence_parallelism_on_too_few_ranks(tiny_model_dir, tmp_path, train_file, run_sft_here):
    """A single process cannot split a sequence over 2 ranks: said before the model loads."""
    check_one_line(
        run_sft_here(tiny_model_dir, train_file, tmp_path, "--deepspeed", "stage2", "--sequence_parallel_size", "2"),
        "--sequence_parallel_size 2 with 1 rank(s): the world size must be a multiple of 2",
    )


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (("--lora_init", "pissa_niter_"), "--lora_init pissa_niter_: N in pissa_niter_N is the number of subspace"),
        (("--lora_optimizer", "loraplus", "--loraplus_lr_ratio", "nan"), "--loraplus_lr_ratio must be a finite number"),
    ],
)
def test_a_lora_variant_flag_peft_would_fail_on_later(
    tiny_model_dir, tmp_path, train_file, run_sft_here, flags, fragment
):
    """Refused with the other flags, not after the model loaded (PEFT would fail on pissa_niter_; nan would train)."""
    check_one_line(run_sft_here(tiny_model_dir, train_file, tmp_path, *flags), fragment)


# ---- DeepSpeed configs ----


DS_CASES = {
    "missing": (None, "ds.json: no such file"),
    "invalid-json": ('{\n  "zero_optimization": {"stage": 2,}\n}', "ds.json, line 2 column 36: invalid JSON"),
    "unknown-key": ({"zero_optimisation": {"stage": 2}}, "unknown key 'zero_optimisation' (did you mean"),
    "unknown-stage": ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage is 4; use 0, 1, 2 or 3"),
    "offload-without-optimizer": (
        {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
        "offload_optimizer without an 'optimizer' section",
    ),
    "batch-contradiction": (
        {"train_batch_size": 16, "zero_optimization": {"stage": 2}},
        "train_batch_size is 16 but --per_device_train_batch_size 4 x --gradient_accumulation_steps 1 x 1 ranks = 4",
    ),
}


def write_ds_config(path: Path, content: dict | str | None) -> Path:
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize("case", sorted(DS_CASES))
def test_deepspeed_config(tiny_model_dir, tmp_path, train_file, case, run_sft_here):
    content, fragment = DS_CASES[case]
    config = write_ds_config(tmp_path / "ds.json", content)
    failure = run_sft_here(
        tiny_model_dir, train_file, tmp_path, "--deepspeed", str(config), "--per_device_train_batch_size", "4"
    )
    check_one_line(failure, f"--deepspeed {config}", fragment)


# ---- the other command lines, and the debug switch ----


@pytest.mark.slow
def test_eval_cli(tmp_path):
    data = tmp_path / "eval.json"
    data.write_text(json.dumps([RECORD]))
    check_one_line(
        run_cli("-m", "hf_lora_ds.eval", "--model_name_or_path", str(tmp_path / "gone"), "--data", str(data)),
        "--model_name_or_path",
        "gone: no such directory",
    )


@pytest.mark.slow
def test_audit_cli(tiny_model_dir, tmp_path, train_file):
    model = model_copy_without(tiny_model_dir, tmp_path, "tokenizer*")
    check_one_line(
        run_cli("-m", "hf_lora_ds.audit", "--train_file", str(train_file), "--model_name_or_path", str(model)),
        f"--model_name_or_path {model}: the directory has no tokenizer",
    )


@pytest.mark.slow
def test_merge_cli(tiny_model_dir, tmp_path):
    check_one_line(
        run_cli(
            "-m",
            "hf_lora_ds.merge",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--adapter",
            str(tmp_path),
            "--out",
            str(tmp_path / "merged"),
        ),
        f"--adapter {tmp_path}: the directory has no adapter_config.json",
    )


@pytest.mark.slow
def test_debug_variable_shows_the_traceback(tmp_path, train_file):
    failure = run_sft(tmp_path / "no-model", train_file, tmp_path, env={"HF_LORA_DS_DEBUG": "1"})
    assert failure.returncode != 0
    assert "Traceback" in failure.stderr and "MissingPathError" in failure.stderr


def test_an_error_the_chat_template_raises_names_the_record(tiny_model_dir, tmp_path, train_file, run_sft_here):
    model = model_copy_without(tiny_model_dir, tmp_path, "chat_template.jinja")
    refusing = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    (model / "chat_template.jinja").write_text(refusing + (tiny_model_dir / "chat_template.jinja").read_text())
    with_system = {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "5="},
            {"role": "assistant", "content": "1 + 4"},
        ]
    }
    train_file.write_text(train_file.read_text() + json.dumps(with_system) + "\n")
    check_one_line(
        run_sft_here(model, train_file, tmp_path),
        f"error: {train_file}, line 2: the chat template raised an exception: System role not supported",
    )
