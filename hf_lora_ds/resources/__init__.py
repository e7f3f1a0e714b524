"""What the package ships besides code: DeepSpeed, FSDP2 and Accelerate configs, Qwen2.5 model configs, the demo model and
data. They live inside the package so that a ``pip install`` (not only a clone) has them; the repository's
top-level ``ds_configs/``, ``fsdp_configs/``, ``accelerate_configs/``, ``examples/model_configs/`` and ``data/tiny-qwen2-sum``,
``data/sum_to_x`` are links to these folders, so every file has one source.
"""

from __future__ import annotations

from pathlib import Path

from hf_lora_ds.errors import MissingPathError

__all__ = [
    "RESOURCES",
    "DEEPSPEED_CONFIGS",
    "ACCELERATE_CONFIGS",
    "FSDP_CONFIGS",
    "MODEL_CONFIGS",
    "DEMO_MODEL",
    "DEMO_DATA",
    "shipped_deepspeed_names",
    "resolve_deepspeed_name",
]

RESOURCES = Path(__file__).resolve().parent
DEEPSPEED_CONFIGS = RESOURCES / "ds_configs"
ACCELERATE_CONFIGS = RESOURCES / "accelerate_configs"
FSDP_CONFIGS = RESOURCES / "fsdp_configs"
MODEL_CONFIGS = RESOURCES / "model_configs"
DEMO_MODEL = RESOURCES / "demo" / "tiny-qwen2-sum"
DEMO_DATA = RESOURCES / "demo" / "sum_to_x"


def shipped_deepspeed_names() -> list[str]:
    """The short names ``--deepspeed`` takes for the shipped configs: ``stage0`` ... ``stage3_offload``."""
    return sorted(path.stem for path in DEEPSPEED_CONFIGS.glob("*.json"))


def resolve_deepspeed_name(value: str) -> str:
    """``--deepspeed stage3`` (or ``stage3.json``) as the shipped file's path; a path or base64 text as given.

    A value that looks like a short name (no folder, not an existing file) but names no shipped config is refused
    with the list, rather than read as base64 and reported as a missing file."""
    if Path(value).is_file() or "/" in value or "\\" in value:
        return value
    stem = value.removesuffix(".json")
    if stem in shipped_deepspeed_names():
        return str(DEEPSPEED_CONFIGS / f"{stem}.json")
    if stem.replace("_", "").isalnum() and len(stem) <= 40:
        raise MissingPathError(
            f"--deepspeed {value}: no such file or shipped config; shipped: {', '.join(shipped_deepspeed_names())} "
            "(or a path to a DeepSpeed JSON config, or 'auto')"
        )
    return value
