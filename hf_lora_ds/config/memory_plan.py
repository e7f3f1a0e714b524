"""The memory plan's fields (hf_lora_ds.plan)."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MemoryPlanArguments"]


@dataclass
class MemoryPlanArguments:
    """The device memory to plan for and whether a plan that does not fit stops the run."""

    device_memory: str | None = field(
        default=None,
        metadata={
            "help": "Memory per device for the memory plan, e.g. 24GiB or 80GB. Default: the accelerator's; on a "
            "CPU-only machine the host memory, shared by the ranks."
        },
    )
    check_memory_plan: bool = field(
        default=True,
        metadata={
            "help": "On an accelerator, stop before loading the model when the memory plan says the run will not fit "
            "(with the configurations that would). False: print the plan line and try anyway."
        },
    )
