"""The SFT loss from the LM head applied only where a label is trained.

In chat SFT most positions are masked with -100, yet a causal LM computes logits for every position and the loss
upcasts them all to fp32: with a ~152k vocabulary often a LoRA run's largest allocation. The head itself picks the
supervised rows of its input inside the model's own forward, so DDP and every ZeRO stage see an ordinary forward; a
plain bias-free head is swapped for the fused head-and-loss (hf_lora_ds.training.fused_head_loss), so no
``(n, vocab)`` tensor exists. Shift, -100 handling and normalisation are transformers' ``ForCausalLMLoss``.

The rows are flat indices (``SUPERVISED_POSITIONS``), found by the trainer's collator on the host before the batch
moves to the device: selecting rows by index needs no device-to-host read, where a boolean mask's ``nonzero`` makes
the host wait for the GPU every step. A batch without them (a user's own batches) has them found on the device.
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
from transformers.modeling_outputs import CausalLMOutputWithPast

from hf_lora_ds.data.batches.collator import SUPERVISED_POSITIONS, shifted_labels, supervised_positions
from hf_lora_ds.training.fused_head_loss import fused_head_loss

__all__ = [
    "CHUNK_ELEMENTS",
    "SUPERVISED_POSITIONS",
    "accepts_position_mask",
    "fused_head",
    "fused_loss_outputs",
    "head_computes_loss",
    "normalised_loss",
    "shifted_labels",
    "head_selects_rows",
    "supervised_cross_entropy",
    "supervised_positions",
    "supervised_rows",
    "supervised_targets",
]

# fp32 logits per cross-entropy chunk (128 MiB): above this, each chunk's upcast and log-softmax are recomputed in
# backward instead of being kept, so the loss never holds more than one chunk's fp32 copy of the logits.
CHUNK_ELEMENTS = 2**25


def accepts_position_mask(model: torch.nn.Module) -> bool:
    """Whether ``model``'s forward applies its LM head only where a boolean ``logits_to_keep`` mask is True, and so
    hands on logits of the kept rows flattened to ``(num_kept, vocab)``, as the head's row selection makes them.

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


def supervised_targets(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rows, targets)``: the flat indices of the trained positions, the collator's ``SUPERVISED_POSITIONS`` or,
    for batches of a user's own making, found on the device (which the host then waits for), and their labels."""
    targets = shifted_labels(inputs).flatten()
    rows = inputs.get(SUPERVISED_POSITIONS)
    if rows is None:
        rows = supervised_positions(targets)
    return rows, targets.index_select(0, rows)


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


def supervised_rows(positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The rows at flat indices ``rows`` of a ``(batch, seq, ...)`` tensor (an index gather: no device-to-host read);
    one already flattened to its rows is returned as it is."""
    return positions.flatten(0, 1).index_select(0, rows) if positions.dim() == 3 else positions


@contextmanager
def head_selects_rows(head: torch.nn.Module, rows: torch.Tensor) -> Iterator[None]:
    """Within the block, ``head`` (wrapped by PEFT or not) gets only the ``rows`` of the ``(batch, seq, hidden)``
    states the model hands it, so its logits are ``(n, vocab)``: for models that pass such logits on
    (``accepts_position_mask``)."""
    handle = head.register_forward_pre_hook(lambda module, args: (supervised_rows(args[0], rows), *args[1:]))
    try:
        yield
    finally:
        handle.remove()


@contextmanager
def head_computes_loss(
    head: torch.nn.Linear, targets: torch.Tensor, rows: torch.Tensor
) -> Iterator[dict[str, torch.Tensor]]:
    """Within the block, ``head`` maps the ``rows`` of its ``(batch, seq, hidden)`` input to the summed fp32
    cross-entropy against ``targets`` ``(n,)`` (hf_lora_ds.training.fused_head_loss) instead of logits. The yielded
    dict gets ``"loss"``: the value the head's call returned, so the caller can check that the model returned it
    unchanged as its logits."""
    produced: dict[str, torch.Tensor] = {}

    def record(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
        produced["loss"] = output

    head.forward = lambda hidden: fused_head_loss(supervised_rows(hidden, rows), head.weight, targets)
    handle = head.register_forward_hook(record)
    try:
        yield produced
    finally:
        handle.remove()
        del head.forward


def fused_loss_outputs(
    model: torch.nn.Module,
    head: torch.nn.Linear,
    forward_inputs: dict[str, Any],
    rows: torch.Tensor,
    targets: torch.Tensor,
    check: bool,
) -> CausalLMOutputWithPast | None:
    """``model``'s forward with ``head`` computing the summed loss of ``rows`` (``head_computes_loss``), as outputs
    holding that loss; with ``check``, None when the model returned something else than the head's value (it changed
    the head's output: the loss must come from logits). Compared by value, not identity: DeepSpeed's ZeRO-3 hooks on
    the enclosing modules re-wrap the tensor on its way out. The comparison reads the device."""
    with head_computes_loss(head, targets, rows) as produced:
        outputs = model(**forward_inputs)
    loss = produced.get("loss")
    if check and not (loss is not None and outputs.logits.shape == loss.shape and torch.equal(outputs.logits, loss)):
        return None
    return CausalLMOutputWithPast(loss=outputs.logits)
