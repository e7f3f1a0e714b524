"""Check a ``--deepspeed`` config before anything is loaded, and say which key (and which flag) to change.

Left to transformers and DeepSpeed, a bad config fails late and vaguely: a missing file or a JSON typo inside
``HfTrainerDeepSpeedConfig`` with no line number, an unknown ZeRO stage as a pydantic enum error after the model is
loaded, a fixed ``train_batch_size`` that does not match the flags and the world size as an assertion on every rank,
and a misspelled top-level key not at all (DeepSpeed ignores keys it does not read, so ``"zero_optimisation"``
silently trains without ZeRO). ``check_deepspeed_config`` runs in ``SFTTrainingArguments.__post_init__`` and raises
a ``UserError`` for each of these.

The known keys come from DeepSpeed itself: the top-level ones are those ``DeepSpeedConfig`` reads from a config
(recorded while it parses a minimal one), the ``zero_optimization`` ones are the fields and aliases of its pydantic
models. So a key added by a newer DeepSpeed is accepted without a change here.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import functools
import json
import os
from pathlib import Path
from typing import Any

from hf_lora_ds.config.zero_settings import ZeroSettings
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.resources import DEEPSPEED_CONFIGS

__all__ = [
    "check_deepspeed_config",
    "deepspeed_config_file",
    "deepspeed_config_path",
    "known_top_level_keys",
    "load_deepspeed_config",
    "shipped_deepspeed_names",
]

_ZERO_STAGES = (0, 1, 2, 3)
_OFFLOAD_DEVICES = ("none", "cpu", "nvme")
# Literal batch keys and the flag that owns each; "auto" lets Trainer fill them in from the flags.
_BATCH_FLAGS = {
    "train_micro_batch_size_per_gpu": "--per_device_train_batch_size",
    "gradient_accumulation_steps": "--gradient_accumulation_steps",
}


def load_deepspeed_config(value: str | dict) -> tuple[dict, str]:
    """The config as a dict and a name for messages, from any form ``--deepspeed`` takes: a dict, a JSON file path,
    a shipped config's short name (``stage3``) or base64-encoded JSON (as transformers and accelerate accept it)."""
    if isinstance(value, dict):
        return value, "--deepspeed"
    config = _decode_base64(value)
    if config is not None:
        source = "--deepspeed (base64)"
    else:
        path = Path(deepspeed_config_path(value))
        source = f"--deepspeed {path}"
        if not path.is_file():
            raise MissingPathError(
                f"--deepspeed {value}: no such file; pass a DeepSpeed JSON config such as ds_configs/stage2.json"
            )
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise UserError(f"{source}: not UTF-8 text (byte offset {err.start}); re-save it as UTF-8 JSON") from None
        except json.JSONDecodeError as err:
            raise UserError(
                f"{source}, line {err.lineno} column {err.colno}: invalid JSON ({err.msg}); DeepSpeed configs are "
                "plain JSON (no comments, no trailing commas)"
            ) from None
    if not isinstance(config, dict):
        raise UserError(f"{source}: the config must be a JSON object {{...}}, got {type(config).__name__}")
    return config, source


def deepspeed_config_path(value: str) -> str:
    """``--deepspeed stage3`` (or ``stage3.json``) as the shipped file's path; a path or base64 text as given.

    A value that looks like a short name (no folder, not an existing file) but names no shipped config is refused
    with the list, rather than read as base64 and reported as a missing file."""
    if _decode_base64(value) is not None or "/" in value or "\\" in value or os.path.isfile(value):
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


def deepspeed_config_file(value: str | dict) -> Path | None:
    """The file a ``--deepspeed`` value names (a path, or a shipped config's short name); None for a dict or base64."""
    if isinstance(value, dict) or _decode_base64(value) is not None:
        return None
    return Path(deepspeed_config_path(value))


def shipped_deepspeed_names() -> list[str]:
    """The short names ``--deepspeed`` takes for the shipped configs: ``stage0`` ... ``stage3_offload``."""
    return sorted(path.stem for path in DEEPSPEED_CONFIGS.glob("*.json"))


def _decode_base64(value: str) -> Any | None:
    """The JSON a base64 ``--deepspeed`` value holds, or None for anything else (a path, a short name)."""
    try:
        return json.loads(base64.urlsafe_b64decode(value).decode("utf-8"))
    except (binascii.Error, ValueError):  # also UnicodeDecodeError and JSONDecodeError
        return None


def check_deepspeed_config(config: dict, source: str, *, micro_batch: int, accumulation: int, world_size: int) -> None:
    """Raise a ``UserError`` for the first problem found: an unknown key, an unknown ZeRO stage or offload device,
    offload that cannot work, or a fixed batch size that contradicts the flags and ``world_size``."""
    _check_keys(config, known_top_level_keys(), source, "")
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise UserError(f"{source}: 'zero_optimization' must be an object such as {{\"stage\": 2}}")
    _check_zero(zero, source)
    _check_offload(config, zero, source)
    _check_batch(config, source, micro_batch, accumulation, world_size)


@functools.cache
def known_top_level_keys() -> frozenset[str]:
    """Every top-level key DeepSpeed's ``DeepSpeedConfig`` looks up, recorded while it parses a minimal config."""
    from deepspeed.runtime.config import DeepSpeedConfig

    recorder = _KeyRecorder(train_batch_size=1, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    DeepSpeedConfig(recorder)
    return frozenset(key for key in recorder.looked_up if isinstance(key, str))


class _KeyRecorder(dict):
    """A config dict that remembers every key asked for, however DeepSpeed asks (``get``, ``[]``, ``in``)."""

    def __init__(self, **items: Any) -> None:
        super().__init__(**items)
        self.looked_up: set = set()

    def get(self, key: Any, default: Any = None) -> Any:
        self.looked_up.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        self.looked_up.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: Any) -> bool:
        self.looked_up.add(key)
        return super().__contains__(key)

    def keys(self) -> _RecordingKeys:  # type: ignore[override]  # ``KEY in config.keys()`` is recorded too
        return _RecordingKeys(self)


class _RecordingKeys:
    def __init__(self, recorder: _KeyRecorder) -> None:
        self.recorder = recorder

    def __contains__(self, key: Any) -> bool:
        return key in self.recorder

    def __iter__(self):
        return iter(dict.keys(self.recorder))

    def __len__(self) -> int:
        return dict.__len__(self.recorder)


def _model_keys(model: type) -> frozenset[str]:
    """Field names and aliases of one of DeepSpeed's pydantic config models (both spellings are accepted)."""
    return frozenset(
        name for field_name, info in model.model_fields.items() for name in (field_name, info.alias) if name
    )


def _check_keys(section: dict, known: frozenset[str], source: str, prefix: str) -> None:
    for key in section:
        if key in known:
            continue
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        hint = f"did you mean '{prefix}{close[0]}'?" if close else "check DeepSpeed's config documentation"
        raise UserError(
            f"{source}: unknown key '{prefix}{key}' ({hint}); DeepSpeed "
            + ("ignores unknown top-level keys silently" if not prefix else "refuses it")
            + ", so fix or remove it"
        )


def _check_zero(zero: dict, source: str) -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    _check_keys(zero, _model_keys(DeepSpeedZeroConfig), source, "zero_optimization.")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in _ZERO_STAGES:
        raise UserError(
            f"{source}: zero_optimization.stage is {stage!r}; use 0, 1, 2 or 3 (ds_configs/ has a template for each)"
        )
    for name, model in (
        ("offload_optimizer", DeepSpeedZeroOffloadOptimizerConfig),
        ("offload_param", DeepSpeedZeroOffloadParamConfig),
    ):
        offload = zero.get(name)
        if offload is None:
            continue
        if not isinstance(offload, dict):
            raise UserError(f'{source}: zero_optimization.{name} must be an object such as {{"device": "cpu"}}')
        _check_keys(offload, _model_keys(model), source, f"zero_optimization.{name}.")
        if offload.get("device", "none") not in _OFFLOAD_DEVICES:
            raise UserError(
                f"{source}: zero_optimization.{name}.device is {offload['device']!r}; "
                f"use one of {list(_OFFLOAD_DEVICES)}"
            )


def _check_offload(config: dict, zero: dict, source: str) -> None:
    """Offload needs the ZeRO stage that partitions what it moves, and optimizer offload needs DeepSpeed's own
    (CPU) optimizer: DeepSpeed refuses the torch optimizer Trainer would otherwise create."""
    zero_settings = ZeroSettings.of(config)
    stage = zero_settings.stage
    if zero_settings.offloads_params and stage != 3:
        raise UserError(
            f"{source}: zero_optimization.offload_param needs ZeRO stage 3 (stage is {stage}); set "
            "zero_optimization.stage to 3 or remove offload_param"
        )
    if not zero_settings.offloads_optimizer:
        return
    if stage == 0:
        raise UserError(
            f"{source}: zero_optimization.offload_optimizer needs ZeRO stage 1, 2 or 3 (stage is 0); raise "
            "zero_optimization.stage or remove offload_optimizer"
        )
    if "optimizer" not in config and config.get("zero_force_ds_cpu_optimizer", True):
        raise UserError(
            f"{source}: zero_optimization.offload_optimizer without an 'optimizer' section: DeepSpeed refuses the "
            'torch optimizer Trainer would build; add "optimizer": {"type": "AdamW", "params": {"lr": "auto", '
            '"betas": "auto", "eps": "auto", "weight_decay": "auto"}} (as in ds_configs/stage2_offload.json)'
        )


def _check_batch(config: dict, source: str, micro_batch: int, accumulation: int, world_size: int) -> None:
    """Fixed batch keys must agree with the flags: DeepSpeed asserts ``train_batch_size == micro * accumulation *
    world size`` on every rank, and transformers refuses literal values that differ from its own."""
    flags = {"train_micro_batch_size_per_gpu": micro_batch, "gradient_accumulation_steps": accumulation}
    for key, flag in _BATCH_FLAGS.items():
        value = config.get(key, "auto")
        if value != "auto" and value != flags[key]:
            raise UserError(
                f'{source}: {key} is {value!r} but {flag} is {flags[key]}; set {key} to "auto" in the config '
                f"(Trainer fills it in from the flag) or pass {flag} {value}"
            )
    total = config.get("train_batch_size", "auto")
    expected = micro_batch * accumulation * world_size
    if total != "auto" and total != expected:
        per_step = micro_batch * world_size
        divisible = isinstance(total, int) and total > 0 and total % per_step == 0
        fix = f" or pass --gradient_accumulation_steps {total // per_step}" if divisible else ""
        raise UserError(
            f"{source}: train_batch_size is {total!r} but --per_device_train_batch_size {micro_batch} x "
            f"--gradient_accumulation_steps {accumulation} x {world_size} ranks = {expected}; set train_batch_size "
            f'to "auto" (Trainer computes it){fix}'
        )
