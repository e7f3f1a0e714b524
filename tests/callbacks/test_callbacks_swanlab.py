"""``report_to="swanlab"`` with no API key and no network: a local run whose files hold the metrics and config."""

from __future__ import annotations

import pytest
import swanlab
import yaml
from callback_helpers import read_local_runs

from hf_lora_ds.callbacks import MemoryTraceCallback, ThroughputCallback, default_swanlab_mode, use_swanlab


@pytest.fixture
def no_swanlab_key(monkeypatch, tmp_path):
    for var in ("SWANLAB_MODE", "SWANLAB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-home"))  # no stored login
    monkeypatch.chdir(tmp_path)  # nor a project-level one


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
