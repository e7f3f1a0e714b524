"""The memory planner: will a LoRA run fit, under which ZeRO stage, with what batch — before anything loads.

``python -m hf_lora_ds.plan`` (hf_lora_ds.cli.plan) prints the table; a run prints its line (``check_run_fits``) and
``--deepspeed auto`` takes ``recommended_deepspeed_config``. ``model_shape``: exact counts from a meta-device model;
``estimate``: the terms per configuration; ``planner``: rows and the pick; ``table``; ``run_plan``: a run's
arguments to its rows.
"""

from hf_lora_ds._lazy import lazy_names

_EXPORTS = {
    "PlanArguments": "hf_lora_ds.plan.run_plan",
    "PlanRow": "hf_lora_ds.plan.planner",
    "SequenceProfile": "hf_lora_ds.plan.planner",
    "check_run_fits": "hf_lora_ds.plan.run_plan",
    "parse_memory": "hf_lora_ds.plan.run_plan",
    "plan_run": "hf_lora_ds.plan.run_plan",
    "profile_from_dataset": "hf_lora_ds.plan.run_plan",
    "recommend": "hf_lora_ds.plan.planner",
    "recommended_deepspeed_config": "hf_lora_ds.plan.run_plan",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
