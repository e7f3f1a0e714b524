"""FSDP2's gaps: a DTensor gradient norm read as a plain tensor, and the FSDP state given to a CPU launch kept by
accelerate. Sharding on CPU ranks and the gathered adapter are launched for real in tests/e2e/test_fsdp.py and
tests/e2e/test_fsdp_matrix.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType

from hf_lora_ds.training.fsdp2 import full_grad_norm, shard_on_cpu


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


@pytest.fixture
def cpu_launch_accelerator():
    """An accelerator in the state a CPU-only multi-process launch gives it (MULTI_CPU), reset afterwards."""
    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.MULTI_CPU
    PartialState._shared_state["distributed_type"] = DistributedType.MULTI_CPU
    yield accelerator
    AcceleratorState._reset_state(reset_partial_state=True)


def test_the_fsdp_state_given_to_a_cpu_launch_outlives_later_accelerator_states(cpu_launch_accelerator):
    """The optimizer wrapper (and others) build ``AcceleratorState()`` after the trainer's set-up; it must not turn the
    run back to MULTI_CPU, or ``get_state_dict`` and the FULL_STATE_DICT resume take FSDP1's paths."""
    args = SimpleNamespace(fsdp="full_shard", fsdp_plugin_args={"fsdp_version": 2, "state_dict_type": "FULL_STATE_DICT"})
    assert shard_on_cpu(SimpleNamespace(args=args, accelerator=cpu_launch_accelerator))
    assert AcceleratorState().distributed_type == DistributedType.FSDP
    assert cpu_launch_accelerator.is_fsdp2
    assert "FULL_STATE_DICT" in str(cpu_launch_accelerator.state.fsdp_plugin.state_dict_type)


def test_without_fsdp_a_cpu_launch_is_left_as_it_is(cpu_launch_accelerator):
    assert not shard_on_cpu(SimpleNamespace(args=SimpleNamespace(fsdp=""), accelerator=cpu_launch_accelerator))
    assert AcceleratorState().distributed_type == DistributedType.MULTI_CPU
