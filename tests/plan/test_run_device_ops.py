"""The run device's ops on the meta device: autocast's casts of the matmuls, CUDA's dropout mask."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_lora_ds.plan.run_device_ops import RunDeviceOps


def saved_shapes(run) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """The dtype and shape of each tensor autograd saves for backward over ``run()``."""
    saved = []

    def pack(tensor):
        saved.append((tensor.dtype, tuple(tensor.shape)))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return saved


def saved_dtypes(run) -> list[torch.dtype]:
    return [dtype for dtype, _ in saved_shapes(run)]


def test_matmuls_run_in_the_autocast_dtype_and_other_ops_do_not():
    x = torch.empty(4, 8, device="meta", requires_grad=True)
    weight = torch.empty(3, 8, device="meta", requires_grad=True)
    with RunDeviceOps(torch.bfloat16, fused_dropout=False):
        assert F.linear(x, weight).dtype == torch.bfloat16
        assert torch.matmul(x, weight.t()).dtype == torch.bfloat16
        assert torch.exp(x).dtype == torch.float32
    with RunDeviceOps(None, fused_dropout=False):
        assert F.linear(x, weight).dtype == torch.float32
        assert saved_dtypes(lambda: F.linear(x, weight)) == [torch.float32, torch.float32]
    with RunDeviceOps(torch.bfloat16, fused_dropout=False):  # the casts are what the matmul keeps
        assert saved_dtypes(lambda: F.linear(x, weight)) == [torch.bfloat16, torch.bfloat16]


def test_dropout_keeps_a_bool_mask_where_the_run_s_is_cuda_s():
    x = torch.empty(4, 8, device="meta", requires_grad=True)
    with RunDeviceOps(None, fused_dropout=True):
        assert saved_dtypes(lambda: F.dropout(x, 0.1, training=True)) == [torch.bool]
        assert saved_dtypes(lambda: F.dropout(x, 0.1, training=False)) == []
    with RunDeviceOps(None, fused_dropout=False):
        assert saved_dtypes(lambda: F.dropout(x, 0.1, training=True)) == [torch.float32]
