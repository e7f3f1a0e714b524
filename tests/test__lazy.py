"""hf_lora_ds._lazy: a package's public names import their module on first use, and only then."""

from __future__ import annotations

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
