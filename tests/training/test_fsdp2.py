"""FSDP2's gaps: a DTensor gradient norm read as a plain tensor. Sharding on CPU ranks and the gathered adapter are
launched for real in tests/e2e/test_fsdp.py."""

from __future__ import annotations

import torch

from hf_lora_ds.training.fsdp2 import full_grad_norm


class ShardedNorm:
    """Stands in for the DTensor FSDP2's clipping returns: only ``full_tensor()`` gives the whole value."""

    def full_tensor(self) -> torch.Tensor:
        return torch.tensor(2.5)


def test_a_sharded_gradient_norm_is_read_whole():
    assert full_grad_norm(ShardedNorm()) == torch.tensor(2.5)


def test_plain_norms_pass_through():
    norm = torch.tensor(1.0)
    assert full_grad_norm(norm) is norm
    assert full_grad_norm(0.5) == 0.5 and full_grad_norm(None) is None
