"""What the package ships besides code: DeepSpeed, FSDP2 and Accelerate configs, Qwen2.5 model configs, the demo model
and data. They live inside the package so that a ``pip install`` (not only a clone) has them; the repository's top-level
``ds_configs/``, ``fsdp_configs/``, ``accelerate_configs/``, ``examples/model_configs/`` and ``data/tiny-qwen2-sum``,
``data/sum_to_x``, ``data/tiny-vlm``, ``data/shapes`` are links to these folders, so every file has one source.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "RESOURCES",
    "DEEPSPEED_CONFIGS",
    "ACCELERATE_CONFIGS",
    "FSDP_CONFIGS",
    "MODEL_CONFIGS",
    "DEMO_MODEL",
    "DEMO_DATA",
    "DEMO_ARGUMENTS",
    "VISION_DEMO_MODEL",
    "VISION_DEMO_DATA",
]

RESOURCES = Path(__file__).resolve().parent
DEEPSPEED_CONFIGS = RESOURCES / "ds_configs"
ACCELERATE_CONFIGS = RESOURCES / "accelerate_configs"
FSDP_CONFIGS = RESOURCES / "fsdp_configs"
MODEL_CONFIGS = RESOURCES / "model_configs"
DEMO_MODEL = RESOURCES / "demo" / "tiny-qwen2-sum"
DEMO_DATA = RESOURCES / "demo" / "sum_to_x"
# The vision demo (scripts/build_tiny_vlm.py, scripts/make_shapes.py): a tiny Qwen2.5-VL-shaped model, and
# "Which colour is the square?" records with their PNGs.
VISION_DEMO_MODEL = RESOURCES / "demo" / "tiny-vlm"
VISION_DEMO_DATA = RESOURCES / "demo" / "shapes"

# The demo run: every argument of run_sft.py, the audit and the planner that the user leaves out takes these values,
# so any flag changes only its own part of the job.
DEMO_ARGUMENTS = {
    "model_name_or_path": str(DEMO_MODEL),
    "train_file": str(DEMO_DATA / "train.json"),
    "eval_file": str(DEMO_DATA / "eval.json"),
    "eval_task": "sum_to_x",
    "output_dir": "output/sum_to_x_lora",
    "learning_rate": 3e-3,
    "per_device_train_batch_size": 32,
    "per_device_eval_batch_size": 32,
    "max_steps": 150,
    "warmup_steps": 10,
    "lr_scheduler_type": "cosine",
    "logging_steps": 10,
    "save_strategy": "no",
    "report_to": "none",
    "run_callbacks": "all",  # the command line's own: a LoraSFTTrainer built in code gets what its args name
}
