"""FLOPs per token from the model shape, and where the peak FLOP/s comes from."""

from __future__ import annotations

import pytest
import torch
from callback_helpers import lora_model

from hf_lora_ds.callbacks import throughput
from hf_lora_ds.callbacks.throughput import flops_per_token, matmul_parameters, peak_flops_per_device


def _expected_shape(config, rank: int) -> tuple[int, int]:
    """Counted by hand from the Qwen2 config: 7 projections per layer, the tied LM head, r·(in+out) per LoRA pair."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    frozen = layers * sum(i * o for i, o in shapes) + config.vocab_size * h
    trainable = layers * sum(rank * (i + o) for i, o in shapes)
    return frozen, trainable


def test_lora_model_counts_frozen_and_trainable_weights(qwen_style_tokenizer):
    model = lora_model(qwen_style_tokenizer)
    assert matmul_parameters(model) == _expected_shape(model.config, rank=4)


def test_flops_per_token_formula(qwen_style_tokenizer):
    model = lora_model(qwen_style_tokenizer)
    frozen, trainable = _expected_shape(model.config, rank=4)
    attention = 12 * model.config.num_hidden_layers * model.config.hidden_size * 10
    assert flops_per_token(model, seq_len=10) == 4 * frozen + 6 * trainable + attention


def test_cpu_peak_is_measured():
    flops, source = peak_flops_per_device(torch.device("cpu"), torch.float32)
    assert flops > 1e8  # even a slow shared core does more than 0.1 GFLOP/s
    assert "measured" in source


@pytest.mark.parametrize(
    ("name", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", 989.4),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA L4", 121.0),
    ],
)
def test_known_gpus_use_the_datasheet(monkeypatch, name, tflops):
    monkeypatch.setattr(throughput.torch.cuda, "get_device_name", lambda device=None: name)
    flops, source = peak_flops_per_device(torch.device("cuda", 0), torch.bfloat16)
    assert flops == tflops * 1e12
    assert name in source
