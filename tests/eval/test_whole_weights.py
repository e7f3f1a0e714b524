"""hf_lora_ds.eval.whole_weights: the room rule and the ranks' agreement. The gathered eval itself is checked against
one process in tests/e2e/test_eval_zero3.py, and against generation layer by layer in tests/e2e/test_launch_matrix.py."""

from __future__ import annotations

from types import SimpleNamespace

import psutil
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from hf_lora_ds.eval import whole_weights

CPU = torch.device("cpu")


def _partitioned(numel: int) -> torch.nn.Parameter:
    """A float32 parameter as ZeRO-3 leaves it between forwards: its data freed, its whole size in ``ds_numel``."""
    param = torch.nn.Parameter(torch.empty(0))
    param.ds_numel, param.ds_status, param.ds_active_sub_modules = numel, ZeroParamStatus.NOT_AVAILABLE, set()
    return param


def test_the_whole_model_must_fit_in_half_of_the_memory_each_rank_of_the_node_has(monkeypatch):
    monkeypatch.setattr(psutil, "virtual_memory", lambda: SimpleNamespace(available=8000))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    # 4000 bytes a rank, half of it for the weights: 500 float32 numbers in all
    assert whole_weights._fits([_partitioned(300), _partitioned(200)], CPU)
    assert not whole_weights._fits([_partitioned(300), _partitioned(201)], CPU)


def test_when_one_rank_has_no_room_every_rank_keeps_the_layer_by_layer_hooks(monkeypatch):
    module = torch.nn.Linear(4, 4)
    module.weight, module.bias = _partitioned(16), _partitioned(4)
    hooks = [module.register_forward_pre_hook(lambda *args: None)]
    offload = SimpleNamespace(module=module, forward_hooks=hooks, backward_hooks=[])
    monkeypatch.setattr(whole_weights, "_parameter_offload", lambda model: offload)
    monkeypatch.setattr(whole_weights, "gather_from_ranks", lambda fits: [fits, False])  # rank 1 has no room
    with whole_weights.zero3_weights_gathered(SimpleNamespace(device=CPU)) as gathered:
        assert not gathered
        assert offload.forward_hooks == hooks and len(module._forward_pre_hooks) == 1
    assert module.weight.ds_status == ZeroParamStatus.NOT_AVAILABLE


def test_a_model_without_zero3_or_with_gathering_off_is_left_as_it_is(monkeypatch):
    assert not whole_weights._parameter_offload(torch.nn.Linear(2, 2))
    monkeypatch.setattr(whole_weights, "_parameter_offload", lambda model: 1 / 0)  # never asked when off
    with whole_weights.zero3_weights_gathered(torch.nn.Linear(2, 2), enabled=False) as gathered:
        assert not gathered
