"""Answer accuracy during training under 2-rank ZeRO-3 (``eval_accuracy``, ``predictions_step{N}.jsonl``) and the
final before/after predictions must be what a single process computes from the saved adapters with
``python -m hf_lora_ds.eval``, prediction by prediction.

The base is the bundled sum-to-x model with its bundled adapter merged in, so it answers most prompts right
(accuracy ~0.8 on the 12 prompts here, not 0): a comparison of accuracies then says something, and every prompt gets
its own completion, so a prediction gathered from the wrong rank or in the wrong order would show. The short run at
the demo's learning rate changes most completions but keeps the answers mostly right.
"""

from __future__ import annotations

import json

import pytest

from hf_lora_ds.cli.eval import main as eval_main
from hf_lora_ds.model.merge_adapter import merge_adapter
from tests.e2e.launching import REPO, RUN_SFT, check_ok, eval_report, launcher, run, sft_args, trainer_state

COMPARED = ("index", "prompt", "output", "answer", "correct", "reason", "num_tokens", "stopped")
BUNDLED = REPO / "data"


def _predictions(path) -> list[dict]:
    return [
        {key: row[key] for key in COMPARED} for row in map(json.loads, path.read_text(encoding="utf-8").splitlines())
    ]


@pytest.fixture(scope="module")
def answering_model(tmp_path_factory):
    """The bundled base + bundled adapter, merged: a base model that already does sum-to-x, and 32 + 12 records."""
    root = tmp_path_factory.mktemp("answering")
    merge_adapter(BUNDLED / "tiny-qwen2-sum", BUNDLED / "tiny-qwen2-sum-lora", root / "model")
    data = {"train": root / "train.json", "eval": root / "eval.json"}
    for name, count in (("train", 32), ("eval", 12)):
        records = json.loads((BUNDLED / "sum_to_x" / f"{name}.json").read_text(encoding="utf-8"))[:count]
        data[name].write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return root / "model", data


@pytest.mark.slow
def test_zero3_two_ranks_eval_accuracy_matches_one_process(answering_model, tmp_path):
    model_dir, data = answering_model
    out = tmp_path / "out"
    args = sft_args(
        model_dir,
        data,
        out,
        "--deepspeed",
        "ds_configs/stage3.json",
        "--learning_rate",
        "3e-3",
        "--eval_strategy",
        "steps",
        "--eval_steps",
        "2",
        "--save_strategy",
        "steps",
        "--save_steps",
        "2",
    )
    launch = run(launcher("deepspeed", 2) + [str(RUN_SFT)] + args, tmp_path / "launch.log")
    check_ok(launch)

    history = trainer_state(out)["log_history"]
    during = {entry["step"]: entry["eval_accuracy"] for entry in history if "eval_accuracy" in entry}
    assert sorted(during) == [2, 4]
    assert min(during.values()) >= 0.5, f"the comparison needs a model that answers: {during}"
    report = eval_report(out)
    assert report["after"]["world_size"] == 2
    assert [report[phase]["generation_weights"] for phase in report] == ["gathered once"] * 2  # eval.whole_weights

    def one_process(name: str, adapter: list[str]) -> tuple[dict, list[dict]]:
        single = tmp_path / f"single-{name}"
        command = [
            "--model_name_or_path",
            str(model_dir),
            *adapter,
            "--task",
            "sum_to_x",
            "--data",
            str(data["eval"]),
            "--batch_size",
            "8",
            "--output_dir",
            str(single),
        ]
        assert eval_main(command) == 0
        summary = json.loads((single / "eval_report.json").read_text())["eval"]
        assert summary["world_size"] == 1
        return summary, _predictions(single / "predictions_eval.jsonl")

    # During training: the weights of step N are the ones saved in checkpoint-N (step 4 is the final adapter).
    for step, adapter_dir in ((2, out / "checkpoint-2"), (4, out)):
        summary, expected = one_process(f"step{step}", ["--adapter", str(adapter_dir)])
        assert during[step] == summary["accuracy"], step
        assert _predictions(out / f"predictions_step{step}.jsonl") == expected, step
    # After training, run_sft's own before (adapter off) / after evals.
    for phase, adapter in (("before", []), ("after", ["--adapter", str(out)])):
        summary, expected = one_process(phase, adapter)
        for key in ("accuracy", "num_correct", "num_samples", "reasons", "generated_tokens"):
            assert report[phase][key] == summary[key], (phase, key)
        assert _predictions(out / f"predictions_{phase}.jsonl") == expected, phase

    before, step2, after = (_predictions(out / f"predictions_{name}.jsonl") for name in ("before", "step2", "after"))
    assert len({row["output"] for row in after}) == len(after), "prompts share a completion: the check is blind"
    assert before != step2 != after, "training did not change a completion: the adapter comparison is blind"
