"""The SFT loss from the LM head applied only where a label is trained.

In chat SFT most positions are masked with -100 (system prompt, user turns, padding), yet a causal LM computes
logits for every position and the loss upcasts all of them to fp32: with a ~152k vocabulary that is often the largest
allocation of a LoRA run. The loss only reads the positions whose *shifted* label is not -100, so computing the head
there alone gives the same loss and the same gradients at a fraction of the head's FLOPs and memory.

The positions reach the head through the model's own forward (``logits_to_keep`` as a boolean ``(batch, seq)``
mask, which transformers' ``slice_logits_to_keep`` turns into ``(num_kept, hidden)``), so DDP and every ZeRO stage
see the ordinary forward: under ZeRO-3 the partitioned head weight is gathered by DeepSpeed's hooks as usual.

The shift, the -100 handling and the normalisation are transformers' ``ForCausalLMLoss``: each position predicts the
next label (the last position predicts nothing), and the summed loss is divided by ``num_items_in_batch`` (the
supervised tokens of the whole accumulated batch) when Trainer passes it, or averaged over this batch otherwise.

>>> import torch
>>> shifted_labels({"labels": torch.tensor([[-100, 5, 6], [-100, -100, 7]])}).tolist()
[[5, 6, -100], [-100, 7, -100]]
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from hf_lora_ds.data import IGNORE_INDEX

__all__ = ["CHUNK_ELEMENTS", "accepts_position_mask", "shifted_labels", "supervised_cross_entropy"]

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
    does, or the collator's own ``shift_labels`` when it provides them."""
    if inputs.get("shift_labels") is not None:
        return inputs["shift_labels"]
    return F.pad(inputs["labels"], (0, 1), value=IGNORE_INDEX)[..., 1:]


def supervised_cross_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> torch.Tensor:
    """fp32 cross-entropy of ``logits`` ``(n, vocab)`` against ``targets`` ``(n,)``, normalised as transformers'
    ``fixed_cross_entropy``: the sum over ``num_items_in_batch`` when given, else the mean over the ``n`` rows.

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
    if num_items_in_batch is None:
        return total / targets.numel()
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def _summed_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), targets.to(logits.device), reduction="sum")
