"""What a DeepSpeed config says of ZeRO, as one typed value every reader shares: the stage and where the optimizer
state and the parameters live."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ZeroSettings"]


@dataclass(frozen=True)
class ZeroSettings:
    stage: int = 0
    optimizer_device: str = "none"  # "none" (on the accelerator), "cpu" or "nvme"
    param_device: str = "none"
    reduce_scatter: bool = field(default=True, compare=False)  # ZeRO-3's gradient path (DeepSpeed's default: true)
    memory_efficient_linear: bool = field(default=True, compare=False)  # ZeRO-3's own F.linear (default: true)

    @classmethod
    def of(cls, deepspeed_config: dict[str, Any] | None) -> ZeroSettings:
        """The ``zero_optimization`` section of a loaded DeepSpeed config; stage 0 without one or without DeepSpeed."""
        zero = (deepspeed_config or {}).get("zero_optimization") or {}

        def device(section: str) -> str:
            offload = zero.get(section)
            return str(offload.get("device") or "none") if isinstance(offload, dict) else "none"

        return cls(
            int(zero.get("stage", 0)),
            device("offload_optimizer"),
            device("offload_param"),
            bool(zero.get("reduce_scatter", True)),
            bool(zero.get("memory_efficient_linear", True)),
        )

    @property
    def zero3_linear(self) -> bool:
        """Whether ZeRO-3 partitions the model and replaces ``F.linear`` with DeepSpeed's own
        (hf_lora_ds.training.zero3_linear)."""
        return self.stage == 3 and self.memory_efficient_linear

    @property
    def offloads_optimizer(self) -> bool:
        return self.optimizer_device != "none"

    @property
    def offloads_params(self) -> bool:
        return self.param_device != "none"

    def describe(self) -> str:
        """``ZeRO-3, offload optimizer cpu, parameters cpu``."""
        offloaded = [
            f"{name} {where}"
            for name, where in (("optimizer", self.optimizer_device), ("parameters", self.param_device))
            if where != "none"
        ]
        return f"ZeRO-{self.stage}" + (f", offload {', '.join(offloaded)}" if offloaded else "")
