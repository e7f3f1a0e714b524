"""Answer accuracy during training under 2-rank ZeRO-3 (``eval_accuracy``) and the final before/after predictions
must be what a single process computes from the saved adapter with ``python -m hf_lora_ds.eval``.

The model has large random weights (``varied_model_dir``), so each prompt gets its own completion and a prediction
gathered from the wrong rank or in the wrong order would show. Its accuracy is 0 (an untrained tiny model does not
do arithmetic), so the verdict fields (reason, answer, tokens) and the texts carry the comparison.
"""

from __future__ import annotations

import json

import pytest
from launching import RUN_SFT, check_ok, eval_report, launcher, run, sft_args, trainer_state

from hf_lora_ds.eval.__main__ import main as eval_main

COMPARED = ("index", "prompt", "output", "answer", "correct", "reason", "num_tokens", "stopped")


def _predictions(path) -> list[dict]:
    return [
        {key: row[key] for key in COMPARED} for row in map(json.loads, path.read_text(encoding="utf-8").splitlines())
    ]


@pytest.mark.slow
def test_zero3_two_ranks_eval_accuracy_matches_one_process(varied_model_dir, sum_data, tmp_path):
    out = tmp_path / "out"
    args = sft_args(varied_model_dir, sum_data, out, "--deepspeed", "ds_configs/stage3.json",
                    "--eval_strategy", "steps", "--eval_steps", "2")  # fmt: skip
    launch = run(launcher("deepspeed", 2) + [str(RUN_SFT)] + args, tmp_path / "launch.log")
    check_ok(launch)

    history = trainer_state(out)["log_history"]
    during = {entry["step"]: entry["eval_accuracy"] for entry in history if "eval_accuracy" in entry}
    assert sorted(during) == [2, 4]
    report = eval_report(out)
    assert report["after"]["world_size"] == 2
    assert during[4] == report["after"]["accuracy"]  # step 4 is the final model

    data = ["--task", "sum_to_x", "--data", str(sum_data["eval"]), "--batch_size", "8"]
    for phase, adapter in (("before", []), ("after", ["--adapter", str(out)])):
        single = tmp_path / f"single-{phase}"
        assert eval_main(["--model", str(varied_model_dir), *adapter, *data, "--output_dir", str(single)]) == 0
        expected = json.loads((single / "eval_report.json").read_text())["eval"]
        assert expected["world_size"] == 1
        for key in ("accuracy", "num_correct", "num_samples", "reasons", "generated_tokens"):
            assert report[phase][key] == expected[key], (phase, key)
        assert _predictions(out / f"predictions_{phase}.jsonl") == _predictions(single / "predictions_eval.jsonl")
    before, after = (_predictions(out / f"predictions_{phase}.jsonl") for phase in ("before", "after"))
    assert len({row["output"] for row in after}) > 1, "every prompt got the same completion: the check is blind"
    assert before != after, "training did not change a single completion: the adapter comparison is blind"
