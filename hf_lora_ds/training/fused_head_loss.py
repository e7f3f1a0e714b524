"""The LM head and the cross-entropy fused chunk by chunk over the supervised rows, so that no ``(n, vocab)`` tensor
ever exists: with a ~152k vocabulary the logits (and their gradient) otherwise dominate a LoRA run's memory.

Forward keeps only each row's fp32 log-sum-exp; backward recomputes each chunk's logits for the gradients (of the head
weight only when it trains). Chunks are sized from a memory budget (``chunk_rows``) and the arithmetic is the full
path's, so loss and gradients match it to rounding. Pure torch: it runs wherever the head's matmul runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["CHUNK_BYTES", "FusedHeadLoss", "chunk_rows", "fused_head_loss"]

# Working memory of one chunk (its logits in the compute dtype, their fp32 copy and softmax, the cast-back gradient):
# 256 MiB, about 220 rows of a 151,936-row vocabulary in fp32.
CHUNK_BYTES = 2**28


def chunk_rows(vocab_size: int, itemsize: int, budget: int = CHUNK_BYTES) -> int:
    """Rows per chunk so that a chunk's working memory stays within ``budget`` bytes: per logit the head output and
    its gradient in the compute dtype (``2 * itemsize``) and two fp32 buffers (upcast/softmax, 8 bytes)."""
    return max(1, budget // (vocab_size * (2 * itemsize + 8)))


class FusedHeadLoss(torch.autograd.Function):
    """Summed fp32 cross-entropy of ``hidden @ weight.T`` against ``targets``, chunk by chunk (see the module)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        log_normalisers = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], rows):
            chunk = slice(start, start + rows)
            logits = F.linear(hidden[chunk], weight).float()
            log_normalisers[chunk] = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, targets[chunk, None]).squeeze(1)
            total += (log_normalisers[chunk] - picked).sum()
        ctx.save_for_backward(hidden, targets, log_normalisers)
        # The weight is read back from the Parameter object itself: under ZeRO-3 its data is the gathered tensor
        # only while DeepSpeed's hooks hold it (forward, and again in backward), never a saved copy.
        ctx.weight, ctx.rows = weight, rows
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        hidden, targets, log_normalisers = ctx.saved_tensors
        weight, rows = ctx.weight, ctx.rows
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if ctx.needs_input_grad[1] else None
        )
        for start in range(0, hidden.shape[0], rows):
            chunk = slice(start, start + rows)
            probabilities = F.linear(hidden[chunk], weight).float().sub_(log_normalisers[chunk, None]).exp_()
            probabilities[torch.arange(probabilities.shape[0], device=hidden.device), targets[chunk]] -= 1
            grad_logits = probabilities.mul_(grad_total).to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[chunk] = grad_logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(grad_logits.t().float(), hidden[chunk].float())
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None


def fused_head_loss(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, budget: int | None = None
) -> torch.Tensor:
    """The summed fp32 cross-entropy of the head over ``hidden`` rows, one chunk of at most ``budget`` bytes of
    logits work at a time (``CHUNK_BYTES`` when None, read at call time)."""
    rows = chunk_rows(weight.shape[0], hidden.element_size(), budget or CHUNK_BYTES)
    return FusedHeadLoss.apply(hidden, weight, targets.to(hidden.device), rows)
