"""hf_lora_ds.command_process: a command's imports are kept from the collector and its noise quieted, in its own
process; every way to start a command (``python -m``, run_sft.py, the installed scripts) goes through it."""

from __future__ import annotations

import configparser
import gc
import importlib
import json
import runpy
import subprocess
import sys

import pytest

from hf_lora_ds import command_process
from tests import REPO

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
from hf_lora_ds.quiet import QUIETED_WARNING
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
    done = subprocess.run(
        [sys.executable, "-c", _COMMAND_PROBE], cwd=REPO, capture_output=True, text=True, check=True, timeout=300
    )
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


@pytest.mark.parametrize("start", STARTS)
def test_every_way_to_start_a_command_goes_through_run_command(start, monkeypatch):
    started = []
    monkeypatch.setattr(command_process, "run_command", started.append)
    STARTS[start]()
    (module,) = started
    assert module.startswith("hf_lora_ds.cli.") and callable(importlib.import_module(module).cli), module
