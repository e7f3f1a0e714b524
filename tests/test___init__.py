"""The package face: every public name resolves, on first use, to its module's object; importing the package loads
none of the modules behind them (so ``python -m hf_lora_ds.doctor`` starts where one of their dependencies is
missing)."""

from __future__ import annotations

import importlib
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


@pytest.mark.slow  # a fresh interpreter (the quick tier starts none: tests/conftest.py)
def test_importing_the_package_loads_no_module_behind_the_names():
    code = "import sys, hf_lora_ds\nprint(sorted(m for m in sys.modules if m.startswith('hf_lora_ds.')))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "['hf_lora_ds.quiet']", done.stdout
