"""Fixtures of the model tests: tiny Llama and Qwen2 model directories with the Qwen-style tokenizer."""

from __future__ import annotations

import pytest

from hf_lora_ds._testing.tiny_models import build_tiny_causal_lm


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny_dir(request, tmp_path_factory, qwen_style_tokenizer):
    path = tmp_path_factory.mktemp(f"tiny-{request.param}")
    build_tiny_causal_lm(request.param, qwen_style_tokenizer).save_pretrained(path)
    qwen_style_tokenizer.save_pretrained(path)
    return path
