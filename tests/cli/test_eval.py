"""python -m hf_lora_ds.eval end to end on a tiny model directory: evaluate, compare with an adapter, score only."""

from __future__ import annotations

import json
import re

import pytest
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_lora_ds.cli.eval import main
from hf_lora_ds.errors import run_cli
from hf_lora_ds.eval import evaluate


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, varied_model_dir):
    """A LoRA adapter with random (not zero) B matrices, so base + adapter generates differently from the base."""
    path = tmp_path_factory.mktemp("adapter")
    model = AutoModelForCausalLM.from_pretrained(varied_model_dir)
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(path)
    return path


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_compare_prints_before_and_after_and_writes_files(
    capsys, tmp_path, varied_model_dir, adapter_dir, sum_records_file, sum_records
):
    out = tmp_path / "out"
    argv = ["--model_name_or_path", str(varied_model_dir), "--adapter", str(adapter_dir), "--task", "sum_to_x"]
    argv += ["--data", str(sum_records_file), "--compare", "--output_dir", str(out), "--batch_size", "4"]
    assert main(argv) == 0

    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if "before" in line and "after" in line)
    assert header.split() == ["before", "after"]
    assert "accuracy" in printed and "generated tokens/s" in printed and "peak host RSS" in printed

    report = json.loads((out / "eval_report.json").read_text())
    assert set(report) == {"before", "after"}
    assert report["before"]["num_samples"] == report["after"]["num_samples"] == len(sum_records)
    before, after = read_jsonl(out / "predictions_before.jsonl"), read_jsonl(out / "predictions_after.jsonl")
    assert [p["reference"] for p in before] == [r["output"] for r in sum_records]
    assert {"prompt", "output", "answer", "correct", "reason"} <= set(before[0])
    assert [p["output"] for p in before] != [p["output"] for p in after], "the adapter changed nothing"

    # "before" is the base model itself: the adapter was disabled, not merely loaded.
    base = AutoModelForCausalLM.from_pretrained(varied_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(varied_model_dir)
    direct = evaluate(base, tokenizer, sum_records, "sum_to_x", batch_size=4)
    assert [p["output"] for p in before] == [p.output for p in direct.predictions]


def test_single_eval_without_adapter(capsys, tmp_path, varied_model_dir, sum_records_file):
    assert (
        main(
            [
                "--model_name_or_path",
                str(varied_model_dir),
                "--data",
                str(sum_records_file),
                "--max_samples",
                "3",
                "--output_dir",
                str(tmp_path),
            ]
        )
        == 0
    )
    predictions = read_jsonl(tmp_path / "predictions_eval.jsonl")
    assert [p["index"] for p in predictions] == [0, 1, 2]  # --max_samples keeps the first 3
    report = json.loads((tmp_path / "eval_report.json").read_text())["eval"]
    correct = sum(p["correct"] for p in predictions)
    assert (report["num_samples"], report["num_correct"]) == (3, correct)
    printed = capsys.readouterr().out
    assert re.search(rf"^accuracy +{correct / 3:.3f}$", printed, flags=re.MULTILINE), printed
    assert re.search(rf"^correct / samples +{correct} / 3$", printed, flags=re.MULTILINE), printed


def test_score_mode(capsys, tmp_path):
    p = "王大丫丫的回答是--->"
    rows = [
        {"instruction": "5=", "input": "", "output": f"{p}1 + 4", "prediction": f"{p}2+3"},
        {"instruction": "7=", "input": "", "output": f"{p}1 + 6", "prediction": f"{p}0 + 7"},
        {"instruction": "9=", "input": "", "output": f"{p}1 + 8", "prediction": f"{p}1 + 8 ok"},
    ]
    data = tmp_path / "preds.json"
    data.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    assert main(["score", "--task", "sum_to_x", "--data", str(data)]) == 0
    assert "accuracy 0.6667 (2/3)" in capsys.readouterr().out
    verdicts = read_jsonl(tmp_path / "preds.verdicts.jsonl")
    assert [(v["correct"], v["reason"]) for v in verdicts] == [(True, None), (True, None), (False, "extra text")]


def _cli_error(capsys, argv: list[str]) -> str:
    """What the command line prints for a user error, which must be exit code 2 (hf_lora_ds.errors.run_cli)."""
    with pytest.raises(SystemExit) as exited:
        run_cli(lambda: main(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


def test_bad_records_name_file_line_and_field(capsys, tmp_path, varied_model_dir):
    data = tmp_path / "eval.jsonl"
    data.write_text('{"instruction": "5=", "output": "王大丫丫的回答是--->1 + 4"}\n{"instruction": "6="}\n')
    err = _cli_error(capsys, ["--model_name_or_path", str(varied_model_dir), "--data", str(data)])
    assert err == f"error: {data}, line 2: missing field 'output'\n"
    assert f"{data}, line 2: missing field 'output'" in _cli_error(capsys, ["score", "--data", str(data)])
    data.write_text('{"instruction": "5=", "output": "王大丫丫的回答是--->1 + 4"}\n')
    assert f"{data}, line 1: field 'prediction' is missing" in _cli_error(capsys, ["score", "--data", str(data)])


def test_argument_errors(capsys, tmp_path, varied_model_dir):
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", str(varied_model_dir), "--data", "x.json", "--compare"])
    assert "pass --adapter DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["score", "--task", "sum-to-x", "--data", "x.json"])
    assert "unknown eval task 'sum-to-x'" in capsys.readouterr().err


def test_paths_are_checked_before_the_model_loads(capsys, tmp_path, sum_records_file):
    """A file where the adapter or output directory belongs, a directory that is not an adapter: one line each (PEFT
    itself raised a ValueError traceback, makedirs a FileExistsError one), before any model is read: the model here
    does not even exist."""
    afile, empty = tmp_path / "afile", tmp_path / "empty"
    afile.write_text("")
    empty.mkdir()
    model = ["--model_name_or_path", str(tmp_path / "no-model"), "--data", str(sum_records_file)]
    assert _cli_error(capsys, [*model, "--adapter", str(afile)]) == (
        f"error: --adapter {afile}: is a file, not an adapter directory; pass the directory that holds "
        "adapter_config.json\n"
    )
    assert _cli_error(capsys, [*model, "--adapter", str(empty)]).startswith(
        f"error: --adapter {empty}: the directory has no adapter_config.json, so it is not a saved PEFT adapter"
    )
    assert _cli_error(capsys, [*model, "--output_dir", str(afile)]) == (
        f"error: --output_dir {afile}: {afile} is a file, not a directory; choose another path\n"
    )


def test_the_old_model_flag_still_works_with_a_note(capsys, tmp_path, varied_model_dir, sum_records_file):
    assert (
        main(
            [
                "--model",
                str(varied_model_dir),
                "--data",
                str(sum_records_file),
                "--max_samples",
                "1",
                "--max_new_tokens",
                "2",
            ]
        )
        == 0
    )
    assert "--model is deprecated; use --model_name_or_path" in capsys.readouterr().err
