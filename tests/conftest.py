"""Shared fixtures: tiny tokenizers and models built locally, never downloaded."""

from __future__ import annotations

import pytest

from hf_lora_ds.tiny import (
    CHATML_DEFAULT_SYSTEM_TEMPLATE,
    CHATML_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    build_tiny_qwen2,
    train_chat_tokenizer,
)

_CORPUS = [
    DEFAULT_SYSTEM_PROMPT,
    "王大丫丫的回答是--->0123456789 + =",
    "The quick brown fox jumps over the lazy dog.",
    "Translate to French: good morning. Bonjour! What is the capital of France? Paris is.",
    "user assistant system tool Hello, how can I help you today? Tell me a joke about cats.",
]


def _tokenizer(template: str):
    return train_chat_tokenizer(_CORPUS * 20, vocab_size=320, chat_template=template)


@pytest.fixture(scope="session")
def chatml_tokenizer():
    """ChatML template without a default system prompt."""
    return _tokenizer(CHATML_TEMPLATE)


@pytest.fixture(scope="session")
def qwen_style_tokenizer():
    """ChatML template that injects a default system turn (as Qwen2.5's does)."""
    return _tokenizer(CHATML_DEFAULT_SYSTEM_TEMPLATE)


@pytest.fixture
def tiny_model(qwen_style_tokenizer):
    """A 2-layer, hidden-32 Qwen2 model matching ``qwen_style_tokenizer``."""
    return build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, qwen_style_tokenizer):
    """A saved tiny model + tokenizer directory, as a user's ``--model_name_or_path`` would be."""
    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_qwen2(qwen_style_tokenizer).save_pretrained(path)
    qwen_style_tokenizer.save_pretrained(path)
    return path
