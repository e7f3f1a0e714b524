"""``--use_liger_kernel`` (the ``liger`` extra): refused in one line before training where Liger cannot work, and
whatever Liger replaces outside the run's model put back when the run ends.

Trainer applies Liger to the model instance at the start of ``train()`` (transformers.integrations.liger). Liger's
instance patching also rebinds names in transformers' modeling modules (``modeling_qwen2.apply_rotary_pos_emb``,
``Qwen2RMSNorm``, ``Qwen2MLP``), some classes' ``forward`` (``Llama4ForCausalLM``), and torch's own
``nn.functional.cross_entropy`` and ``nn.LayerNorm`` for some families: every later model of the process would be
built from Liger's code. ``liger_patches_restored`` keeps those names for the run only.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import TrainingArguments

from hf_lora_ds.errors import UserError

__all__ = ["check_liger", "liger_ops", "liger_patches_restored"]

# The patches each apply function takes, with Liger's defaults (liger_kernel.transformers.monkey_patch).
_LIGER_DEFAULTS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False}


def check_liger(args: TrainingArguments, model: torch.nn.Module) -> None:
    """Refuse ``--use_liger_kernel`` where it cannot work: liger-kernel not installed, no CUDA device (its kernels
    are Triton), or a model family Liger does not patch (Trainer would log that and train without it)."""
    if not args.use_liger_kernel:
        return
    if importlib.util.find_spec("liger_kernel") is None:
        raise UserError(
            "--use_liger_kernel: liger-kernel is not installed; pip install 'hf_lora_ds[liger]' (needs a CUDA device)"
        )
    if args.use_cpu or not torch.cuda.is_available():
        raise UserError("--use_liger_kernel needs a CUDA device (Liger's kernels are Triton); this run is on the CPU")
    families = importlib.import_module("liger_kernel.transformers.monkey_patch").MODEL_TYPE_TO_APPLY_LIGER_FN
    model_type = _base(model).config.model_type
    if model_type not in families:
        raise UserError(
            f"--use_liger_kernel: Liger has no kernels for {model_type} models; it patches "
            f"{', '.join(sorted(families))}"
        )


def liger_ops(args: TrainingArguments) -> list[str]:
    """The kernels ``--use_liger_kernel`` puts in, by Liger's names, with ``--liger_kernel_config`` applied."""
    config = {**_LIGER_DEFAULTS, "fused_linear_cross_entropy": True, **(args.liger_kernel_config or {})}
    return [name for name, on in config.items() if on] if args.use_liger_kernel else []


@contextmanager
def liger_patches_restored() -> Iterator[None]:
    """Within the block, the names of transformers' modeling modules (and their classes) and of ``torch.nn`` and
    ``torch.nn.functional`` may be rebound; after it each is bound as before. A module first imported inside the
    block has no before, and keeps what it got (Liger patches the modules of the model already loaded)."""
    saved = {id(owner): (owner, dict(vars(owner))) for owner in _patchable()}
    try:
        yield
    finally:
        for owner, names in saved.values():
            _restore(owner, names)


def _patchable() -> Iterator[Any]:
    yield torch.nn
    yield torch.nn.functional
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and module is not None:
            yield module
            yield from (
                value for value in vars(module).values() if isinstance(value, type) and value.__module__ == name
            )


def _restore(owner: Any, names: dict[str, Any]) -> None:
    current = vars(owner)
    for name, value in names.items():
        if current.get(name, value) is not value or name not in current:
            setattr(owner, name, value)
    if isinstance(owner, type):  # a method a class inherited, now defined on it (Liger's forward)
        for name in [name for name in current if name not in names]:
            delattr(owner, name)


def _base(model: torch.nn.Module) -> torch.nn.Module:
    return model.get_base_model() if hasattr(model, "get_base_model") else model
