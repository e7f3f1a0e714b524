"""The SFT loss from the LM head applied only where a label is trained.

In chat SFT most positions are masked with -100, yet a causal LM computes logits for every position and the loss
upcasts them all to fp32: with a ~152k vocabulary often a LoRA run's largest allocation. The positions reach the head
through the model's own forward (``logits_to_keep`` as a boolean mask), so DDP and every ZeRO stage see an ordinary
forward; a plain bias-free head is swapped for the fused head-and-loss (hf_lora_ds.training.fused_head_loss), so no
``(n, vocab)`` tensor exists. Shift, -100 handling and normalisation are transformers' ``ForCausalLMLoss``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hf_lora_ds.data.dataset import IGNORE_INDEX
from hf_lora_ds.training.fused_head_loss import fused_head_loss

__all__ = [
    "CHUNK_ELEMENTS",
    "accepts_position_mask",
    "fused_head",
    "head_computes_loss",
    "normalised_loss",
    "shifted_labels",
    "supervised_cross_entropy",
    "supervised_rows",
]

# fp32 logits per cross-entropy chunk (128 MiB): above this, each chunk's upcast and log-softmax are recomputed in
# backward instead of being kept, so the loss never holds more than one chunk's fp32 copy of the logits.
CHUNK_ELEMENTS = 2**25


def accepts_position_mask(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward applies its LM head only where a boolean ``logits_to_keep`` mask is True.

    Causal LMs built on transformers' ``slice_logits_to_keep`` (Llama, Qwen2/3, Gemma, Mistral and most others)
    flatten the kept positions to ``(num_kept, hidden)``; a model that indexes the sequence dimension itself would
    misread a 2-D mask, and one without the argument cannot take it at all.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if "logits_to_keep" not in inspect.signature(base.forward).parameters:
        return False
    slicer = getattr(sys.modules.get(type(base).__module__), "slice_logits_to_keep", None)
    if slicer is None:
        return False
    probe = slicer(torch.zeros(1, 2, 1), torch.tensor([[False, True]]))
    return tuple(probe.shape) == (1, 1)


def shifted_labels(inputs: dict[str, Any]) -> torch.Tensor:
    """The label each position predicts: ``labels`` shifted left by one with -100 at the end, as ``ForCausalLMLoss``
    does, or the collator's own ``shift_labels`` when it provides them.

    >>> import torch
    >>> shifted_labels({"labels": torch.tensor([[-100, 5, 6], [-100, -100, 7]])}).tolist()
    [[5, 6, -100], [-100, 7, -100]]
    """
    if inputs.get("shift_labels") is not None:
        return inputs["shift_labels"]
    return F.pad(inputs["labels"], (0, 1), value=IGNORE_INDEX)[..., 1:]


def supervised_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS
) -> torch.Tensor:
    """Summed fp32 cross-entropy of ``logits`` ``(n, vocab)`` against ``targets`` ``(n,)`` (the logits path, for
    heads the fused loss cannot stand in for).

    Rows are processed in chunks of about ``chunk_elements`` logits; with several chunks and autograd on, each chunk
    is checkpointed, so backward recomputes its fp32 log-softmax rather than keeping all of them alive at once.
    """
    rows_per_chunk = max(1, chunk_elements // max(1, logits.shape[-1]))
    chunked = logits.shape[0] > rows_per_chunk and torch.is_grad_enabled() and logits.requires_grad
    total = logits.new_zeros((), dtype=torch.float32)
    for start in range(0, max(1, logits.shape[0]), rows_per_chunk):
        rows = slice(start, start + rows_per_chunk)
        if chunked:
            total = total + checkpoint(_summed_cross_entropy, logits[rows], targets[rows], use_reentrant=False)
        else:
            total = total + _summed_cross_entropy(logits[rows], targets[rows])
    return total


def normalised_loss(total: torch.Tensor, rows: int, num_items_in_batch: torch.Tensor | int | None) -> torch.Tensor:
    """The summed loss normalised as transformers' ``fixed_cross_entropy``: over ``num_items_in_batch`` (the
    supervised tokens of the whole accumulated batch) when Trainer passes it, else the mean over this batch's rows."""
    if num_items_in_batch is None:
        return total / rows
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets.to(logits.device), reduction="sum")


def fused_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The model's LM head when the fused head-and-loss can stand in for it: a plain ``nn.Linear`` without bias.

    A head wrapped by PEFT (``lm_head`` among LoRA targets or modules_to_save) or quantized computes more than
    ``hidden @ weight.T``; those keep the logits path."""
    head = model.get_output_embeddings()
    return head if type(head) is torch.nn.Linear and head.bias is None else None


def supervised_rows(positions: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The ``keep`` rows of a ``(batch, seq, ...)`` tensor; one the model already sliced by the mask is returned."""
    return positions[keep] if positions.dim() == 3 else positions


@contextmanager
def head_computes_loss(
    head: torch.nn.Linear, targets: torch.Tensor, keep: torch.Tensor
) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, ``head`` maps its input rows to the summed fp32 cross-entropy against ``targets`` ``(n,)``
    (hf_lora_ds.training.fused_head_loss) instead of logits: ``(n, hidden)`` rows where the model sliced them by the
    ``keep`` mask, or ``(batch, seq, hidden)`` where it hands the head every position (a model that cannot take the
    mask: transformers releases without boolean ``logits_to_keep``), which the head then selects by ``keep`` itself.
    The yielded dict gets ``"loss"``: the value the head's call returned, so the caller can check that the model
    returned it unchanged as its logits."""
    produced: dict[str, torch.Tensor] = {}

    def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        produced["loss"] = output

    head.forward = lambda hidden: fused_head_loss(supervised_rows(hidden, keep), head.weight, targets)
    handle = head.register_forward_hook(record)
    try:
        yield produced
    finally:
        handle.remove()
        del head.forward
