"""The doctor's ``kernels`` finding: what a default run would use on this machine, in the ``kernels:`` line's words
(hf_lora_ds.callbacks.kernels_line), and which of the faster options work here."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from hf_lora_ds.callbacks.kernels_line import kernels_line
from hf_lora_ds.cli.doctor import installed
from hf_lora_ds.config.batching import resolve_batching
from hf_lora_ds.training.loss_head import FUSED_HEAD

__all__ = ["default_kernels", "faster_options"]


def default_kernels() -> Iterator[tuple[str, str]]:
    """A default run's kernels here: transformers' sdpa, ``--batching auto`` for it, LoRA updates by addmm, the fused
    head, Trainer's ``adamw_torch_fused`` where torch has the fused kernel for the device, no compile."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    fused = device in _get_fused_kernels_supported_devices()
    record = {
        "attention": "sdpa",
        "batching": resolve_batching("auto", "sdpa").replace("_", "-"),
        "lora_update": "addmm",
        "loss": FUSED_HEAD,
        "liger": [],
        "optimizer": "AdamW fused" if fused else "AdamW foreach",
        "compile": "off",
    }
    yield "ok", f"a default run: {kernels_line(record).removeprefix('kernels: ')}"
    yield "info", f"faster options here: {faster_options()}"


def faster_options() -> str:
    """flash_attn, liger_kernel and torch's varlen attention (in every supported torch; it needs sm80): each with
    whether it works on this machine."""
    sm80 = torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] >= 8
    options = {
        "--attn_implementation flash_attention_2": installed("flash_attn") and sm80,
        "--use_liger_kernel": installed("liger_kernel") and torch.cuda.is_available(),
        "--attn_implementation varlen_attn": sm80,
        "--torch_compile": True,
    }
    return ", ".join(f"{flag} {'yes' if ok else 'no'}" for flag, ok in options.items())
