"""The routed experts' kernel (transformers' ``experts_implementation``), chosen for the run's device and dtype.

transformers 5 runs a MoE layer's experts with ``grouped_mm`` (torch's grouped GEMM over the routed tokens sorted by
expert: CUTLASS for bf16 on Hopper and Blackwell, a C++ loop of GEMMs for the other dtypes and devices, CPU included
from torch 2.9), ``batched_mm`` (every route's expert weights gathered into one batched GEMM: memory grows with tokens
x top-k x an expert's size, so only small models) or ``eager`` (a Python loop over the experts hit). It defaults to
grouped_mm, and decides between torch's kernel and its own per-expert loop (``_can_use_grouped_mm``) without asking
whether the kernel takes the dtype. ``auto`` runs that kernel once, forward and backward, on a tiny stack of the run's
device and dtype (what a LoRA-adapted expert stack needs), and takes eager where it does not run; a forced choice
that cannot run is one line before the model loads. With LoRA on the experts (PEFT's ParamWrapper) the kernel gets
the stack W + BA and runs as it would without LoRA: no per-expert Python loop appears.
"""

from __future__ import annotations

from functools import cache

import torch

from hf_lora_ds.errors import UserError
from hf_lora_ds.model.experts import moe_blocks

__all__ = ["EXPERTS_IMPLEMENTATIONS", "choose_experts_implementation", "experts_kernel_text", "use_experts_kernel"]

EXPERTS_IMPLEMENTATIONS = ("auto", "grouped_mm", "batched_mm", "eager")


def choose_experts_implementation(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """The kernel for ``--experts_implementation`` ``requested`` on ``device`` in ``dtype``; a one-line ``UserError``
    for grouped_mm where torch's grouped GEMM does not run."""
    if requested not in EXPERTS_IMPLEMENTATIONS:
        raise UserError(
            f"--experts_implementation {requested}: unknown; use one of {', '.join(EXPERTS_IMPLEMENTATIONS)}"
        )
    failure = grouped_mm_failure(device.type, dtype)
    if requested == "grouped_mm" and failure:
        raise UserError(
            f"--experts_implementation grouped_mm: {failure}; use auto (eager here), or batched_mm for a small model"
        )
    if requested == "auto":
        return "eager" if failure else "grouped_mm"
    return requested


def use_experts_kernel(model: torch.nn.Module, implementation: str) -> None:
    """Set the experts' kernel of a MoE model; a dense model is left as it is (transformers refuses grouped_mm
    there)."""
    if moe_blocks(model):
        model.set_experts_implementation(implementation)


def experts_kernel_text(model: torch.nn.Module) -> str:
    """The kernel ``model``'s experts run with, and why where it is not torch's grouped GEMM."""
    config = getattr(model, "config", None)
    kernel = getattr(config, "_experts_implementation", None) or "grouped_mm"
    param = next(model.parameters())
    failure = grouped_mm_failure(param.device.type, param.dtype)
    if kernel == "grouped_mm" or not failure:
        return f"kernel {kernel}"
    return f"kernel {kernel} ({failure})"


@cache
def grouped_mm_failure(device_type: str, dtype: torch.dtype) -> str | None:
    """Why torch's grouped GEMM, as transformers calls it for an expert stack, cannot train on ``device_type`` in
    ``dtype``; None when it runs there, forward and backward."""
    where = f"torch's grouped GEMM does not run on {device_type} in {str(dtype).removeprefix('torch.')}"
    if device_type == "meta":
        return None  # shapes only: the planner stands in for every kernel
    from transformers.integrations.moe import _can_use_grouped_mm

    device = torch.device(device_type)
    # Not random: a draw here, between the run's seed and the adapter's init, would change the run's trajectory.
    tokens = torch.ones(8, 16, device=device, dtype=dtype, requires_grad=True)
    stack = torch.ones(4, 32, 16, device=device, dtype=dtype, requires_grad=True)  # (experts, out, in)
    offsets = torch.tensor([2, 4, 6, 8], device=device, dtype=torch.int32)
    if not _can_use_grouped_mm(tokens, stack.transpose(-2, -1), offsets):
        return f"{where} (transformers would loop over the experts in Python)"
    try:
        out = torch.nn.functional.grouped_mm(tokens, stack.transpose(-2, -1), offs=offsets)
        out.backward(torch.ones_like(out))
    except (RuntimeError, NotImplementedError) as error:
        return f"{where} ({str(error).splitlines()[0]})"
    return None
