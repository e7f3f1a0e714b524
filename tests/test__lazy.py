"""hf_lora_ds._lazy: a package's public names import their module on first use, and only then."""

from __future__ import annotations

import importlib
import sys
import types

import pytest

from hf_lora_ds._lazy import lazy_names


@pytest.fixture
def package(monkeypatch):
    module = types.ModuleType("lazy_probe")
    monkeypatch.setitem(sys.modules, "lazy_probe", module)
    monkeypatch.delitem(sys.modules, "tests.e2e.deepspeed_ops", raising=False)
    module.__getattr__, module.__dir__ = lazy_names("lazy_probe", {"BUILDERS": "tests.e2e.deepspeed_ops"})
    return module


def test_a_name_imports_its_module_on_first_use_and_is_kept(package):
    assert "tests.e2e.deepspeed_ops" not in sys.modules
    assert package.BUILDERS == sys.modules["tests.e2e.deepspeed_ops"].BUILDERS
    assert "BUILDERS" in vars(package)  # later lookups are plain attribute reads
    assert "BUILDERS" in dir(package)


def test_an_unknown_name_is_an_attribute_error(package):
    with pytest.raises(AttributeError, match="module 'lazy_probe' has no attribute 'builders'"):
        package.builders  # noqa: B018


@pytest.mark.parametrize("name", ["hf_lora_ds", "hf_lora_ds.eval", "hf_lora_ds.plan"])
def test_each_public_name_is_its_object_after_its_module_is_imported(name):
    # Importing a submodule binds its name on the package, so a public name that is also a submodule's name
    # would read as the module from then on.
    package = importlib.import_module(name)
    for export, module in package._EXPORTS.items():
        assert getattr(package, export) is getattr(importlib.import_module(module), export), export
