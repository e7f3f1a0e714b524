"""The fused head-and-loss (hf_lora_ds.training.fused_head_loss): loss and gradients (hidden rows, and the head weight
when it trains) equal the full-logits computation, and no tensor of shape (n, vocab) exists in forward or backward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hf_lora_ds.training.fused_head_loss import CHUNK_BYTES, chunk_rows, fused_head_loss


def rows_and_head(n: int, vocab: int, hidden: int = 16, dtype=torch.float32, trainable_head: bool = True):
    generator = torch.Generator().manual_seed(n)
    rows = torch.randn(n, hidden, generator=generator).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden, generator=generator) / 4).to(dtype).requires_grad_(trainable_head)
    return rows, weight, torch.randint(0, vocab, (n,), generator=generator)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, (1e-5, 1e-7)), (torch.bfloat16, (2e-2, 1e-4))])
def test_loss_and_gradients_equal_full_logits(dtype, tolerance):
    rows, weight, targets = rows_and_head(37, 300, dtype=dtype)
    budget = 5 * 300 * (2 * rows.element_size() + 8)
    assert chunk_rows(300, rows.element_size(), budget) == 5  # 8 chunks, the last short
    loss = fused_head_loss(rows, weight, targets, budget)
    grads = torch.autograd.grad(loss * 0.5, (rows, weight))
    expected = F.cross_entropy(F.linear(rows, weight).float(), targets, reduction="sum")
    expected_grads = torch.autograd.grad(expected * 0.5, (rows, weight))
    torch.testing.assert_close(loss, expected, rtol=tolerance[0] / 10, atol=1e-5)
    for grad, expected_grad in zip(grads, expected_grads):
        assert grad.dtype == dtype
        torch.testing.assert_close(grad, expected_grad, rtol=tolerance[0], atol=tolerance[1])


@pytest.mark.parametrize(
    "vocab, itemsize, rows", [(151_936, 2, 128), (49_152, 2, 384), (32_000, 2, 640), (151_936, 4, 110)]
)
def test_chunks_are_whole_row_tiles_within_the_budget(vocab, itemsize, rows):
    """147 rows of Qwen2.5's vocabulary in bf16 fit the budget; 128 run as one GPU row tile where 147 would run as
    two. Below 128 rows, what fits."""
    assert chunk_rows(vocab, itemsize) == rows
    assert rows * vocab * (2 * itemsize + 8) <= CHUNK_BYTES


def test_a_frozen_head_gets_no_gradient():
    rows, weight, targets = rows_and_head(12, 50, trainable_head=False)
    fused_head_loss(rows, weight, targets, budget=4 * 50 * 16).backward()
    assert weight.grad is None and rows.grad is not None


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator returns while the mode is on (forward and backward alike)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.numel())
        return result


def test_no_tensor_grows_with_the_rows_times_the_vocabulary():
    """n grows 8x: the largest tensor any operator of a loss call returns (forward and backward) stays one chunk
    of logits, far below n x vocab (hidden 4: the head weight, vocab x 4, is smaller than a chunk)."""
    vocab, budget = 4096, 8 * 4096 * 16  # 8 rows a chunk in fp32
    largest = {}
    for n in (64, 512):
        rows, weight, targets = rows_and_head(n, vocab, hidden=4, trainable_head=False)
        with LargestTensor() as seen:
            fused_head_loss(rows, weight, targets, budget).backward()
        largest[n] = seen.largest
    assert largest[64] == largest[512] == 8 * vocab  # a chunk's logits; everything else (n x 4 rows) is smaller
    rows, weight, targets = rows_and_head(64, vocab, hidden=4, trainable_head=False)
    with LargestTensor() as seen:  # what the fused loss replaces: n x vocab logits
        F.cross_entropy(F.linear(rows, weight), targets, reduction="sum").backward()
    assert seen.largest == 64 * vocab


class HeadMatmuls(TorchDispatchMode):
    """The matrix products with an operand or result of ``vocab`` rows or columns: the head's matmuls."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab, self.count = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.addmm_):
            shapes = [t.shape for t in (*args, result) if isinstance(t, torch.Tensor)]
            self.count += any(self.vocab in shape for shape in shapes)
        return result


@pytest.mark.parametrize(
    "trainable_head, grad_mode, per_chunk",
    [(False, True, 2), (True, True, 3), (False, False, 1)],
    ids=["frozen head: logits, hidden gradient", "trained head: and its gradient", "no grad: logits only"],
)
def test_each_chunk_makes_its_logits_once(trainable_head, grad_mode, per_chunk):
    """Forward turns each chunk's logits into the gradients at once; backward only scales them (no head matmul:
    recomputing the logits there cost a third head matmul a chunk). Without gradient mode, the logits only."""
    vocab, budget = 300, 5 * 300 * 16  # 5 rows a chunk in fp32: 8 chunks of 37 rows
    rows, weight, targets = rows_and_head(37, vocab, trainable_head=trainable_head)
    with torch.set_grad_enabled(grad_mode), HeadMatmuls(vocab) as forward:
        loss = fused_head_loss(rows, weight, targets, budget)
    assert forward.count == 8 * per_chunk
    if grad_mode:
        with HeadMatmuls(vocab) as backward:
            loss.backward()
        assert backward.count == 0


def test_a_retained_graph_gives_the_same_gradient_again():
    """Backward scales the saved gradients out of place: a second backward through a retained graph adds the same."""
    rows, weight, targets = rows_and_head(9, 40)
    loss = fused_head_loss(rows, weight, targets, budget=4 * 40 * 16)
    loss.backward(retain_graph=True)
    first = (rows.grad.clone(), weight.grad.clone())
    (loss * 3).backward()
    torch.testing.assert_close(rows.grad, 4 * first[0])
    torch.testing.assert_close(weight.grad, 4 * first[1])


def test_fp32_rows_with_a_16_bit_head_under_autocast():
    """The rows' gradient is a matmul the caller's autocast sees, as the logits are: fp32 rows (a norm kept in
    fp32) and a bf16 head meet in bf16, as in the full-logits path."""
    rows, weight, targets = rows_and_head(37, 300, trainable_head=False)
    weight = weight.detach().to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = fused_head_loss(rows, weight, targets, budget=5 * 300 * 12)
        expected = F.cross_entropy(F.linear(rows, weight).float(), targets, reduction="sum")
    (grad,) = torch.autograd.grad(loss, rows)
    (expected_grad,) = torch.autograd.grad(expected, rows)
    assert grad.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=2e-3, atol=1e-3)
    torch.testing.assert_close(grad, expected_grad, rtol=2e-2, atol=1e-4)
