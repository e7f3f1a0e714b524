"""FSDP2's gaps: a DTensor gradient norm read as a plain tensor, the FSDP state given to a CPU launch kept by
accelerate, and the adapter of a sharded model gathered whole (on one gloo rank here). Sharding on several CPU ranks
and the saved adapter are launched for real in tests/e2e/test_fsdp.py and tests/e2e/test_fsdp_matrix.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType
from peft import LoraConfig, get_peft_model
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hf_lora_ds.training.fsdp2 import full_adapter_state_dict, full_grad_norm, sharded_on_cpu, shards_on_cpu


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


def test_the_fsdp_state_given_to_a_cpu_launch_outlives_later_accelerator_states_and_not_the_run(
    cpu_launch_accelerator,
):
    """The optimizer wrapper (and others) build ``AcceleratorState()`` after the trainer's set-up; inside the run it
    must not turn back to MULTI_CPU, or ``get_state_dict`` and the FULL_STATE_DICT resume take FSDP1's paths. After
    the run accelerate's state is its own again."""
    args = SimpleNamespace(
        fsdp="full_shard", fsdp_plugin_args={"fsdp_version": 2, "state_dict_type": "FULL_STATE_DICT"}
    )
    trainer = SimpleNamespace(args=args, accelerator=cpu_launch_accelerator)
    assert shards_on_cpu(trainer)
    before = dict(AcceleratorState._shared_state), dict(PartialState._shared_state)
    with sharded_on_cpu(trainer):
        assert AcceleratorState().distributed_type == DistributedType.FSDP
        assert cpu_launch_accelerator.is_fsdp2
        assert "FULL_STATE_DICT" in str(cpu_launch_accelerator.state.fsdp_plugin.state_dict_type)
    assert (dict(AcceleratorState._shared_state), dict(PartialState._shared_state)) == before


def test_without_fsdp_a_cpu_launch_is_left_as_it_is(cpu_launch_accelerator):
    assert not shards_on_cpu(SimpleNamespace(args=SimpleNamespace(fsdp=""), accelerator=cpu_launch_accelerator))


@pytest.fixture
def one_rank_group(tmp_path):
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


def test_the_adapter_of_a_sharded_model_is_gathered_whole_onto_the_cpu(tiny_model, one_rank_group):
    """What the adapter is saved from: every LoRA weight as a plain tensor, as trained; a sharded state dict would
    hold DTensors, which PEFT's save_pretrained cannot write."""
    model = get_peft_model(tiny_model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    adapter = {name: param.detach().clone() for name, param in model.named_parameters() if param.requires_grad}
    mesh = init_device_mesh("cpu", (1,))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    gathered = full_adapter_state_dict(model)
    assert adapter.keys() <= gathered.keys()
    for name, tensor in adapter.items():
        assert type(gathered[name]) is torch.Tensor and gathered[name].device.type == "cpu", name
        assert torch.equal(gathered[name], tensor), name
