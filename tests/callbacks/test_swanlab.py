"""``report_to="swanlab"`` with no API key and no network: a local run whose files hold the metrics and config."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import swanlab
import yaml

from hf_lora_ds.callbacks import (
    AnswerAccuracyCallback,
    MemoryTraceCallback,
    ThroughputCallback,
    default_swanlab_mode,
    log_accuracy_end_points,
    use_swanlab,
)
from hf_lora_ds.callbacks.swanlab import default_swanlab_project, swanlab_names
from hf_lora_ds.eval import Generation, evaluator
from tests.callbacks.callback_helpers import lora_model, read_local_points, read_local_runs
from tests.callbacks.test_accuracy import RECORDS


def test_mode_defaults_to_local_only_without_key_or_choice(no_swanlab_key, monkeypatch):
    assert default_swanlab_mode() == "local"  # swanboard (the dashboard extra) is installed here
    monkeypatch.setenv("SWANLAB_API_KEY", "x" * 21)
    assert default_swanlab_mode() is None
    monkeypatch.delenv("SWANLAB_API_KEY")
    monkeypatch.setenv("SWANLAB_MODE", "disabled")
    assert default_swanlab_mode() is None


def test_local_run_holds_metrics_and_config(no_swanlab_key, make_trainer, tmp_path):
    trainer = make_trainer(report_to="swanlab")
    MemoryTraceCallback(print_blocks=False).attach(trainer)
    ThroughputCallback().attach(trainer)
    use_swanlab(trainer, project="hf-lora-ds-test", log_dir=str(tmp_path / "swanlog"))
    try:
        trainer.train()
    finally:
        swanlab.finish()

    assert received_names(tmp_path / "swanlog") == ("hf-lora-ds-test", Path(trainer.args.output_dir).name)
    metrics = read_local_runs(tmp_path / "swanlog")
    assert len(metrics["train/loss"]) == 2
    assert metrics["train/throughput/tokens_per_second"] == [
        e["throughput/tokens_per_second"] for e in trainer.state.log_history if "throughput/tokens_per_second" in e
    ]
    for key in ("memory/train/cpu_peak_mib_max", "throughput/run_mfu"):  # what SwanLab holds is what was logged
        assert metrics[f"train/{key}"] == [pytest.approx(e[key]) for e in trainer.state.log_history if key in e], key

    (config_file,) = (tmp_path / "swanlog").glob("run-*/files/config.yaml")
    config = yaml.safe_load(config_file.read_text())
    assert config["peft_config"]["value"]["default"]["r"] == 4  # fields, not a repr string
    assert config["learning_rate"]["value"] == trainer.args.learning_rate


def received_names(log_dir: Path) -> tuple[str, str]:
    """The project and experiment names of the one local run in ``log_dir``, as the dashboard reads them."""
    with sqlite3.connect(log_dir / "runs.swanlab") as db:
        ((project,),) = db.execute("SELECT name FROM project").fetchall()
        ((experiment,),) = db.execute("SELECT name FROM experiment").fetchall()
    return project, experiment


def train_one_step(trainer, log_dir: Path) -> None:
    use_swanlab(trainer, log_dir=str(log_dir))
    try:
        trainer.train()
    finally:
        swanlab.finish()


def test_names_say_which_model_and_which_run(no_swanlab_key, make_trainer, qwen_style_tokenizer, tmp_path):
    """Not the current directory's name (``tmp_path``'s here, what swanlab picks) nor a random run name."""
    model = lora_model(qwen_style_tokenizer)
    model.config.name_or_path = "Qwen/Qwen2.5-0.5B-Instruct"
    trainer = make_trainer(model=model, report_to="swanlab", output_dir=str(tmp_path / "sum-r8/"), max_steps=1)
    train_one_step(trainer, tmp_path / "swanlog")
    assert received_names(tmp_path / "swanlog") == ("Qwen2.5-0.5B-Instruct-lora-sft", "sum-r8")


def test_names_the_user_gave_win(no_swanlab_key, make_trainer, tmp_path):
    trainer = make_trainer(report_to="swanlab", project="my-project", run_name="first try", max_steps=1)
    train_one_step(trainer, tmp_path / "swanlog")
    assert received_names(tmp_path / "swanlog") == ("my-project", "first try")


def test_names_swanlab_settings_give_are_kept(no_swanlab_key, make_trainer, monkeypatch):
    trainer = make_trainer()
    assert set(swanlab_names(trainer.args, trainer.model)) == {"project", "experiment_name"}
    monkeypatch.setenv("SWANLAB_PROJ_NAME", "from-env")
    monkeypatch.setenv("SWANLAB_EXP_NAME", "run-from-env")
    assert swanlab_names(trainer.args, trainer.model) == {}  # swanlab.init reads them itself


@pytest.mark.parametrize(
    ("model", "project"),
    [
        ("/models/Llama 3.1 8B (instruct)/", "Llama-3.1-8B-instruct-lora-sft"),
        ("data/tiny-qwen2-sum", "tiny-qwen2-sum-lora-sft"),
        ("", "hf-lora-ds"),
        (None, "hf-lora-ds"),
        ("m" * 200, "m" * 91 + "-lora-sft"),
    ],
)
def test_default_project_is_a_name_swanlab_accepts(model, project):
    assert default_swanlab_project(model) == project


def test_accuracy_series_runs_from_before_to_after(
    no_swanlab_key, make_trainer, qwen_style_tokenizer, monkeypatch, tmp_path
):
    """eval/accuracy holds the evaluation during training and, as its end points, before at step 0 and after at the
    last step: one curve from the base model to the tuned one."""
    answers = iter(["0", "x", "x", "0", "1", "2"])  # steps 3 and 4 (Trainer evaluates the last step too): 1/3, 3/3
    monkeypatch.setattr(
        evaluator,
        "generate",
        lambda model, tokenizer, prompts, **kwargs: [Generation(next(answers), 1, True) for _ in prompts],
    )
    trainer = make_trainer(report_to="swanlab", eval_strategy="steps", eval_steps=3)
    AnswerAccuracyCallback(qwen_style_tokenizer, RECORDS, "exact_match").attach(trainer)
    use_swanlab(trainer, log_dir=str(tmp_path / "swanlog"))
    try:
        trainer.train()
        log_accuracy_end_points(trainer, before=0.0, after=1.0)
    finally:
        swanlab.finish()
    assert trainer.state.global_step == 4
    points = read_local_points(tmp_path / "swanlog")["eval/accuracy"]
    assert sorted(points) == [(0, 0.0), (3, pytest.approx(1 / 3)), (4, 1.0)]  # the after at 4 is the last evaluation's
