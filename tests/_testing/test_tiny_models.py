"""The tiny models and tokenizers the tests, benches and data/ build offline: what they promise to be."""

from __future__ import annotations

import torch

from hf_lora_ds._testing.tiny_models import build_tiny_causal_lm, build_tiny_qwen2


def test_tiny_qwen2_is_small_and_matches_its_tokenizer(qwen_style_tokenizer):
    model = build_tiny_qwen2(qwen_style_tokenizer)
    assert model.config.vocab_size >= len(qwen_style_tokenizer)
    assert model.config.num_hidden_layers <= 4 and model.config.hidden_size <= 128
    ids = qwen_style_tokenizer("Hello, how can I help you today?", return_tensors="pt").input_ids
    assert model(input_ids=ids).logits.shape == (1, ids.shape[1], model.config.vocab_size)


def test_tiny_llama_and_qwen2_differ_where_gguf_layouts_do(qwen_style_tokenizer):
    llama, qwen2 = (build_tiny_causal_lm(arch, qwen_style_tokenizer) for arch in ("llama", "qwen2"))
    assert (llama.config.model_type, qwen2.config.model_type) == ("llama", "qwen2")
    assert not llama.config.tie_word_embeddings and llama.model.layers[0].self_attn.q_proj.bias is None
    assert qwen2.model.layers[0].self_attn.q_proj.bias is not None
    assert qwen2.config.hidden_size == 64  # whole Q8_0 blocks of 32
    assert max(p.abs().max() for p in llama.parameters()) > 0.3  # large weights: a wrong layout shows in the logits
    assert torch.isfinite(llama(input_ids=torch.tensor([[1, 2, 3]])).logits).all()
