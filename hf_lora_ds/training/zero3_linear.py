"""ZeRO-3's linear keeping a layer's input only where the layer's weight trains, and ``F.linear`` as it was after a run.

DeepSpeed's ZeRO-3 replaces ``torch.nn.functional.linear`` for the whole process when it partitions a model
(``zero_optimization.memory_efficient_linear``, on by default) with ``LinearFunctionForZeroStage3``: it keeps the
weight as the partitioned parameter (gathered again in backward) rather than a view that would hold the gathered
weight, and keeps the input for the weight's gradient whether the weight has one or not. Under LoRA almost every
linear layer is frozen, so that input is kept for nothing: both norms' outputs and the MLP's product, 16% more a
layer than torch's ``F.linear`` keeps (bench/README.md). A ZeRO-3 training step of this package runs the same
function keeping the input only for a weight that trains, as torch's does. DeepSpeed's replacement would outlive
the run: the trainer puts back the ``F.linear`` it found (``functional_linear_kept``).
"""

from __future__ import annotations

import contextlib
from functools import cache
from typing import Any

import torch

from hf_lora_ds._compat import attribute_kept, attribute_replaced

__all__ = ["functional_linear_kept", "lora_zero3_linear", "zero3_linear_for_lora"]


@cache
def _zero3_linear_function() -> type[torch.autograd.Function]:
    """DeepSpeed's function (its forward, and its backward that gathers a partitioned weight), saving ``None`` for
    the input where the weight needs no gradient: its backward reads the input for the weight's gradient only.
    Made on first use: DeepSpeed is imported by the runs that use it only."""
    from deepspeed.runtime.zero.linear import LinearFunctionForZeroStage3

    class Zero3LinearForLora(LinearFunctionForZeroStage3):
        @staticmethod
        def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
            input, weight, *bias = inputs
            kept = input if ctx.needs_input_grad[1] else None
            LinearFunctionForZeroStage3.setup_context(ctx, (kept, weight, *bias), output)

    return Zero3LinearForLora


def lora_zero3_linear(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` as a ZeRO-3 training step of this package runs it."""
    return _zero3_linear_function().apply(input, weight, bias)


def zero3_linear_for_lora(zero3_linear: bool) -> contextlib.AbstractContextManager:
    """Inside, where ZeRO-3 runs its own linear (``ZeroSettings.zero3_linear``): ``F.linear`` is
    ``lora_zero3_linear``; after: what it was."""
    if not zero3_linear:
        return contextlib.nullcontext()
    return attribute_replaced(torch.nn.functional, "linear", lora_zero3_linear)


def functional_linear_kept() -> contextlib.AbstractContextManager:
    """After the block (or each call of a function it decorates), ``F.linear`` is what it was on entering it,
    whatever DeepSpeed made it."""
    return attribute_kept(torch.nn.functional, "linear")
