"""SwanLab logging that works with no API key and no network, from rank 0 only, with the full run config.

Two integrations exist; this module uses swanlab's own and adds only what it lacks.

- transformers' built-in one (``report_to="swanlab"``) checks ``swanlab.get_run() is None`` before starting a run,
  but swanlab 0.10 raises ``RuntimeError("No active Run")`` there instead of returning None, so training crashes in
  ``on_train_begin`` (seen with transformers 5.23 + swanlab 0.10.3). ``use_swanlab(trainer)`` swaps it out.
- swanlab's ``swanlab.integration.transformers.SwanLabCallback`` handles that, logs from rank 0 only, records
  ``args.to_dict()``, the model config and parameter counts, and receives every ``Trainer.log`` call (so the
  ``memory/*`` and ``throughput/*`` metrics become charts).

What it lacks, added by ``SwanLabCallback`` here:

1. With no API key it starts in cloud mode, then prompts for a login or raises when there is no TTY (every
   torchrun job). With no key configured (``SWANLAB_API_KEY``, ``swanlab login``) and no ``SWANLAB_MODE``, the mode
   is ``local`` (viewable with ``swanlab watch <log_dir>``; needs the ``swanlab[dashboard]`` extra) or, without
   the dashboard, ``offline``. Either writes ``<log_dir>/run-*/`` (``swanlog`` by default) and can be uploaded
   later with ``swanlab sync <run dir>``; set ``SWANLAB_MODE=cloud`` with a key to log online directly.
2. The LoRA config arrives as one ``repr`` string; it is replaced by its fields.
3. ``args.deepspeed`` is the config as written, with ``"auto"``; the resolved one is added.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import swanlab
from swanlab.integration.transformers import SwanLabCallback as _SwanLabIntegration
from transformers import Trainer, TrainerState, TrainingArguments
from transformers.integrations import SwanLabCallback as _TransformersSwanLabCallback

from ._common import jsonable, resolved_deepspeed_config

__all__ = ["SwanLabCallback", "default_swanlab_mode", "use_swanlab"]


def default_swanlab_mode() -> str | None:
    """``"local"``/``"offline"`` when no key and no ``SWANLAB_MODE`` are configured; None leaves swanlab's default."""
    if os.environ.get("SWANLAB_MODE") or swanlab.Settings().api_key:
        return None
    return "local" if importlib.util.find_spec("swanboard") is not None else "offline"


def _extra_config(args: TrainingArguments, model: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    peft_config = getattr(model, "peft_config", None)
    if peft_config:
        extra["peft_config"] = {name: jsonable(config.to_dict()) for name, config in peft_config.items()}
    deepspeed = resolved_deepspeed_config(args)
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
    """Replace the callback ``report_to="swanlab"`` installed (or add one) with ``SwanLabCallback(**kwargs)``."""
    trainer.pop_callback(_TransformersSwanLabCallback)
    kwargs.setdefault("experiment_name", trainer.args.run_name)
    callback = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, SwanLabCallback)), None)
    if callback is None:
        callback = SwanLabCallback(**kwargs)
        trainer.add_callback(callback)
    return callback
