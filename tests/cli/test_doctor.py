"""hf_lora_ds.doctor: every section on this CPU and exit 0; a missing dependency is one FAIL line naming it, the
checks that need it skipped, and a non-zero exit."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hf_lora_ds.cli import doctor
from tests.e2e.launching import REPO, launch_env

SECTIONS = ("== versions", "== devices", "== distributed", "== speed", "== LoRA run")
CHECKS = (
    "python",
    *doctor.REQUIRED,
    "hf_lora_ds",
    "cpu",
    "accelerators",
    "attention",
    "torch.distributed",
    "deepspeed ops",
    "matmul peak",
    "lora run",
)


# The path finder, blind to one top-level module: to every import and find_spec it is not installed.
_BLOCKER = """
import importlib.machinery, runpy, sys
class PathFinderWithout(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.split(".")[0] == {module!r} else super().find_spec(name, path, target)
sys.meta_path = [PathFinderWithout if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
sys.argv = ["hf-lora-doctor"]
runpy.run_module("hf_lora_ds.doctor", run_name="__main__")
"""


def _blocked_doctor(module: str) -> subprocess.CompletedProcess:
    """``python -m hf_lora_ds.doctor`` in a fresh interpreter where ``module`` is not installed."""
    code = _BLOCKER.format(module=module)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=launch_env(), capture_output=True, text=True)


def test_a_healthy_machine_gets_every_section_and_exit_0(capsys):
    assert doctor.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    for section in SECTIONS:
        assert any(line.startswith(section) for line in lines), section
    named = {line.split(":", 1)[0].split(maxsplit=1)[1] for line in lines if not line.startswith(("==", "doctor:"))}
    assert set(CHECKS) <= named, set(CHECKS) - named
    assert not [line for line in lines if line.startswith(("FAIL", "skip"))]
    run = [line for line in lines if line.startswith("ok    lora run:")]
    assert any("loss" in line and "->" in line for line in run), run
    (speed,) = [line for line in run if "tokens/s" in line and "MFU" in line]
    figures = [
        float(figure)
        for figure in re.findall(r"(\S+) tokens/s \((\S+) supervised\), MFU (\S+) of (\S+) TFLOP", speed)[0]
    ]
    assert all(math.isfinite(figure) and figure > 0 for figure in figures), speed
    assert any("adapter saved" in line and "reloads" in line for line in run), run
    assert lines[-1].startswith("doctor: this machine trains LoRA runs")


@pytest.mark.slow
def test_a_missing_peft_is_one_named_failure_and_a_non_zero_exit():
    done = _blocked_doctor("peft")
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    failures = [line for line in lines if line.startswith("FAIL")]
    assert len(failures) == 1 and failures[0].startswith("FAIL  peft: does not import"), failures
    assert "skip  lora run: needs peft" in done.stdout
    assert lines[-1].startswith("doctor: 1 check(s) failed: peft")
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_a_plain_run_needs_deepspeed_so_its_absence_fails():
    done = _blocked_doctor("deepspeed")
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert done.returncode == 1 and len(failures) == 1 and failures[0].startswith("FAIL  deepspeed:"), done.stdout


def test_a_check_that_raises_is_its_own_failure_and_the_report_goes_on():
    lines: list[str] = []
    report = doctor.Doctor(lines.append, train=False)

    def broken():
        raise RuntimeError("no kernel image is available for execution on the device\nsecond line")

    report.check("attention", (), broken)
    report.check("matmul peak", ("attention",), lambda: iter([("ok", "measured")]))
    report.check("cpu", (), lambda: iter([("ok", "2 cores")]))
    assert lines == [
        "FAIL  attention: RuntimeError: no kernel image is available for execution on the device",
        "skip  matmul peak: needs attention, which failed above",
        "ok    cpu: 2 cores",
    ]


def test_a_run_that_logged_no_throughput_fails_its_speed_line(monkeypatch):
    from hf_lora_ds.cli import run as run_sft

    def fake_main(argv):
        state = Path(argv[argv.index("--output_dir") + 1], "trainer_state.json")
        history = [{"loss": 4.3}, {"loss": 3.1}, {"throughput/run_mfu": float("nan")}]
        state.write_text(json.dumps({"log_history": history}))

    monkeypatch.setattr(run_sft, "main", fake_main)
    monkeypatch.setattr(doctor, "_check_adapter", lambda directory: iter(()))
    found = list(doctor._lora_run())
    assert found[0][0] == "ok" and found[1][0] == "FAIL", found
    assert "throughput/run_tokens_per_second" in found[1][1] and "throughput/run_mfu" in found[1][1], found


def test_an_adapter_that_does_not_change_the_logits_fails(tmp_path):
    """lora_B off zero but lora_A all zero: every tensor is there and "trained", yet B·A is zero."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from hf_lora_ds.resources import DEMO_MODEL

    model = get_peft_model(AutoModelForCausalLM.from_pretrained(DEMO_MODEL), LoraConfig(r=2, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.fill_(0.5 if "lora_B" in name else 0.0)
    model.save_pretrained(tmp_path)
    found = list(doctor._check_adapter(tmp_path))
    assert found == [("FAIL", f"{tmp_path}: the reloaded adapter does not change the model's logits")], found
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_A" in name:
                parameter.fill_(0.5)
    model.save_pretrained(tmp_path)
    assert [verdict for verdict, _ in doctor._check_adapter(tmp_path)] == ["ok"]


@pytest.mark.parametrize("losses", [[4.3, 4.3], [4.3, 4.5], [4.3]])
def test_a_loss_that_does_not_fall_fails_the_run(monkeypatch, losses):
    """The run's own check, fed a trainer_state.json whose loss stays, rises or was logged once."""
    from hf_lora_ds.cli import run as run_sft

    def fake_main(argv):
        state = Path(argv[argv.index("--output_dir") + 1], "trainer_state.json")
        state.write_text(json.dumps({"log_history": [{"loss": loss} for loss in losses]}))

    monkeypatch.setattr(run_sft, "main", fake_main)
    monkeypatch.setattr(doctor, "_check_adapter", lambda directory: iter(()))
    found = list(doctor._lora_run())
    assert found[0][0] == "FAIL" and "did not go down" in found[0][1], found


def test_a_build_lock_older_than_any_build_is_named(tmp_path, monkeypatch):
    """A killed JIT build's lock makes every later launch wait forever: the doctor names it; a fresh one (a build
    running now) is left alone."""
    import os
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    for op, age_s in (("deepspeed_shm_comm", 3600), ("cpu_adam", 30)):
        (tmp_path / op).mkdir()
        (tmp_path / op / "lock").touch()
        os.utime(tmp_path / op / "lock", (time.time() - age_s,) * 2)
    findings = [(status, detail) for status, detail in doctor._deepspeed_ops() if "lock" in detail]
    assert [status for status, _ in findings] == ["warn"]
    assert str(tmp_path / "deepspeed_shm_comm" / "lock") in findings[0][1] and "60 min old" in findings[0][1]
