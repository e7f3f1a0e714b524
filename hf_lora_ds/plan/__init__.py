"""The memory planner: will a LoRA run fit, under which ZeRO stage, with what batch — before anything loads.

``python -m hf_lora_ds.plan`` (hf_lora_ds.cli.plan) prints the table; a run prints its line (``check_run_fits``) and
``--deepspeed auto`` takes ``recommended_deepspeed_config``. ``model_shape``: exact counts from a meta-device model;
``estimate``: the terms per configuration; ``planner``: rows and the pick; ``table``; ``run_plan``: a run's
arguments to its rows.
"""

from hf_lora_ds.plan.planner import PlanRow, SequenceProfile, recommend
from hf_lora_ds.plan.run_plan import (
    PlanArguments,
    check_run_fits,
    parse_memory,
    plan_run,
    profile_from_dataset,
    recommended_deepspeed_config,
)

__all__ = [
    "PlanArguments",
    "PlanRow",
    "SequenceProfile",
    "check_run_fits",
    "parse_memory",
    "plan_run",
    "profile_from_dataset",
    "recommend",
    "recommended_deepspeed_config",
]
