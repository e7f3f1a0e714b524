"""The memory planner: will a LoRA run fit, under which ZeRO stage, with what batch — before anything loads.

``python -m hf_lora_ds.plan`` prints the table; run_sft prints its configuration's line (``check_run_fits``) and
resolves ``--deepspeed auto`` (``recommended_deepspeed_config``). How the figures are made: ``model_shape`` (a
meta-device model with PEFT: exact counts and saved activations), ``estimate`` (the terms per configuration),
``planner`` (rows, batch search, recommendation), ``table`` (the table and the one line); ``run`` is the entry: a
run's arguments to its rows.
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
