"""The tiny hybrid models: what they promise to be (their non-attention layers: tests/model/test_layer_kinds.py)."""

from __future__ import annotations

import pytest
import torch

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, build_tiny_hybrid


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_each_family_is_small_sized_for_the_tokenizer_and_deterministic(family, qwen_style_tokenizer):
    model = build_tiny_hybrid(family, qwen_style_tokenizer)
    assert model.config.model_type == family and model.config.hidden_size == 64
    assert model.get_input_embeddings().num_embeddings == len(qwen_style_tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 500_000
    ids = qwen_style_tokenizer("Hello, how can I help you today?", return_tensors="pt").input_ids
    again = build_tiny_hybrid(family, qwen_style_tokenizer)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, again(input_ids=ids).logits)
