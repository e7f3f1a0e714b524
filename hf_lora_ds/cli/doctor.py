"""``python -m hf_lora_ds.doctor`` (installed: ``hf-lora-doctor``): will this machine train a LoRA run, and how fast?

One line per finding, in sections: the versions a run imports; each device with its memory, bf16 support and the
attention kernels that work on it; the distributed backends; DeepSpeed's ops (compatible here, checked without
building any); a measured matmul peak next to the peak the throughput callback divides by for MFU; then a short LoRA
run of the bundled demo model on the device through run_sft's own entry (the loss goes down, the adapter is saved
non-empty and reloads), with its tokens/s and MFU. ``ds_report`` lists DeepSpeed's ops and ``accelerate env`` the
versions; neither says whether this package trains here.

Exit 0 when every check a run needs passed, 1 otherwise; the last line names the culprits. A check that follows from
a failed one (the training run, when PEFT does not import) is listed as skipped, naming what it waits for, so that
one missing piece is one failing line.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import io
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["Finding", "main", "cli", "installed"]

# What every run imports: a failure here is a failure of the run. DeepSpeed too: the planner checks the shipped
# DeepSpeed configs against DeepSpeed's own schema before every run, with or without --deepspeed.
REQUIRED = ("torch", "transformers", "peft", "accelerate", "datasets", "safetensors", "tokenizers", "deepspeed")
# What some runs import, with the runs that need it.
OPTIONAL = {
    "bitsandbytes": "--load_in_4bit / --load_in_8bit (QLoRA)",
    "flash_attn": "--attn_implementation flash_attention_2",
    "liger_kernel": "--use_liger_kernel (pip install 'hf_lora_ds[liger]'; CUDA)",
    "swanlab": "--report_to swanlab",
}
TRAIN_STEPS = 6
TRAIN_RECORDS = 256


@dataclass
class Finding:
    """One line of the report. ``status``: ok, info, warn (some runs cannot do something), FAIL (no run works) or
    skip (not checked: a check it depends on failed)."""

    status: str
    name: str
    detail: str

    def line(self) -> str:
        return f"{self.status:<5} {self.name}: {self.detail}"


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}".rstrip(": ")


class Doctor:
    """Runs the sections in order; each check's exception becomes its FAIL line, never the end of the report."""

    def __init__(self, write: Callable[[str], None], train: bool = True) -> None:
        self.write = write
        self.train = train
        self.findings: list[Finding] = []
        self.broken: set[str] = set()  # culprits by name
        self.unavailable: set[str] = set()  # failed or skipped: what later checks wait for

    def add(self, status: str, name: str, detail: str) -> None:
        finding = Finding(status, name, detail)
        self.findings.append(finding)
        if status == "FAIL":
            self.broken.add(name)
        if status in ("FAIL", "skip"):
            self.unavailable.add(name)
        self.write(finding.line())

    def check(self, name: str, needs: tuple[str, ...], run: Callable[[], Iterator[tuple[str, str]] | None]) -> None:
        """``run`` yields (status, detail) lines for ``name``; skipped naming the first of ``needs`` that broke."""
        waiting = [need for need in needs if need in self.unavailable]
        if waiting:
            self.add(
                "skip",
                name,
                f"needs {waiting[0]}, which {'failed' if waiting[0] in self.broken else 'was skipped'} above",
            )
            return
        try:
            for status, detail in run() or ():
                self.add(status, name, detail)
        except Exception as err:  # noqa: BLE001  (the report goes on; the error is this check's finding)
            self.add("FAIL", name, _error(err))

    def section(self, title: str) -> None:
        self.write(f"== {title}")

    def run(self) -> int:
        self.section("versions")
        self.check("python", (), _python)
        for module in REQUIRED:
            self.check(module, (), lambda module=module: _required_module(module))
        for module, used_by in OPTIONAL.items():
            self.check(module, (), lambda module=module, used_by=used_by: _optional_module(module, used_by))
        self.check("hf_lora_ds", REQUIRED, _package)
        self.section("devices")
        self.check("cpu", ("torch",), _cpu)
        self.check("accelerators", ("torch",), _accelerators)
        self.check("attention", ("torch",), _attention)
        kernels = "hf_lora_ds.cli.doctor_kernels"  # imported when the check runs: it needs every required package
        self.check("kernels", (*REQUIRED, "hf_lora_ds"), lambda: importlib.import_module(kernels).default_kernels())
        self.section("distributed")
        self.check("torch.distributed", ("torch",), _distributed)
        self.check("deepspeed ops", ("torch", "deepspeed"), _deepspeed_ops)
        self.section("speed")
        self.check("matmul peak", ("torch", "hf_lora_ds"), _matmul_peak)
        if self.train:
            self.section(f"LoRA run ({TRAIN_STEPS} steps of the bundled demo)")
            self.check("lora run", (*REQUIRED, "hf_lora_ds"), self._lora_run)
        failed = sorted(self.broken)
        if failed:
            self.write(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}; a run needs each of them")
            return 1
        warned = sorted({f.name for f in self.findings if f.status == "warn"})
        tail = f"; warnings (some runs only): {', '.join(warned)}" if warned else ""
        self.write(f"doctor: this machine trains LoRA runs{tail}")
        return 0

    def _lora_run(self) -> Iterator[tuple[str, str]]:
        yield from _lora_run()


# --- versions -----------------------------------------------------------------------------------------------------


def _python() -> Iterator[tuple[str, str]]:
    yield "ok", f"{platform.python_version()} ({sys.executable})"


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "version unknown"


def _required_module(module: str) -> Iterator[tuple[str, str]]:
    try:
        imported = importlib.import_module(module)
    except Exception as err:  # noqa: BLE001  (a broken install raises more than ImportError)
        yield "FAIL", f"does not import ({_error(err)}): every run needs it (pip install {module})"
        return
    version = getattr(imported, "__version__", None) or _version(module)
    if module == "torch":
        cuda = imported.version.cuda or "none"
        cudnn = imported.backends.cudnn.version() if imported.backends.cudnn.is_available() else "none"
        version = f"{version} (CUDA {cuda}, cuDNN {cudnn})"
    yield "ok", version


def installed(module: str) -> bool:
    """Whether ``module`` can be imported, without importing it (importing bitsandbytes or swanlab takes seconds)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # in sys.modules as None: imports of it are blocked
        return False


def _optional_module(module: str, used_by: str) -> Iterator[tuple[str, str]]:
    if not installed(module):
        yield "info", f"not installed; needed by {used_by}"
        return
    yield "ok", _version(module.replace("_", "-"))


def _package() -> Iterator[tuple[str, str]]:
    import hf_lora_ds.cli.run  # every module a run imports

    yield "ok", f"{_version('hf_lora_ds')} ({Path(hf_lora_ds.cli.run.__file__).parents[1]})"


# --- devices ------------------------------------------------------------------------------------------------------


def _cpu() -> Iterator[tuple[str, str]]:
    import psutil
    import torch

    memory = psutil.virtual_memory()
    yield (
        "ok",
        (
            f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}, "
            f"{memory.total / 2**30:.1f} GiB RAM ({memory.available / 2**30:.1f} GiB free)"
        ),
    )


def _accelerators() -> Iterator[tuple[str, str]]:
    import torch

    if not torch.cuda.is_available():
        yield "info", "no CUDA device: runs train on the CPU in float32"
        return
    for index in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(index)
        free, total = torch.cuda.mem_get_info(index)
        bf16 = props.major >= 8
        yield (
            ("ok" if bf16 else "warn"),
            (
                f"cuda:{index} {props.name}, {total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free), "
                f"sm_{props.major}{props.minor}, bf16 {'yes' if bf16 else 'no: --dtype auto trains in float32'}"
            ),
        )


def _attention() -> Iterator[tuple[str, str]]:
    """sdpa on the run's device and dtype; on CUDA each of its kernels tried on a small bf16 call."""
    import torch
    import torch.nn.functional as F

    on_cuda = torch.cuda.is_available()
    device = "cuda" if on_cuda else "cpu"
    dtype = (
        torch.bfloat16 if on_cuda and torch.cuda.is_bf16_supported() else torch.float16 if on_cuda else torch.float32
    )
    q, k, v = (torch.randn(1, 2, 16, 64, device=device, dtype=dtype) for _ in range(3))
    F.scaled_dot_product_attention(q, k, v, is_causal=True)
    kernels = []
    if on_cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"):
            if not hasattr(SDPBackend, backend):
                continue
            try:
                with sdpa_kernel([getattr(SDPBackend, backend)]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True)
                kernels.append(f"{backend.split('_')[0].lower()} yes")
            except Exception:  # noqa: BLE001  (RuntimeError as a rule; any failure means the kernel is out)
                kernels.append(f"{backend.split('_')[0].lower()} no")
    from transformers.utils import is_flash_attn_2_available

    kernels.append(f"flash_attention_2 {'yes' if is_flash_attn_2_available() else 'no (flash_attn not installed)'}")
    yield "ok", f"sdpa works ({device}, {str(dtype).removeprefix('torch.')}); " + ", ".join(kernels)


# --- distributed ----------------------------------------------------------------------------------------------------


def _distributed() -> Iterator[tuple[str, str]]:
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        yield "warn", "torch was built without torch.distributed: only single-process runs work"
        return
    nccl = dist.is_nccl_available()
    backends = [f"gloo {'yes' if dist.is_gloo_available() else 'no'}", f"nccl {'yes' if nccl else 'no'}"]
    if nccl and torch.cuda.is_available():
        version = torch.cuda.nccl.version()  # a tuple; an int in older torch
        backends[-1] += f" ({'.'.join(map(str, version)) if isinstance(version, tuple) else version})"
    multi_gpu_without_nccl = torch.cuda.is_available() and not nccl
    yield (
        ("warn" if multi_gpu_without_nccl else "ok"),
        ", ".join(backends) + (": multi-GPU runs need nccl" if multi_gpu_without_nccl else ""),
    )


def _deepspeed_ops() -> Iterator[tuple[str, str]]:
    """DeepSpeed's own compatibility probe for each op (what ``ds_report`` prints), building none of them."""
    from deepspeed.git_version_info import installed_ops
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    from deepspeed.ops.op_builder.builder import probe_is_compatible
    from torch.utils.cpp_extension import CUDA_HOME, is_ninja_available

    with contextlib.redirect_stdout(io.StringIO()):  # the probes print their missing headers
        compatible = {name: probe_is_compatible(builder, False) for name, builder in ALL_OPS.items()}
    prebuilt = sorted(name for name, built in installed_ops.items() if built)
    usable = sorted(name for name, ok in compatible.items() if ok)
    not_here = sorted(name for name, ok in compatible.items() if not ok)
    yield "ok", f"compatible here (JIT-built on first use): {', '.join(usable) or 'none'}"
    yield "info", f"not compatible here: {', '.join(not_here) or 'none'}; prebuilt: {', '.join(prebuilt) or 'none'}"
    # The shipped offload configs use cpu_adam; a JIT build needs ninja, and CUDA ops nvcc.
    if "cpu_adam" not in usable or not is_ninja_available():
        yield "warn", "cpu_adam cannot be built here (needs ninja and a C++ compiler): *_offload configs fail"
    yield from _build_locks()
    import torch

    if torch.cuda.is_available() and CUDA_HOME is None:
        yield (
            "info",
            "no CUDA toolkit (CUDA_HOME): CUDA ops such as fused_adam cannot JIT-build; shipped configs "
            "use the trainer's torch AdamW, which needs none",
        )


def _build_locks(stale_after_s: float = 600.0) -> Iterator[tuple[str, str]]:
    """torch's ``lock`` file of an op's JIT build, older than any build takes: a build killed mid-way leaves it, and
    every later launch that needs the op waits on it without a word."""
    from torch.utils.cpp_extension import get_default_build_root

    root = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    for lock in sorted({*root.glob("*/lock"), *root.glob("*/*/lock")}):
        if (age_s := time.time() - lock.stat().st_mtime) > stale_after_s:  # younger: maybe a build running now
            yield "warn", f"{lock}: {age_s / 60:.0f} min old, left by a killed build (launches wait on it): remove it"


# --- speed --------------------------------------------------------------------------------------------------------


def _run_device_and_dtype() -> tuple[Any, Any]:
    import torch

    from hf_lora_ds.devices import auto_dtype

    on_cuda = torch.cuda.is_available()
    return torch.device("cuda:0" if on_cuda else "cpu"), getattr(torch, auto_dtype(on_cuda))


def _matmul_peak() -> Iterator[tuple[str, str]]:
    from hf_lora_ds.callbacks.throughput import measure_matmul_flops, peak_flops_per_device

    device, dtype = _run_device_and_dtype()
    measured = measure_matmul_flops(device, dtype)
    assumed, source = peak_flops_per_device(device, dtype)
    dtype_name = str(dtype).removeprefix("torch.")
    yield (
        "ok",
        (
            f"measured {measured / 1e12:.3g} TFLOP/s ({device.type}, {dtype_name}); the MFU denominator is "
            f"{assumed / 1e12:.3g} TFLOP/s from {source}: measured/assumed {measured / assumed:.2f}"
        ),
    )


def _lora_run() -> Iterator[tuple[str, str]]:
    """A few steps of the demo through run_sft.main, its output kept back (shown on failure), then the adapter."""
    from hf_lora_ds.cli import run as run_sft
    from hf_lora_ds.resources import DEMO_DATA

    with tempfile.TemporaryDirectory(prefix="hf_lora_doctor-") as output_dir:
        # The first records of the demo's data: the steps use 48, and tokenizing all 2,520 took longer than training.
        train_file = Path(output_dir, "train.json")
        records = json.loads((DEMO_DATA / "train.json").read_text(encoding="utf-8"))[:TRAIN_RECORDS]
        train_file.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
        argv = ["--output_dir", output_dir, "--train_file", str(train_file), "--eval_file", ""]
        argv += (
            f"--max_steps {TRAIN_STEPS} --logging_steps 2 --per_device_train_batch_size 8 --warmup_steps 0 "
            "--lr_scheduler_type constant --save_strategy no --report_to none --disable_tqdm true"
        ).split()
        captured = io.StringIO()
        start = time.perf_counter()
        try:
            with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
                run_sft.main(argv)
        except BaseException as err:  # SystemExit included: run_sft's user errors exit
            log = Path(tempfile.gettempdir(), "hf_lora_doctor_run.log")
            log.write_text(captured.getvalue() + traceback.format_exc(), encoding="utf-8")
            raise RuntimeError(f"run_sft failed: {_error(err)} (its output and traceback: {log})") from err
        seconds = time.perf_counter() - start
        history = json.loads(Path(output_dir, "trainer_state.json").read_text(encoding="utf-8"))["log_history"]
        losses = [entry["loss"] for entry in history if "loss" in entry]
        run = next((entry for entry in history if "throughput/run_mfu" in entry), {})
        if len(losses) < 2 or not losses[-1] < losses[0]:
            yield "FAIL", f"the loss did not go down over {TRAIN_STEPS} steps: {losses}"
        else:
            yield "ok", f"loss {losses[0]:.3f} -> {losses[-1]:.3f} in {TRAIN_STEPS} steps ({seconds:.1f} s with setup)"
        yield _throughput_verdict(run)
        yield from _check_adapter(Path(output_dir))


_THROUGHPUT_KEYS = (
    "throughput/run_tokens_per_second",
    "throughput/run_supervised_tokens_per_second",
    "throughput/run_mfu",
    "throughput/peak_tflops_per_device",
)


def _throughput_verdict(run: dict[str, float]) -> tuple[str, str]:
    """The run's tokens/s and MFU as the throughput callback logged them; a figure missing or not a positive finite
    number is a failure of the run's measurement, not a line of ``nan``."""
    figures = [run.get(key, math.nan) for key in _THROUGHPUT_KEYS]
    unusable = [key for key, figure in zip(_THROUGHPUT_KEYS, figures) if not (math.isfinite(figure) and figure > 0)]
    if unusable:
        return "FAIL", f"the run logged no usable throughput: {', '.join(unusable)} missing or not positive"
    tokens, supervised, mfu, peak = figures
    return "ok", f"{tokens:.0f} tokens/s ({supervised:.0f} supervised), MFU {mfu:.3f} of {peak:.3g} TFLOP/s"


def _check_adapter(directory: Path) -> Iterator[tuple[str, str]]:
    """The saved adapter: every tensor non-empty, lora_B trained off zero, and PEFT reloads it onto the base, where
    it changes the logits."""
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from hf_lora_ds.resources import DEMO_MODEL

    path = directory / "adapter_model.safetensors"
    tensors = load_file(path)
    empty = [name for name, tensor in tensors.items() if tensor.numel() == 0]
    trained = [name for name, tensor in tensors.items() if "lora_B" in name and bool(tensor.abs().sum() > 0)]
    if not tensors or empty or not trained:
        yield "FAIL", f"{path}: {len(tensors)} tensors, {len(empty)} empty, {len(trained)} lora_B off zero"
        return
    base = AutoModelForCausalLM.from_pretrained(DEMO_MODEL, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, directory).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            plain = model(input_ids=ids).logits
    if torch.equal(adapted, plain):
        yield "FAIL", f"{directory}: the reloaded adapter does not change the model's logits"
        return
    yield (
        "ok",
        f"adapter saved ({len(tensors)} tensors, {path.stat().st_size / 2**10:.0f} KiB), reloads, changes logits",
    )


# --- entry --------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf-lora-doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no_train", action="store_true", help="skip the short LoRA run (the seconds it takes)")
    options = parser.parse_args(argv)
    return Doctor(lambda line: print(line, flush=True), train=not options.no_train).run()


def cli() -> None:
    """The installed command ``hf-lora-doctor``."""
    raise SystemExit(main())
