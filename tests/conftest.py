"""Shared fixtures: tiny tokenizers and models built locally, never downloaded."""

from __future__ import annotations

import gc
import logging
import multiprocessing.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import ninja
import pytest

# Tiny models gain nothing from intra-op threads, and on a busy 2-core machine (two pytest-xdist workers, a launch's
# ranks) threads waiting on each other ran the same steps many times slower. Processes the tests start inherit it.
os.environ["OMP_NUM_THREADS"] = "1"
# This interpreter's bin on PATH, as an activated venv has it, for this process and all it starts: DeepSpeed's op
# builds run the first ``ninja`` on PATH, and a venv's ninja (1.13) and the system's (1.11) hash their logged commands
# differently, so each rebuilds (minutes) what the other built. In an unactivated run the wheel venv of
# tests/test_packaging.py (no ninja of its own) reaches the system's: shm_comm was built 4 times in one suite run.
# Before it, the ``ninja`` package's own bin (setup.cfg requires it) where pip put it elsewhere (a --user install).
os.environ["PATH"] = os.pathsep.join(
    [
        *dict.fromkeys(path for path in (ninja.BIN_DIR, str(Path(sys.executable).parent)) if path),
        os.environ.get("PATH", ""),
    ]
)
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from hf_lora_ds._testing.tiny_models import (
    CHATML_DEFAULT_SYSTEM_TEMPLATE,
    CHATML_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    QWEN3_ADDED_TOKENS,
    QWEN3_TEMPLATE,
    QWEN_TOOLS_TEMPLATE,
    build_tiny_qwen2,
    train_chat_tokenizer,
)
from tests.real_model.smollm2 import smollm2_dir, smollm2_gguf  # noqa: F401  (fixtures: tests/data reads it too)

torch.set_num_threads(1)  # torch read the variable when it was first imported, maybe before this file

E2E = Path(__file__).with_name("e2e")

_CORPUS = [
    DEFAULT_SYSTEM_PROMPT,
    "王大丫丫的回答是--->0123456789 + =",
    "The quick brown fox jumps over the lazy dog.",
    "Translate to French: good morning. Bonjour! What is the capital of France? Paris is.",
    "user assistant system tool Hello, how can I help you today? Tell me a joke about cats.",
]


def pytest_configure(config) -> None:
    """The session's first act, where it will launch: DeepSpeed's CPU ops start building in the background
    (tests/e2e/deepspeed_ops.py), while the workers run the files that launch nothing of DeepSpeed's; the e2e
    fixture waits for the build. Once, in pytest-xdist's controller (or the one process of ``-n 0``)."""
    if hasattr(config, "workerinput") or not _launches_selected(config):
        return
    from tests.e2e.deepspeed_ops import start_in_background
    from tests.e2e.launching import launch_env

    log = Path(tempfile.gettempdir(), f"hf_lora_ds_deepspeed_ops_{os.getpid()}.log")
    start_in_background(launch_env(), log)


def _launches_selected(config) -> bool:
    """Whether the selected tests include tests/e2e's launches: the quick tier (``-m "not slow"``) starts none."""
    if "not slow" in (config.option.markexpr or ""):
        return False
    e2e = E2E.resolve()
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path == e2e or e2e in path.parents or path in e2e.parents:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    """Files that start processes run first (see below); ``@pytest.mark.gpu`` tests run where CUDA is present and are
    skipped, saying so, everywhere else (CI)."""
    _files_that_start_processes_first(items)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_collection_finish(session) -> None:
    """What collection imported (torch, transformers, PEFT, DeepSpeed, every test module) frozen out of the cyclic
    collector's reach, as a command's process freezes its imports (hf_lora_ds.command_process): a worker's heap holds
    millions of such objects, and each full collection walked them all (a sixth of the quick tier's CPU time). The
    collection first: garbage is freed, not frozen."""
    gc.collect()
    gc.freeze()


def _files_that_start_processes_first(items) -> None:
    """The workers take whole files in this order (``--dist loadfile --no-loadscope-reorder``): the files with a test
    that starts a process (``slow``, up to minutes a file) first, tests/e2e's launches after the others of them (their
    DeepSpeed ops are building meanwhile: ``pytest_configure``), the in-process files last, so that both workers run
    out of work within seconds of each other instead of one finishing a long launch alone. xdist's own order (most
    tests first) left the e2e files, few tests each, for the end."""
    starting = {item.path for item in items if item.get_closest_marker("slow")}
    e2e = E2E.resolve()
    # stable: each file's tests keep their order
    items.sort(key=lambda item: (item.path not in starting, e2e in item.path.resolve().parents))


def _tokenizer(template: str):
    return train_chat_tokenizer(_CORPUS * 20, vocab_size=320, chat_template=template)


@pytest.fixture(scope="session")
def chatml_tokenizer():
    """ChatML template without a default system prompt."""
    return _tokenizer(CHATML_TEMPLATE)


@pytest.fixture(scope="session")
def qwen_style_tokenizer():
    """ChatML template that injects a default system turn (as Qwen2.5's does)."""
    return _tokenizer(CHATML_DEFAULT_SYSTEM_TEMPLATE)


@pytest.fixture(scope="session")
def tools_tokenizer():
    """Qwen2.5-like template that renders ``tools`` and assistant ``tool_calls``."""
    return _tokenizer(QWEN_TOOLS_TEMPLATE)


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """Qwen3's own chat template (thinking, reasoning dropped from history, tools), with its added tokens."""
    tokenizer = _tokenizer(QWEN3_TEMPLATE)
    tokenizer.add_tokens(QWEN3_ADDED_TOKENS)
    return tokenizer


@pytest.fixture
def own_formats(monkeypatch):
    """The record-format registry (hf_lora_ds.data.formats.registry) as it is now, given back after the test: the
    formats a test registers go with it."""
    from hf_lora_ds.data.formats import registry

    monkeypatch.setattr(registry, "_FORMATS", dict(registry._FORMATS))
    monkeypatch.setattr(registry, "_IDENTIFIERS", list(registry._IDENTIFIERS))


@pytest.fixture
def tiny_model(qwen_style_tokenizer):
    """A 2-layer, hidden-32 Qwen2 model matching ``qwen_style_tokenizer``."""
    return build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, qwen_style_tokenizer):
    """A saved tiny model + tokenizer directory, as a user's ``--model_name_or_path`` would be."""
    return _save_with_tokenizer(
        build_tiny_qwen2(qwen_style_tokenizer), qwen_style_tokenizer, tmp_path_factory.mktemp("tiny-model")
    )


def make_varied_model(tokenizer, std: float = 0.5, eos_scale: float = 1.5, seed: int = 0):
    """A tiny model whose greedy outputs differ from prompt to prompt. A freshly initialised one (std 0.02) repeats
    one token for every prompt, so predictions swapped between prompts or gathered in the wrong rank order would
    still compare equal; a larger end-of-turn embedding makes about half the completions stop early, so stopping
    and padding after the stop are exercised too."""
    model = build_tiny_qwen2(tokenizer, hidden_size=32, num_hidden_layers=2)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
        model.get_input_embeddings().weight[tokenizer.eos_token_id] *= eos_scale
    return model.eval()


@pytest.fixture
def varied_model(qwen_style_tokenizer):
    return make_varied_model(qwen_style_tokenizer)


@pytest.fixture(scope="session")
def varied_model_dir(tmp_path_factory, qwen_style_tokenizer):
    """``make_varied_model`` saved with its tokenizer, as a ``--model`` directory."""
    model = make_varied_model(qwen_style_tokenizer)
    return _save_with_tokenizer(model, qwen_style_tokenizer, tmp_path_factory.mktemp("varied-model"))


def _save_with_tokenizer(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def small_disk(request, tmp_path):
    """A tmpfs of ``size`` (``@pytest.mark.parametrize("small_disk", ["1600k"], indirect=True)``; default 32m)
    mounted for the test, for saves that meet a full or read-only file system; skipped where it cannot be mounted."""
    size = getattr(request, "param", "32m")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    yield mount_point
    # lazy: a failed save's file stays open until its traceback is collected
    unmounted = subprocess.run(["umount", "--lazy", str(mount_point)], capture_output=True, text=True)
    assert unmounted.returncode == 0, unmounted.stderr


_LAUNCHERS = ("torchrun", "deepspeed", "accelerate")


def _starts_python(command) -> bool:
    """Whether a command (Popen's ``args``) starts a Python interpreter or a launcher that starts one."""
    program = os.fsdecode(command if isinstance(command, (str, bytes, os.PathLike)) else command[0]).strip()
    name = os.path.basename(program.split()[0]) if program else ""
    return name.startswith("python") or name in _LAUNCHERS


@pytest.fixture(autouse=True)
def quick_tests_start_no_interpreter(request, monkeypatch):
    """A test not marked ``slow`` runs in this process (setup.cfg's marker says what ``slow`` means): one that starts
    a Python interpreter or a launcher fails, naming the command, so the quick tier stays quick."""
    if request.node.get_closest_marker("slow"):
        return

    def refused(command) -> None:
        pytest.fail(f"{request.node.nodeid} is not marked slow but starts a process: {command!r}", pytrace=False)

    start = subprocess.Popen._execute_child

    def execute_child(popen, command, *args, **kwargs):
        if _starts_python(command):
            refused(command)
        return start(popen, command, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", execute_child)
    # multiprocessing's spawn and forkserver start methods start an interpreter without Popen; fork starts none
    monkeypatch.setattr(multiprocessing.util, "spawnv_passfds", lambda path, args, passfds: refused(args))


LAUNCH_VARIABLES = ("WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "RANK", "LOCAL_RANK")
LOCAL_SIZE_VARIABLES = ("LOCAL_SIZE", "LOCAL_WORLD_SIZE")


@pytest.fixture
def no_launcher(monkeypatch):
    """No launcher variables, and whatever the code under test sets is removed afterwards."""
    for name in (*LAUNCH_VARIABLES, *LOCAL_SIZE_VARIABLES, "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # records the original value (or its absence) for undo
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.fixture(autouse=True)
def environment_restored():
    """Every test leaves the environment variables, and the process group, as it found them. Building run arguments
    with DeepSpeed in this process sets a one-process launcher environment (RANK, MASTER_PORT, ...;
    hf_lora_ds.launch.world) and starts a one-process gloo group: a later test's subprocess would inherit a
    MASTER_PORT this process may still listen on (EADDRINUSE), and a later in-process run would see "backend gloo"
    where it runs alone (which tests fail then depended on the order of the test files). TrainingArguments and
    Accelerate's plugins set variables of their own (FSDP_*, ACCELERATE_*) that a later run would read as asked."""
    from accelerate.state import AcceleratorState

    saved = dict(os.environ)
    had_group = torch.distributed.is_initialized()
    yield
    for name in set(os.environ) - set(saved):
        del os.environ[name]
    os.environ.update(saved)
    if torch.distributed.is_initialized() and not had_group:
        destroy_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)  # accelerate's singletons hold the group's backend


def destroy_process_group() -> None:
    """Through DeepSpeed where it is imported: it also drops the groups it keeps (its data-parallel group), which a
    later in-process ZeRO-3 run would otherwise use ("Group ... is not registered")."""
    deepspeed_comm = sys.modules.get("deepspeed.comm")
    if deepspeed_comm is not None and deepspeed_comm.is_initialized():
        deepspeed_comm.destroy_process_group()
    else:
        torch.distributed.destroy_process_group()


@pytest.fixture(autouse=True)
def package_logger_as_a_library_user_has_it():
    """Every test starts and ends with the ``hf_lora_ds`` logger as importing the package leaves it (no handler, no
    level): a command's ``main`` run in this process (by an earlier test, or a module's fixture) gives it the
    command's handler and level (hf_lora_ds.cli.log), which a test of the library must not inherit."""

    def unconfigured() -> None:
        logger = logging.getLogger("hf_lora_ds")
        logger.handlers[:], logger.level, logger.propagate = [], logging.NOTSET, True

    unconfigured()
    yield
    unconfigured()


@pytest.fixture
def varlen_attention_cleared():
    """``varlen_attn``, taken out of transformers' registry after the test (a run loading its model registers it:
    hf_lora_ds.model.varlen_attention), so no later test sees the name."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hf_lora_ds.config.batching import VARLEN_ATTENTION

    yield VARLEN_ATTENTION
    ALL_ATTENTION_FUNCTIONS._local_mapping.pop(VARLEN_ATTENTION, None)


@pytest.fixture
def accelerator_seen(monkeypatch):
    """Call it with a device to make torch report it as this process's usable accelerator (None: no accelerator)."""

    def see(device: torch.device | None) -> None:
        monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *args, **kwargs: device)
        monkeypatch.setattr(torch.accelerator, "is_available", lambda: device is not None)

    return see


@pytest.fixture
def varlen_attention(varlen_attention_cleared):
    """``varlen_attn`` registered as a run loading a text model registers it."""
    from transformers import PretrainedConfig

    from hf_lora_ds.model.varlen_attention import register_varlen_attention

    register_varlen_attention(PretrainedConfig())
    return varlen_attention_cleared


@pytest.fixture
def package_log(caplog):
    """What the package logs (info and up) as a library user who asks for it sees it; ``read()`` returns the messages
    since the last read, a line each (a message may hold several)."""
    caplog.set_level(logging.INFO, logger="hf_lora_ds")

    class Messages:
        def read(self) -> str:
            text = "".join(f"{message}\n" for message in caplog.messages)
            caplog.clear()
            return text

    return Messages()


@pytest.fixture(scope="module")
def trained_adapter(tmp_path_factory, tiny_model_dir):
    """An adapter whose lora_B is non-zero, as after training (a fresh one is a no-op and would hide a bad merge)."""
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=4, target_modules="all-linear")
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
    path = tmp_path_factory.mktemp("adapter")
    model.save_pretrained(path)
    return path
