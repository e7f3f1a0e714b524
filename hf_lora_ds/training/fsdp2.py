"""FSDP2 where accelerate and Trainer leave gaps: kept on a CPU-only multi-process launch, its DTensor gradient norm
made a plain tensor, and the adapter gathered whole for saving.

accelerate sets ``DistributedType.FSDP`` only from its accelerator types, so ``--fsdp`` under a CPU launch (gloo)
silently trained as plain DDP; ``fully_shard`` itself runs over a gloo mesh, so ``sharded_on_cpu`` gives accelerate's
state the plugin for the run and ``accelerator.prepare`` applies FSDP2 exactly as on GPUs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import Trainer

from hf_lora_ds._compat import items_replaced

__all__ = ["full_adapter_state_dict", "full_grad_norm", "sharded_on_cpu", "shards_on_cpu"]


def shards_on_cpu(trainer: Trainer) -> bool:
    """Whether accelerate dropped the FSDP the run asked for: ``--fsdp`` on a CPU-only multi-process launch."""
    from accelerate.utils import DistributedType

    return bool(trainer.args.fsdp) and trainer.accelerator.state.distributed_type == DistributedType.MULTI_CPU


@contextmanager
def sharded_on_cpu(trainer: Trainer) -> Iterator[None]:
    """Inside: accelerate's process-wide state (shared by every ``AcceleratorState`` and ``PartialState``) is FSDP
    with the plugin the run asked for, as a GPU launch has it; accelerate's own values after. For a run where
    ``shards_on_cpu``."""
    from accelerate import PartialState
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(**trainer.args.fsdp_plugin_args)
    fsdp = DistributedType.FSDP
    # Every later AcceleratorState() copies PartialState's type back; without it is_fsdp2 turns False, the adapter
    # save takes the FSDP1 branch (sharded DTensors, PEFT's save dies) and a FULL_STATE_DICT resume hangs.
    with (
        items_replaced(AcceleratorState._shared_state, fsdp_plugin=plugin, distributed_type=fsdp),
        items_replaced(PartialState._shared_state, distributed_type=fsdp),
    ):
        yield


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
