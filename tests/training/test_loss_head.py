"""hf_lora_ds.training.loss_head: the head a trainer's loss comes from, in the kernels line's words (the reasons for
full logits are tested with the supervised-position loss: tests/training/test_supervised_logits.py)."""

from __future__ import annotations

from hf_lora_ds.training.loss_head import FULL_LOGITS, FUSED_HEAD, LIGER_HEAD, SUPERVISED_ROWS, loss_head
from tests.trainer.test_lora_sft_trainer import make_trainer


def test_the_head_follows_the_trainer_s_choice(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    assert loss_head(trainer) == FUSED_HEAD
    trainer._fused_head_loss = False  # a forward showed the model changes the head's output
    assert loss_head(trainer) == SUPERVISED_ROWS
    trainer.supervised_logits_only = False
    assert loss_head(trainer) == FULL_LOGITS
    trainer.args.use_liger_kernel = True
    assert loss_head(trainer) == LIGER_HEAD
    trainer.args.liger_kernel_config = {"fused_linear_cross_entropy": False}
    assert loss_head(trainer) == FULL_LOGITS
