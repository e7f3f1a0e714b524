"""The memory planner: will a LoRA run fit, under which ZeRO stage, with what batch — before anything loads.

``python -m hf_lora_ds.plan`` prints the table; run_sft prints its configuration's line (``check_memory_plan``) and
resolves ``--deepspeed auto`` (``recommended_deepspeed_config``). How the figures are made: ``model_shape`` (a
meta-device model with PEFT: exact counts and saved activations), ``estimate`` (the terms per configuration),
``planner`` (rows, batch search, recommendation), ``report`` (the table and the one line).
"""

from hf_lora_ds.plan.from_args import (
    PlanArguments,
    check_memory_plan,
    parse_memory,
    plan_run,
    profile_from_dataset,
    recommended_deepspeed_config,
)
from hf_lora_ds.plan.planner import PlanRow, SequenceProfile, recommend

__all__ = [
    "PlanArguments",
    "PlanRow",
    "SequenceProfile",
    "check_memory_plan",
    "parse_memory",
    "plan_run",
    "profile_from_dataset",
    "recommend",
    "recommended_deepspeed_config",
]
