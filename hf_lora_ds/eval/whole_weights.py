"""ZeRO-3 generation with the weights gathered whole once per eval, where every rank has room for them.

ZeRO-3's module hooks all-gather each layer's weights before its forward and free them after, at every decoding step:
a model's worth of all-gathers and of Python hook work per generated token, which makes generation-based eval under
ZeRO-3 the slow path users know (LLaMA-Factory#5629 refuses it). Where the whole model fits beside what each rank
already holds, its weights are gathered once and the hooks come off for the eval, as TRL's
``unwrap_model_for_generation`` does; the ranks then generate their own prompts without lock-stepping. Where some
rank has no such room, generation stays layer by layer (``synced_gpus``), the memory ZeRO-3 exists to save.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
import torch

from hf_lora_ds.devices import free_device_memory
from hf_lora_ds.distributed import gather_from_ranks, launcher_ranks_per_node

__all__ = ["zero3_weights_gathered"]

# The gathered model may take this share of a rank's free memory; the rest is left to the KV cache, the
# generation's activations and the allocator's fragmentation.
ROOM_SHARE = 0.5


@contextmanager
def zero3_weights_gathered(model: Any, enabled: bool = True) -> Iterator[bool]:
    """With ``model`` a DeepSpeed ZeRO-3 engine whose whole weights fit on every rank: the block runs with the weights
    gathered and ZeRO-3's hooks off, and gets True. Otherwise, or not ``enabled``, it runs as it is and gets False. A
    collective for a ZeRO-3 engine: every rank must enter it at the same point."""
    offload = _parameter_offload(model) if enabled else None
    if offload is None:
        yield False
        return
    from deepspeed.runtime.zero.partition_parameters import GatheredParameters, ZeroParamStatus

    # Persistent parameters (small ones ZeRO-3 keeps whole) are left out: partitioning them at the end would only make
    # the next forward gather them again.
    parameters = offload.module.parameters()
    partitioned = [p for p in parameters if getattr(p, "ds_status", None) == ZeroParamStatus.NOT_AVAILABLE]
    if not all(gather_from_ranks(_fits(partitioned, model.device))):
        yield False
        return
    with GatheredParameters(partitioned):
        _remove_hooks(offload)
        try:
            yield True
        finally:
            offload._register_deepspeed_module(offload.module, count=[0])  # the module ids the first registration gave


def _parameter_offload(model: Any) -> Any:
    """The engine's ZeRO-3 parameter manager (``DeepSpeedZeRoOffload``), which owns the module hooks; None when
    ``model`` is no ZeRO-3 engine, or one without an optimizer yet."""
    deepspeed = sys.modules.get("deepspeed")  # not imported: no engine to look at
    if deepspeed is None or not isinstance(model, deepspeed.DeepSpeedEngine):
        return None
    if not model.zero_optimization_partition_weights():
        return None
    optimizer = getattr(model, "optimizer", None)
    return getattr(optimizer, "parameter_offload", None)


def _fits(partitioned: list[torch.nn.Parameter], device: torch.device) -> bool:
    """Whether this rank has room for the gathered weights: ``ROOM_SHARE`` of its accelerator's free memory, or on a
    CPU of the host's available memory shared by the node's ranks."""
    needed = sum(p.ds_numel * p.element_size() for p in partitioned)
    if device.type == "cpu":
        free = psutil.virtual_memory().available // launcher_ranks_per_node()
    else:
        free = free_device_memory(device)
    return needed <= ROOM_SHARE * free


def _remove_hooks(offload: Any) -> None:
    """Take ZeRO-3's per-module hooks off (the root's start-of-forward hook only resets the coordinator's step)."""
    for param in offload.module.parameters():
        param.ds_active_sub_modules.clear()
    for hook in (*offload.forward_hooks, *offload.backward_hooks):
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
