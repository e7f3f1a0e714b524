"""A plain ``transformers.Trainer`` on a tiny LoRA model and a dataset of tensors made here, with known token counts."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from transformers import Trainer, TrainingArguments

from tests.callbacks.callback_helpers import LENGTHS, TokenDataset, lora_model, pad_collate


@pytest.fixture(scope="module")
def make_trainer(qwen_style_tokenizer, tmp_path_factory) -> Callable[..., Trainer]:
    """``make_trainer(collate=pad_collate, **training_args)``: one epoch over ``LENGTHS`` in 4 steps of 2."""

    def make(collate=pad_collate, model=None, **overrides) -> Trainer:
        settings = {
            "output_dir": str(tmp_path_factory.mktemp("run")),
            "per_device_train_batch_size": 2,
            "num_train_epochs": 1,
            "logging_steps": 2,
            "learning_rate": 1e-3,
            "use_cpu": True,
            "report_to": "none",
            "disable_tqdm": True,
            "save_strategy": "no",
        }
        settings.update(overrides)
        dataset = TokenDataset(LENGTHS, vocab_size=len(qwen_style_tokenizer))
        return Trainer(
            model=model if model is not None else lora_model(qwen_style_tokenizer),
            args=TrainingArguments(**settings),
            train_dataset=dataset,
            eval_dataset=TokenDataset(LENGTHS[:4], vocab_size=len(qwen_style_tokenizer), seed=1),
            data_collator=collate,
        )

    return make


@pytest.fixture
def no_swanlab_key(monkeypatch, tmp_path):
    """No SwanLab key, mode or names configured, and ``tmp_path`` as the current directory."""
    for var in ("SWANLAB_MODE", "SWANLAB_API_KEY", "SWANLAB_PROJ_NAME", "SWANLAB_EXP_NAME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SWANLAB_ROOT", str(tmp_path / "swanlab-home"))  # no stored login
    # swanlab.init's snapshot of the installed packages runs `python -m pip list`: a process the quick tier never starts
    monkeypatch.setenv("SWANLAB_PROBE_REQUIREMENTS", "false")
    monkeypatch.chdir(tmp_path)  # nor a project-level one
