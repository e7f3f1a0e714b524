"""hf_lora_ds.training.compile: --torch_compile compiles the decoder layers in place for the run (same losses as
eager, the adapter saved under its own names), the model is eager again after it, and the engines it cannot trace
are refused in one line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft import PeftModel
from transformers import TrainerCallback

from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
from hf_lora_ds.config.engine import Engine
from hf_lora_ds.errors import UserError
from hf_lora_ds.training.compile import check_torch_compile, compiled_layer_count
from tests.trainer.test_lora_sft_trainer import make_trainer


class LayersSeen(TrainerCallback):
    """How many modules are compiled in place at each step's end."""

    def __init__(self, model: torch.nn.Module, seen: list[int]) -> None:
        self.model, self.seen = model, seen

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.seen.append(compiled_layer_count(self.model))


def _losses(trainer) -> list[float]:
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.slow
def test_compiled_layers_train_as_eager_and_save_a_loadable_adapter(qwen_style_tokenizer, tmp_path):
    runs = {}
    for compiled in (False, True):
        model = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2)
        trainer = make_trainer(
            model, qwen_style_tokenizer, tmp_path / str(compiled), max_steps=3, torch_compile=compiled
        )
        seen = []
        trainer.add_callback(LayersSeen(model, seen))
        torch._dynamo.reset()
        trainer.train()
        runs[compiled] = trainer, seen
    (eager, _), (compiled, seen) = runs[False], runs[True]
    assert seen == [2, 2, 2]  # both decoder layers, at every step; nothing else
    assert compiled_layer_count(compiled.model) == 0  # the caller's model is eager after the run
    assert torch.allclose(torch.tensor(_losses(compiled)), torch.tensor(_losses(eager)), atol=1e-4)
    saved = PeftModel.from_pretrained(
        build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2), compiled.args.output_dir
    )
    assert {n for n, _ in saved.named_parameters() if "lora_" in n} == {
        n for n, _ in compiled.model.named_parameters() if "lora_" in n
    }


@pytest.mark.parametrize(
    ("engine", "refusal"),
    [
        (Engine("fsdp"), "--torch_compile with FSDP"),
        (Engine("deepspeed", {"zero_optimization": {"stage": 3}}), "--torch_compile with DeepSpeed ZeRO-3"),
    ],
)
def test_engines_that_gather_inside_each_layer_are_refused(engine, refusal):
    with pytest.raises(UserError, match=refusal):
        check_torch_compile(SimpleNamespace(torch_compile=True, engine=engine))
    check_torch_compile(SimpleNamespace(torch_compile=False, engine=engine))
    check_torch_compile(SimpleNamespace(torch_compile=True, engine=Engine("deepspeed", {"zero_optimization": {}})))
