"""The ``engine:`` line: which engine a run really uses, read from the live objects once Trainer has wrapped the
model, printed and checked before the first step.

The line is read from what trains, not from the flags: the DeepSpeed engine's own ZeRO stage, offload devices and
sequence-parallel size (the Ulysses groups it reduces gradients over),
FSDP2's ``fully_shard`` modules, DDP's wrapper. A run whose launcher or flags asked for DeepSpeed or FSDP and got
something else stops before its first step (``EngineMismatchError``): nothing has been trained, and a silent fallback
(a plain DDP run that looks like FSDP) is the one outcome a user cannot see.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import Trainer, TrainerCallback
from transformers.utils import logging

from hf_lora_ds.callbacks.kernels_line import kernels_line, kernels_record
from hf_lora_ds.distributed import process_group_exists

__all__ = ["EngineCallback", "EngineMismatchError", "check_engine_honoured", "engine_line", "engine_record"]

logger = logging.get_logger(__name__)


class EngineMismatchError(RuntimeError):
    """The launcher or the flags asked for an engine (DeepSpeed, FSDP) that the run did not get."""


def engine_record(trainer: Trainer) -> dict[str, Any]:
    """The engine as the live objects report it: name, ZeRO stage or FSDP sharding, offload, world size, backend,
    weights dtype and mixed precision."""
    wrapped = trainer.model_wrapped
    record: dict[str, Any] = {"engine": "plain"}
    if _is_deepspeed_engine(wrapped):
        offload = {
            name: getattr(getter(), "device", None)
            for name, getter in (
                ("optimizer", wrapped.zero_offload_optimizer),
                ("parameters", wrapped.zero_offload_param),
            )
        }
        record = {
            "engine": "DeepSpeed",
            "zero_stage": wrapped.zero_optimization_stage(),
            **{f"offload_{name}": _device_name(device) for name, device in offload.items()},
            "sequence_parallel": getattr(wrapped, "sequence_parallel_size", 1),
        }
    elif _fsdp2_modules(trainer.model):
        plugin = trainer.accelerator.state.fsdp_plugin
        offloaded = type(getattr(plugin, "cpu_offload", None)).__name__ == "CPUOffloadPolicy"
        record = {
            "engine": "FSDP2",
            "sharded_modules": _fsdp2_modules(trainer.model),
            "reshard_after_forward": bool(plugin.reshard_after_forward),
            "offload_parameters": "cpu" if offloaded else "none",
        }
    elif isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        record = {"engine": "DDP"}
    weights = next((p.dtype for p in trainer.model.parameters() if p.is_floating_point()), None)
    record.update(
        world_size=trainer.accelerator.num_processes,
        backend=torch.distributed.get_backend() if process_group_exists() else "none",
        weights_dtype=str(weights).removeprefix("torch."),
        mixed_precision=_mixed_precision(trainer, wrapped),
    )
    return record


def engine_line(record: dict[str, Any]) -> str:
    """``engine: DeepSpeed ZeRO-3 (offload optimizer cpu, parameters cpu), world size 2, backend gloo, ...``."""
    name = record["engine"]
    if name == "DeepSpeed":
        offloaded = [
            f"{part} {record[f'offload_{part}']}"
            for part in ("optimizer", "parameters")
            if record[f"offload_{part}"] != "none"
        ]
        name = f"DeepSpeed ZeRO-{record['zero_stage']}" + (f" (offload {', '.join(offloaded)})" if offloaded else "")
        if record.get("sequence_parallel", 1) > 1:
            size = record["sequence_parallel"]
            name += (
                f", sequence parallel {size} (Ulysses; {record['world_size'] // size} data-parallel "
                f"group{'s' if record['world_size'] // size > 1 else ''})"
            )
    elif name == "FSDP2":
        sharding = "full shard" if record["reshard_after_forward"] else "shard grad+optimizer (no reshard)"
        offload = ", offload parameters cpu" if record["offload_parameters"] != "none" else ""
        name = f"FSDP2 ({sharding} of {record['sharded_modules']} modules{offload})"
    return (
        f"engine: {name}, world size {record['world_size']}, backend {record['backend']}, weights "
        f"{record['weights_dtype']}, mixed precision {record['mixed_precision']}"
    )


def check_engine_honoured(trainer: Trainer, record: dict[str, Any]) -> None:
    """Stop before the first step when the run did not get the engine its flags or its launcher asked for."""
    engine = trainer.args.engine
    asked = {"deepspeed": "DeepSpeed", "fsdp": "FSDP2"}.get(engine.kind)
    sequence_parallel = engine.sequence_parallel
    if sequence_parallel != record.get("sequence_parallel", 1):
        raise EngineMismatchError(
            f"--sequence_parallel_size {sequence_parallel}, but the run would train with "
            f"{engine_line(record)}; stopped before the first step"
        )
    if asked and record["engine"] != asked:
        given = engine.deepspeed_file or "(a config given as a dict or base64)"
        how = f"--deepspeed {given}" if asked == "DeepSpeed" else "--fsdp / an Accelerate FSDP config"
        raise EngineMismatchError(
            f"{how} asked for {asked}, but the run would train with {engine_line(record)}; "
            "stopped before the first step"
        )


def _is_deepspeed_engine(module: Any) -> bool:
    return type(module).__name__ == "DeepSpeedEngine" and hasattr(module, "zero_optimization_stage")


def _fsdp2_modules(model: torch.nn.Module) -> int:
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(module, FSDPModule) for module in model.modules())


def _device_name(device: Any) -> str:
    return "none" if device is None else str(getattr(device, "value", device))


def _mixed_precision(trainer: Trainer, wrapped: Any) -> str:
    if _is_deepspeed_engine(wrapped):
        return "bf16" if wrapped.bfloat16_enabled() else "fp16" if wrapped.fp16_enabled() else "no"
    return str(trainer.accelerator.mixed_precision)


class EngineCallback(TrainerCallback):
    """At ``on_train_begin`` (the model is wrapped, a checkpoint loaded, no step taken): check the engine, print the
    ``engine:`` and ``kernels:`` lines on rank 0 and put them into the log history, so trainer_state.json and
    report.html keep them."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs) -> None:
        record = engine_record(self.trainer)
        check_engine_honoured(self.trainer, record)
        line, kernels = engine_line(record), kernels_line(kernels_record(self.trainer))
        logger.info(f"{line}\n{kernels}")
        state.log_history.append(
            {
                "engine": line.removeprefix("engine: "),
                "kernels": kernels.removeprefix("kernels: "),
                "step": state.global_step,
            }
        )
