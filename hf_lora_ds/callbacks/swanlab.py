"""SwanLab logging that works with no API key and no network, from rank 0 only, with the full run config.

transformers' built-in integration crashes in ``on_train_begin`` with swanlab 0.10 (``get_run()`` raises instead of
returning None), so ``use_swanlab(trainer)`` swaps it for swanlab's own callback, extended here: without a key it logs
``local`` or ``offline`` rather than prompting for a login (which fails without a TTY), the LoRA config and the
resolved DeepSpeed config are logged field by field, and project and experiment are named after the model and the
output directory (swanlab would use the current directory and a random name).
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import swanlab
from swanlab.integration.transformers import SwanLabCallback as _SwanLabIntegration
from transformers import Trainer, TrainerState, TrainingArguments
from transformers.integrations import SwanLabCallback as _TransformersSwanLabCallback

from hf_lora_ds.callbacks.base import jsonable
from hf_lora_ds.config.engine import engine_of

__all__ = ["SwanLabCallback", "default_swanlab_mode", "default_swanlab_project", "swanlab_names", "use_swanlab"]

# TrainingArguments.project's own default (a Trackio setting); left at it, the project is named after the model.
TRANSFORMERS_DEFAULT_PROJECT = "huggingface"
_PROJECT_SUFFIX = "-lora-sft"
_PROJECT_MAX_LENGTH = 100  # swanlab's limit, as are the characters below
_NOT_IN_PROJECT_NAME = re.compile(r"[^0-9a-zA-Z_\-+.]+")


def default_swanlab_mode() -> str | None:
    """``"local"``/``"offline"`` when no key and no ``SWANLAB_MODE`` are configured; None leaves swanlab's default.

    ``local`` (needs ``swanlab[dashboard]``) is viewable with ``swanlab watch <log_dir>``; either mode can be uploaded
    later with ``swanlab sync <run dir>``."""
    if os.environ.get("SWANLAB_MODE") or swanlab.Settings().api_key:
        return None
    return "local" if importlib.util.find_spec("swanboard") is not None else "offline"


def default_swanlab_project(model_name_or_path: str | None) -> str:
    """``<model basename>-lora-sft`` (``Qwen/Qwen2.5-0.5B-Instruct`` -> ``Qwen2.5-0.5B-Instruct-lora-sft``), in the
    characters swanlab accepts; ``hf-lora-ds`` for a model with no name (one built in memory)."""
    name = Path(str(model_name_or_path or "").rstrip("/\\")).name
    name = _NOT_IN_PROJECT_NAME.sub("-", name).strip("-.")
    return name[: _PROJECT_MAX_LENGTH - len(_PROJECT_SUFFIX)] + _PROJECT_SUFFIX if name else "hf-lora-ds"


def swanlab_names(args: TrainingArguments, model: Any) -> dict[str, str]:
    """``project`` and ``experiment_name`` for ``swanlab.init``: ``--project``/``--run_name`` where given; else
    nothing where swanlab's own settings name one (``SWANLAB_PROJ_NAME``, ``SWANLAB_EXP_NAME``: ``swanlab.init`` reads
    them, and an argument would override them); else the model's and the output directory's names."""
    settings = swanlab.Settings()
    names: dict[str, str] = {}
    if args.project != TRANSFORMERS_DEFAULT_PROJECT:
        names["project"] = args.project
    elif settings.project.name is None:
        names["project"] = default_swanlab_project(getattr(getattr(model, "config", None), "name_or_path", None))
    if args.run_name:
        names["experiment_name"] = args.run_name
    elif settings.experiment.name is None:
        names["experiment_name"] = Path(args.output_dir).resolve().name
    return names


def _extra_config(args: TrainingArguments, model: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        extra["peft_config"] = {name: jsonable(config.to_dict()) for name, config in peft_config.items()}
    deepspeed = jsonable(engine_of(args).deepspeed_config)
    if deepspeed is not None:
        extra["deepspeed_config_resolved"] = deepspeed
    return extra


class SwanLabCallback(_SwanLabIntegration):
    """swanlab's transformers callback, local/offline without a key, with the LoRA and resolved DeepSpeed config.

    Keyword arguments go to swanlab's callback (``project``, ``experiment_name``, ``log_dir``, ``mode``, ...).
    """

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("mode") is None and (mode := default_swanlab_mode()) is not None:
            kwargs["mode"] = mode
        super().__init__(**kwargs)
        self._extra_config_added = False

    def setup(self, args: TrainingArguments, state: TrainerState, model: Any = None) -> None:
        super().setup(args, state, model)
        # setup runs at train begin, so the DeepSpeed config has been resolved by now
        if state.is_world_process_zero and not self._extra_config_added:
            self.update_config(_extra_config(args, model))
            self._extra_config_added = True


def use_swanlab(trainer: Trainer, **kwargs: Any) -> SwanLabCallback:
    """Replace the callback ``report_to="swanlab"`` installed (or add one) with ``SwanLabCallback(**kwargs)``.

    ``project`` and ``experiment_name`` not given default to ``swanlab_names`` of the trainer's arguments and model.
    """
    trainer.pop_callback(_TransformersSwanLabCallback)
    for key, value in swanlab_names(trainer.args, trainer.model).items():
        kwargs.setdefault(key, value)
    callback = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SwanLabCallback)), None)
    if callback is None:
        callback = SwanLabCallback(**kwargs)
        trainer.add_callback(callback)
    return callback
