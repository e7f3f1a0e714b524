"""The before/after table and the report files."""

from __future__ import annotations

import json
import re

from hf_lora_ds.eval import EvalResult, Prediction, format_comparison, write_eval_report, write_predictions


def result(correct: int, wrong_reasons: list[str], rss: int | None) -> EvalResult:
    predictions = [Prediction(i, f"line {i}", "p", "r", "o", None, False, r) for i, r in enumerate(wrong_reasons)]
    predictions += [Prediction(len(predictions) + i, "x", "p", "r", "r", "r", True, None) for i in range(correct)]
    reasons = {r: wrong_reasons.count(r) for r in wrong_reasons}
    total = len(predictions)
    return EvalResult(
        "sum_to_x",
        total,
        correct,
        correct / total,
        reasons,
        total_time_s=2.5,
        generation_time_s=2.0,
        generated_tokens=100,
        generated_tokens_per_s=50.0,
        peak_host_rss_bytes=rss,
        generation_weights="gathered once",
        predictions=predictions,
    )


def test_table_has_a_column_per_result_and_a_row_per_reason():
    before, after = result(0, ["no prefix"] * 4, 2**20), result(3, ["wrong sum"], 3 * 2**20)
    lines = format_comparison({"before": before, "after": after}).splitlines()
    assert lines[0] == "eval task: sum_to_x"
    assert lines[1].split() == ["before", "after"]
    rows = {cells[0]: cells[1:] for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[2:])}
    assert rows["accuracy"] == ["0.000", "0.750"]
    assert rows["correct / samples"] == ["0 / 4", "3 / 4"]
    assert rows["generated tokens/s"] == ["50.0", "50.0"]
    assert rows["peak host RSS"] == ["1.0 MiB", "3.0 MiB"]
    assert rows["weights in generation"] == ["gathered once", "gathered once"]
    assert rows["wrong: no prefix"] == ["4", "0"] and rows["wrong: wrong sum"] == ["0", "1"]
    assert "peak accelerator memory" not in rows, "a row with no value in any column is left out"


def test_report_and_predictions_files(tmp_path):
    before, after = result(0, ["no prefix"] * 2, None), result(2, [], None)
    path = write_eval_report({"before": before, "after": after}, tmp_path / "r" / "eval_report.json")
    report = json.loads(path.read_text())
    assert report["before"]["accuracy"] == 0.0 and report["after"]["accuracy"] == 1.0
    assert report["before"]["reasons"] == {"no prefix": 2}
    assert "predictions" not in report["after"]
    lines = write_predictions(before, tmp_path / "p.jsonl").read_text().splitlines()
    assert [json.loads(line)["reason"] for line in lines] == ["no prefix", "no prefix"]
