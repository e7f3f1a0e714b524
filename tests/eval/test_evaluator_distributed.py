"""Two CPU ranks (torchrun + gloo) split the eval set and return exactly what one process returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hf_lora_ds.cli.eval import main


@pytest.mark.slow
def test_two_ranks_match_one_process(tmp_path, varied_model_dir, sum_records_file):
    args = ["--model_name_or_path", str(varied_model_dir), "--data", str(sum_records_file), "--batch_size", "4"]
    assert main([*args, "--output_dir", str(tmp_path / "one")]) == 0

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command += ["-m", "hf_lora_ds.eval", *args, "--output_dir", str(tmp_path / "two")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the in-process run above (see conftest)
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.count("eval task: sum_to_x") == 1, "only rank 0 prints the table"

    one, two = ((tmp_path / d / "predictions_eval.jsonl").read_text(encoding="utf-8") for d in ("one", "two"))
    assert two == one
    report_one, report_two = (json.loads((tmp_path / d / "eval_report.json").read_text()) for d in ("one", "two"))
    assert report_two["eval"]["world_size"] == 2
    for key in ("accuracy", "num_correct", "num_samples", "reasons", "generated_tokens"):
        assert report_two["eval"][key] == report_one["eval"][key]
