"""hf_lora_ds.trainer.final_adapter: the final adapter is refused when it never trained, measured against the highest
learning rate the trainer's own optimizer steps applied; no callback's state takes part."""

from __future__ import annotations

import pytest

from hf_lora_ds.model.adapter_check import UntrainedAdapterError
from tests.trainer.test_lora_sft_trainer import _freeze_lora_b, make_trainer


def _without_the_packages_callbacks(trainer) -> None:
    handler = trainer.callback_handler.callbacks
    handler[:] = [cb for cb in handler if not type(cb).__module__.startswith("hf_lora_ds.")]


def test_an_untrained_adapter_is_refused_with_none_of_the_packages_callbacks(
    tiny_model, qwen_style_tokenizer, tmp_path
):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=2, run_callbacks="none")
    _without_the_packages_callbacks(trainer)
    _freeze_lora_b(trainer)
    with pytest.raises(UntrainedAdapterError, match=r"after 2 optimizer steps at a learning rate up to 0\.01"):
        trainer.train()


def test_the_highest_rate_of_every_step_and_parameter_group_is_kept(tiny_model, qwen_style_tokenizer, tmp_path):
    """LoRA+ trains B at 8 times A's rate, in a group of its own; the linear decay lowers both after step 1."""
    trainer = make_trainer(
        tiny_model, qwen_style_tokenizer, tmp_path, max_steps=2, lora_optimizer="loraplus", loraplus_lr_ratio=8.0
    )
    trainer.train()
    assert trainer.max_learning_rate == pytest.approx(8e-2)
