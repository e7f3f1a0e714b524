"""The LM head and the cross-entropy fused chunk by chunk over the supervised rows, so that no ``(n, vocab)`` tensor
ever exists: with a ~152k vocabulary the logits (and their gradient) otherwise dominate a LoRA run's memory.

Each chunk's logits are made once: when the loss will be differentiated, forward turns them into the gradients of
the hidden rows (and of the head weight when it trains) right away, and backward only scales those by the incoming
gradient — two head matmuls a chunk instead of three (forward, recomputed logits, their gradient). Chunks are sized
from a memory budget (``chunk_rows``) and the arithmetic is the full path's, so loss and gradients match it to
rounding. Pure torch: it runs wherever the head's matmul runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["CHUNK_BYTES", "FusedHeadLoss", "chunk_rows", "fused_head_loss"]

# Working memory of one chunk (its logits in the compute dtype, their fp32 log-probabilities, the gradient cast back):
# 256 MiB: 110 rows of a 151,936-row vocabulary in fp32, 128 in bf16.
CHUNK_BYTES = 2**28
ROW_TILE = 128


def chunk_rows(vocab_size: int, itemsize: int, budget: int = CHUNK_BYTES) -> int:
    """Rows per chunk so that a chunk's working memory stays within ``budget`` bytes: per logit the head output and
    its gradient in the compute dtype (``2 * itemsize``) and two fp32 buffers (upcast, log-probabilities; 8 bytes).
    From 128 rows on, a multiple of 128: a GPU's matmul tiles rows by 64 or 128, and 147 rows would run as 256."""
    rows = budget // (vocab_size * (2 * itemsize + 8))
    return rows - rows % ROW_TILE if rows >= ROW_TILE else max(1, rows)


def _loss_and_gradients(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int, grad_hidden: bool, grad_weight: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The summed fp32 cross-entropy and the gradients of that sum asked for (the head weight's in fp32), one chunk
    of ``rows`` at a time."""
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    hidden_gradient = torch.empty_like(hidden) if grad_hidden else None
    weight_gradient = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if grad_weight else None
    for start in range(0, hidden.shape[0], rows):
        chunk = slice(start, start + rows)
        log_probabilities = torch.log_softmax(F.linear(hidden[chunk], weight), dim=-1, dtype=torch.float32)
        chunk_targets = targets[chunk, None]
        total -= log_probabilities.gather(1, chunk_targets).sum()
        if not (grad_hidden or grad_weight):
            continue
        probabilities = log_probabilities.exp_()  # softmax - one-hot: the logits' gradient
        probabilities.scatter_add_(1, chunk_targets, probabilities.new_full(chunk_targets.shape, -1.0))
        grad_logits = probabilities.to(hidden.dtype)
        if hidden_gradient is not None:  # a matmul autocast sees (forward keeps the caller's autocast)
            hidden_gradient[chunk] = grad_logits @ weight
        if weight_gradient is not None:
            weight_gradient.addmm_(grad_logits.t().float(), hidden[chunk].float())
    return total, hidden_gradient, weight_gradient


class FusedHeadLoss(torch.autograd.Function):
    """Summed fp32 cross-entropy of ``hidden @ weight.T`` against ``targets``, chunk by chunk (see the module)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        total, grad_hidden, grad_weight = _loss_and_gradients(hidden, weight, targets, rows, *ctx.needs_input_grad[:2])
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:  # scaled in fp32, so that the scale (1 / tokens, a loss scale) is not rounded
            grad_hidden = grad_hidden.to(torch.float32, copy=True).mul_(grad_total).to(grad_hidden.dtype)
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_total).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None


def fused_head_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, budget: int | None = None
) -> torch.Tensor:
    """The summed fp32 cross-entropy of the head over ``hidden`` rows, one chunk of at most ``budget`` bytes of
    logits work at a time (``CHUNK_BYTES`` when None, read at call time). Without gradient mode (evaluation) only the
    loss is computed."""
    rows = chunk_rows(weight.shape[0], hidden.element_size(), budget or CHUNK_BYTES)
    targets = targets.to(hidden.device)
    if not torch.is_grad_enabled():
        return _loss_and_gradients(hidden, weight, targets, rows, grad_hidden=False, grad_weight=False)[0]
    return FusedHeadLoss.apply(hidden, weight, targets, rows)
