"""The package face: every public name resolves, on first use, to its module's object; importing the package loads
none of the modules behind them (so ``python -m hf_lora_ds.doctor`` starts where one of their dependencies is
missing)."""

from __future__ import annotations

import gc
import importlib
import json
import subprocess
import sys

import pytest

import hf_lora_ds
from tests.e2e.launching import REPO


@pytest.mark.parametrize("name", hf_lora_ds.__all__)
def test_each_public_name_is_its_modules_object(name):
    assert getattr(hf_lora_ds, name) is getattr(importlib.import_module(hf_lora_ds._EXPORTS[name]), name)
    assert name in dir(hf_lora_ds)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LoraTrainer'"):
        hf_lora_ds.LoraTrainer  # noqa: B018


# In a fresh interpreter: garbage made before the import (a cycle, seen through a weak reference), the collections
# run during the import, and what the collector holds after it.
_IMPORT_PROBE = """
import gc, json, sys, weakref
class Node: pass
cycle = Node(); cycle.itself = cycle; before_import = weakref.ref(cycle); del cycle
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info["generation"]))
import hf_lora_ds
during_import = list(collections)
gc.collect()
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("hf_lora_ds.")),
    "collections_during_import": during_import,
    "frozen": gc.get_freeze_count(),
    "collector_enabled": gc.isenabled(),
    "garbage_from_before_freed": before_import() is None,
}))
"""


@pytest.mark.slow  # a fresh interpreter (the quick tier starts none: tests/conftest.py)
def test_importing_the_package_loads_no_module_behind_the_names_and_keeps_its_imports_from_the_collector():
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE], cwd=REPO, capture_output=True, text=True, check=True, timeout=300
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["modules"] == ["hf_lora_ds.quiet"], seen["modules"]
    # the package's full collection before the imports, then none while torch, transformers and PEFT import
    collections = seen["collections_during_import"]
    assert 2 in collections and collections[collections.index(2) :] == [2], collections
    assert seen["frozen"] > 100_000 and seen["collector_enabled"] and seen["garbage_from_before_freed"], seen


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_back_as_it_was_after_the_imports_even_when_they_fail(enabled_before, monkeypatch):
    monkeypatch.setattr(gc, "freeze", lambda: None)  # this worker's objects stay collectable after the test
    toggle = gc.enable if enabled_before else gc.disable
    toggle()
    try:
        with pytest.raises(ImportError), hf_lora_ds._imports_kept_from_the_collector():
            assert not gc.isenabled()
            raise ImportError("no module named 'peft'")
        assert gc.isenabled() == enabled_before
    finally:
        gc.enable()
