"""hf_lora_ds.eval.whole_weights: the room rule, the ranks' agreement, and a real engine's weights and hooks. The
gathered eval is checked against one process in tests/e2e/test_eval_zero3.py, and against generation layer by layer
in tests/e2e/test_launch_matrix.py."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import psutil
import pytest
import torch
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

from hf_lora_ds.eval import whole_weights
from tests.e2e.launching import REPO, free_port, launch_env

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


# A one-rank ZeRO-3 engine (gloo) in a fresh interpreter: DeepSpeed's process group and config stay out of this one.
_ENGINE_SCRIPT = """
import os, sys
import deepspeed, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
from hf_lora_ds._compat import deepspeed_startup_trimmed
from hf_lora_ds.eval.whole_weights import zero3_weights_gathered

os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
with deepspeed_startup_trimmed():  # as a run makes it: no CPU shared-memory allreduce built, nor left in /dev/shm
    deepspeed.init_distributed("gloo")
model = get_peft_model(AutoModelForCausalLM.from_pretrained(sys.argv[1]), LoraConfig(r=4, target_modules="all-linear"))
config = {"train_micro_batch_size_per_gpu": 1, "zero_allow_untested_optimizer": True,
          "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,  # no whole layer kept:
                                "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}}  # freed after use
trainable = [p for p in model.parameters() if p.requires_grad]
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(trainable, lr=0.1), config=config)
offload = engine.optimizer.parameter_offload
ids = torch.tensor([[1, 2, 3, 4, 5, 6]])

def train_step():
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()

def partitioned():
    return all(p.ds_status == ZeroParamStatus.NOT_AVAILABLE for p in engine.module.parameters())

train_step()
hooks = len(offload.forward_hooks), len(offload.backward_hooks)
with torch.no_grad():
    layer_by_layer = engine(input_ids=ids).logits
assert partitioned() and hooks[0] > 0
with zero3_weights_gathered(engine) as gathered, torch.no_grad():
    assert gathered and not offload.forward_hooks and not partitioned()
    assert all(p.ds_status == ZeroParamStatus.AVAILABLE for p in engine.module.parameters())
    torch.testing.assert_close(engine.module(input_ids=ids).logits, layer_by_layer, rtol=0, atol=0)
assert (len(offload.forward_hooks), len(offload.backward_hooks)) == hooks, "the hooks are back for training"
assert partitioned()
train_step()
assert partitioned(), "the hooks free each layer again after its use"
print("ok")
"""


@pytest.mark.slow
def test_a_zero3_engine_has_its_weights_whole_in_the_block_and_its_hooks_back_after_it(tiny_model_dir):
    script = [sys.executable, "-c", _ENGINE_SCRIPT, str(tiny_model_dir), str(free_port())]
    done = subprocess.run(script, cwd=REPO, env=launch_env(), capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "ok", done.stdout[-3000:] + done.stderr[-4000:]
