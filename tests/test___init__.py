"""The package face: every public name resolves, on first use, to its module's object; importing the package loads
none of the modules behind them (so ``python -m hf_lora_ds.doctor`` starts where one of their dependencies is
missing) and changes nothing else in the importing process: hf_lora_ds.command_process does that, in a command's."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest

import hf_lora_ds
from hf_lora_ds.command_process import QUIETED_COLLECTIVE_WARNING, QUIETED_WARNING
from tests.e2e.launching import REPO


@pytest.mark.parametrize("name", hf_lora_ds.__all__)
def test_each_public_name_is_its_modules_object(name):
    assert getattr(hf_lora_ds, name) is getattr(importlib.import_module(hf_lora_ds._EXPORTS[name]), name)
    assert name in dir(hf_lora_ds)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'LoraTrainer'"):
        hf_lora_ds.LoraTrainer  # noqa: B018


# In a fresh interpreter: what the process looks like before and after importing the package, then one of its
# deepest modules (the trainer: transformers, PEFT, DeepSpeed's integration).
_IMPORT_PROBE = """
import gc, json, logging, sys, warnings
QUIETED_LOGGERS = ("DeepSpeed", "bitsandbytes.backends.cpu.ops")
def process():
    return {
        "collector_enabled": gc.isenabled(),
        "frozen": gc.get_freeze_count(),
        "warning_messages": [f[1].pattern for f in warnings.filters if f[1] is not None],
        "finders_from": sorted({(f if isinstance(f, type) else type(f)).__module__ for f in sys.meta_path}),
        "logger_filters": {n: len(logging.getLogger(n).filters) for n in QUIETED_LOGGERS},
        "package_logger": [len(our_logger.handlers), our_logger.level, our_logger.propagate],
    }
our_logger = logging.getLogger("hf_lora_ds")
before = process()
import hf_lora_ds
package = process()
heavy = sorted(m for m in ("torch", "transformers", "peft", "deepspeed") if m in sys.modules)
modules = sorted(m for m in sys.modules if m.startswith("hf_lora_ds."))
from hf_lora_ds import LoraSFTTrainer
from hf_lora_ds.trainer import lora_sft_trainer
lora_sft_trainer.logger.info("an info line")
lora_sft_trainer.logger.warning("a warning line")
print(json.dumps({"before": before, "package": package, "trainer": process(), "heavy": heavy, "modules": modules}))
"""


@pytest.mark.slow  # a fresh interpreter (the quick tier starts none: tests/conftest.py)
def test_importing_the_package_or_its_trainer_changes_nothing_in_the_process():
    done = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], cwd=REPO, capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["heavy"] == [] and seen["modules"] == ["hf_lora_ds._lazy"], seen  # the names load on first use
    assert seen["package"] == seen["before"], seen
    # the collector on, nothing frozen, no filter or import hook of the package's (the libraries add warning filters)
    trainer, before = seen["trainer"], seen["before"]
    assert trainer["collector_enabled"] and trainer["frozen"] == 0, trainer
    assert not [module for module in trainer["finders_from"] if module.startswith("hf_lora_ds")], trainer
    assert trainer["logger_filters"] == before["logger_filters"], seen
    assert trainer["package_logger"] == [0, 0, True], seen  # no handler, no level: the user's logging decides
    # what a library user who configures nothing sees: the warnings (Python's last-resort handler), no info line
    assert "an info line" not in done.stdout + done.stderr and "a warning line" in done.stderr, done
    quieted = [m for m in trainer["warning_messages"] if m in (QUIETED_WARNING, QUIETED_COLLECTIVE_WARNING)]
    assert not quieted, quieted
