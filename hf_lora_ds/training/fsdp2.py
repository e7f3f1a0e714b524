"""FSDP2 where accelerate and Trainer leave gaps: kept on a CPU-only multi-process launch, its DTensor gradient norm
made a plain tensor, and the adapter gathered whole for saving.

accelerate sets ``DistributedType.FSDP`` only from its accelerator types, so ``--fsdp`` under a CPU launch (gloo)
silently trained as plain DDP; ``fully_shard`` itself runs over a gloo mesh, so ``shard_on_cpu`` restores the plugin
and ``accelerator.prepare`` applies FSDP2 exactly as on GPUs.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer

__all__ = ["shard_on_cpu", "full_grad_norm", "full_adapter_state_dict"]


def shard_on_cpu(trainer: Trainer) -> bool:
    """Give a CPU multi-process accelerator the FSDP plugin the run asked for; True when it did."""
    from accelerate import PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = trainer.accelerator.state
    if not trainer.args.fsdp or state.distributed_type != DistributedType.MULTI_CPU:
        return False
    state.fsdp_plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    state.distributed_type = DistributedType.FSDP
    # Every later AcceleratorState() copies PartialState's type back; without this is_fsdp2 turns False, the adapter
    # save takes the FSDP1 branch (sharded DTensors, PEFT's save dies) and a FULL_STATE_DICT resume hangs.
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return True


def full_grad_norm(grad_norm: Any) -> Any:
    """FSDP2 clips over DTensor shards and returns the total norm as a DTensor; the plain tensor for everything
    that reads it (logs, the non-finite check's all-reduce)."""
    full_tensor = getattr(grad_norm, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else grad_norm


def full_adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable (LoRA) weights of an FSDP2 model, gathered whole onto rank 0's CPU (empty elsewhere). A
    collective: every rank calls it. Frozen base weights are left out: an adapter needs none of them."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
    return get_model_state_dict(model, options=options)
