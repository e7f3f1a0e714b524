"""hf_lora_ds.command_process: a command's imports are kept from the collector and its noise quieted, in its own
process; every way to start a command (``python -m``, run_sft.py, the installed scripts) goes through it. The quieted
third-party outputs are the ones a run's user cannot act on, and only those."""

from __future__ import annotations

import configparser
import gc
import importlib
import json
import logging
import runpy
import subprocess
import sys
import warnings

import pytest
import torch
from peft import LoraConfig, get_peft_model

from hf_lora_ds import command_process
from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
from hf_lora_ds.command_process import QUIETED_DEEPSPEED_LOG, quiet_third_party_noise
from tests import REPO
from tests.e2e.launching import free_port

# In a fresh interpreter: a cycle made with the collector off (only the command's own collection can free it), the
# collections run while the command imports its modules, and what the collector holds after them.
_COMMAND_PROBE = """
import gc, json, sys, warnings, weakref
gc.disable()
class Node: pass
cycle = Node(); cycle.itself = cycle; before_import = weakref.ref(cycle); del cycle
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
from hf_lora_ds.command_process import command_imports
from hf_lora_ds.command_process import QUIETED_WARNING
with command_imports():
    import hf_lora_ds.cli.run
print(json.dumps({
    "collections": collections,
    "frozen": gc.get_freeze_count(),
    "collector_enabled": gc.isenabled(),
    "garbage_from_before_freed": before_import() is None,
    "quieted": any(f[1] is not None and f[1].pattern == QUIETED_WARNING for f in warnings.filters),
}))
"""


@pytest.mark.slow  # a fresh interpreter (the quick tier starts none: tests/conftest.py)
def test_a_commands_imports_are_frozen_after_one_collection_and_its_noise_quieted():
    done = subprocess.run([sys.executable, "-c", _COMMAND_PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["collections"] == [2], seen  # the command's full collection first, then none while it imports
    assert seen["garbage_from_before_freed"] and seen["frozen"] > 100_000, seen
    assert not seen["collector_enabled"] and seen["quieted"], seen  # off before, so off after


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_back_as_it_was_after_the_imports_even_when_they_fail(enabled_before, monkeypatch):
    monkeypatch.setattr(gc, "freeze", lambda: None)  # this worker's objects stay collectable after the test
    toggle = gc.enable if enabled_before else gc.disable
    toggle()
    try:
        with pytest.raises(ImportError), command_process.imports_kept_from_the_collector():
            assert not gc.isenabled()
            raise ImportError("no module named 'peft'")
        assert gc.isenabled() == enabled_before
    finally:
        gc.enable()


def _console_scripts() -> dict[str, str]:
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    lines = setup["options.entry_points"]["console_scripts"].strip().splitlines()
    return dict(line.replace(" ", "").split("=") for line in lines)


# Every way a user starts a command: python -m (the package's modules), the script, the installed commands.
STARTS = {
    "python -m hf_lora_ds.run_sft": lambda: runpy.run_module("hf_lora_ds.run_sft", run_name="__main__"),
    "python run_sft.py": lambda: runpy.run_path(str(REPO / "run_sft.py"), run_name="__main__"),
    **{
        f"python -m hf_lora_ds.{name}": (lambda name=name: runpy.run_module(f"hf_lora_ds.{name}", run_name="__main__"))
        for name in ("audit", "merge", "doctor", "eval", "plan")
    },
    **{
        script: (lambda target=target: getattr(importlib.import_module(target.split(":")[0]), target.split(":")[1])())
        for script, target in _console_scripts().items()
    },
}


# In a fresh interpreter: what is imported by the time a ``python -m`` start hands over to run_command.
_BEFORE_THE_COMMAND = """
import json, runpy, sys
from hf_lora_ds import command_process
command_process.run_command = lambda *args: print(json.dumps(sorted(
    name for name in ("torch", "transformers", "peft", "deepspeed") if name in sys.modules)))
run = runpy.run_path if sys.argv[1].endswith(".py") else runpy.run_module
run(sys.argv[1], run_name="__main__")
"""


@pytest.mark.slow  # fresh interpreters
def test_each_python_m_start_reaches_the_command_before_any_library_import():
    """PEFT must be imported the command's way (``quiet_third_party_noise``), and the collector kept from the
    libraries' objects: nothing heavy may be imported before ``run_command``, by the module or by its package's
    ``__init__``."""
    starts = [f"hf_lora_ds.{name}" for name in ("run_sft", "audit", "merge", "doctor", "eval", "plan")]
    for start in [*starts, "run_sft.py"]:
        done = subprocess.run(
            [sys.executable, "-c", _BEFORE_THE_COMMAND, start], cwd=REPO, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [], (start, done.stdout)


@pytest.mark.parametrize("start", STARTS)
def test_every_way_to_start_a_command_goes_through_run_command(start, monkeypatch):
    started = []
    monkeypatch.setattr(command_process, "run_command", started.append)
    STARTS[start]()
    (module,) = started
    assert module.startswith("hf_lora_ds.cli.") and callable(importlib.import_module(module).cli), module


def _wrap(tokenizer, quiet: bool) -> list[str]:
    """The FutureWarnings raised by PEFT wrapping a tiny model, every one shown (no "once per location" registry)."""
    model = build_tiny_qwen2(tokenizer, hidden_size=16, num_hidden_layers=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if quiet:
            quiet_third_party_noise()  # its filter goes before "always", as the package's goes before defaults
        get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
        warnings.warn("some other future change", FutureWarning, stacklevel=1)
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_the_gradient_checkpointing_future_warning_alone_is_filtered(qwen_style_tokenizer):
    loud = _wrap(qwen_style_tokenizer, quiet=False)
    assert any("is_gradient_checkpointing" in message for message in loud), (
        "PEFT no longer triggers transformers' deprecation warning: drop its filter from hf_lora_ds.command_process"
    )
    quiet = _wrap(qwen_style_tokenizer, quiet=True)
    assert quiet == ["some other future change"]


def _collective_warnings(quiet: bool) -> list[str]:
    """The FutureWarnings of the two collectives DeepSpeed's ZeRO calls, on a one-rank gloo group, every one shown."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if quiet:
                quiet_third_party_noise()
            torch.distributed.all_gather_into_tensor(torch.zeros(2), torch.ones(2))
            torch.distributed.reduce_scatter_tensor(torch.zeros(2), torch.ones(2))
            warnings.warn("some other future change", FutureWarning, stacklevel=1)
    finally:
        torch.distributed.destroy_process_group()
    return [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


@pytest.mark.skipif(
    not hasattr(torch.distributed, "all_gather_single"),
    reason=f"torch {torch.__version__} does not deprecate the collectives DeepSpeed calls (2.13 does, naming "
    "all_gather_single and reduce_scatter_single instead): nothing to filter",
)
def test_the_deprecated_collectives_deepspeed_calls_alone_are_filtered():
    loud = _collective_warnings(quiet=False)
    assert sum("is deprecated" in message for message in loud) == 2, (
        f"torch no longer deprecates the collectives DeepSpeed calls ({loud}): drop the filter from "
        "hf_lora_ds.command_process"
    )
    assert _collective_warnings(quiet=True) == ["some other future change"]


def test_deepspeed_cpu_fallback_line_alone_is_dropped():
    quiet_third_party_noise()
    logger = logging.getLogger("DeepSpeed")

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, message, None, None)

    assert not logger.filter(record(QUIETED_DEEPSPEED_LOG))
    assert logger.filter(record("Setting ds_accelerator to cpu (auto detect)"))


def test_deepspeed_lines_that_share_the_quieted_ones_start_or_end_still_show():
    """Only the exact line is dropped: a line that begins or ends as it does says something else."""
    quiet_third_party_noise()
    logger = logging.getLogger("DeepSpeed")
    same_start = QUIETED_DEEPSPEED_LOG.split(".")[0] + ", but the CUDA device 0 failed: driver too old."
    for message in (
        same_start,
        QUIETED_DEEPSPEED_LOG[:-1],
        QUIETED_DEEPSPEED_LOG + " Retrying.",
        "Warning: " + QUIETED_DEEPSPEED_LOG,
    ):
        assert logger.filter(logging.LogRecord("DeepSpeed", logging.WARNING, __file__, 1, message, None, None)), message


_TINY_LORA_WRAP = """
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM
config = Qwen2Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1)
def wrapped_q_proj(model):
    model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    return type(model.base_model.model.model.layers[0].self_attn.q_proj).__module__
"""


@pytest.mark.slow
def test_only_a_quantized_run_imports_bitsandbytes():
    """In a fresh interpreter, as run_sft.py runs: parsing a run (its --help path) and a LoRA wrap of an unquantized
    model leave bitsandbytes unimported (PEFT's dispatch would import it on every wrap: 1.3 s of each rank's start);
    once a quantized load imports it, quantization's hand-over gives PEFT's helper the module and PEFT's dispatch
    gives a 4-bit layer its bitsandbytes LoRA layer."""
    code = (
        "import runpy, sys\n"
        "sys.argv = ['run_sft.py', '--help']\n"
        "try:\n    runpy.run_path('run_sft.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "parsed = 'bitsandbytes' in sys.modules\n"
        + _TINY_LORA_WRAP
        + "plain = wrapped_q_proj(Qwen2ForCausalLM(config))\n"
        "wrapped = 'bitsandbytes' in sys.modules\n"
        "import peft.helpers\n"
        "helper = peft.helpers.bnb\n"
        "import bitsandbytes\n"  # as transformers' quantizer does in a quantized load
        "from hf_lora_ds.model.quantization import _give_peft_bitsandbytes\n"
        "_give_peft_bitsandbytes()\n"
        "from peft.import_utils import is_bnb_4bit_available\n"
        "quantized = Qwen2ForCausalLM(config)\n"
        "quantized.is_loaded_in_4bit = True\n"  # as transformers marks a 4-bit load
        "attention = quantized.model.layers[0].self_attn\n"
        "attention.q_proj = bitsandbytes.nn.Linear4bit(16, 16, bias=True)\n"
        "print(parsed, wrapped, plain, helper, peft.helpers.bnb.__name__, is_bnb_4bit_available(),"
        " wrapped_q_proj(quantized))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        done.stdout.splitlines()[-1] == "False False peft.tuners.lora.layer None bitsandbytes True peft.tuners.lora.bnb"
    )


# A CPU with AVX512-BF16, where bitsandbytes tries the kernels-community kernel when imported (and logs its failure),
# whatever CPU runs the test: its feature probe answers True.
_AVX512_BF16_CPU = """
import importlib.abc, sys
class ClaimAvx512Bf16(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "bitsandbytes.functional":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            module.has_avx512bf16 = lambda: True
        spec.loader.exec_module = exec_module
        return spec
import importlib.util
sys.meta_path.insert(0, ClaimAvx512Bf16())
"""


_QUIETED = "from hf_lora_ds.command_process import quiet_third_party_noise; quiet_third_party_noise()\n"


def _lora_wrap_output(quieted: bool) -> str:
    """stderr of a fresh interpreter that wraps a tiny model with LoRA (PEFT imports bitsandbytes there), on an
    AVX512-BF16 CPU, then logs another line on bitsandbytes' CPU logger."""
    code = (
        _AVX512_BF16_CPU
        + (
            "from hf_lora_ds.command_process import quiet_third_party_noise; quiet_third_party_noise()\n"
            if quieted
            else ""
        )
        + "import logging\n"
        + "import bitsandbytes\n"  # as a quantized load does: an unquantized run never imports it
        + _TINY_LORA_WRAP
        + (
            "wrapped_q_proj(Qwen2ForCausalLM(config))\n"
            "assert 'bitsandbytes.backends.cpu.ops' in sys.modules\n"
            "logging.getLogger('bitsandbytes.backends.cpu.ops').warning('another bitsandbytes line')\n"
        )
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.mark.slow
def test_bitsandbytes_kernels_line_alone_is_dropped_on_an_avx512_bf16_cpu():
    assert "Failed to load CPU gemm_4bit_forward from kernels-community" in _lora_wrap_output(quieted=False)
    quiet = _lora_wrap_output(quieted=True)
    assert "gemm_4bit_forward" not in quiet, quiet
    assert "another bitsandbytes line" in quiet
