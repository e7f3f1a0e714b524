import pytest
from peft import LoraConfig, get_peft_model

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, MORE_HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds._testing.tiny_models import build_tiny_moe
from hf_lora_ds.model.layer_kinds import sequence_mixer_counts, sequence_mixers

# The non-attention layers each tiny family is built with (hf_lora_ds/_testing/tiny_hybrids.py).
_EXPECTED = {
    "qwen3_5_text": {"model.layers.0.linear_attn": "linear attention"},
    "qwen3_next": {"model.layers.0.linear_attn": "linear attention"},
    "granitemoehybrid": {"model.layers.0.mamba": "state space"},
    "nemotron_h": {"model.layers.0.mixer": "state space"},
    "jamba": {"model.layers.0.mamba": "state space"},
    "falcon_h1": {"model.layers.0.mamba": "state space", "model.layers.1.mamba": "state space"},
    "lfm2": {"model.layers.0.conv": "short convolution"},
    "bamba": {"model.layers.0.mamba": "state space"},
    # no convolution: found by its decay buffers
    "minimax": {"model.layers.0.self_attn": "linear attention"},
    # a convolution beside a gate that holds the decay: one layer, the outer one
    "kimi_linear": {"model.layers.0.self_attn": "linear attention"},
}


@pytest.mark.parametrize("family", HYBRID_FAMILIES + MORE_HYBRID_FAMILIES)
def test_each_hybrid_family_names_its_non_attention_layers(family, qwen_style_tokenizer):
    assert sequence_mixers(build_tiny_hybrid(family, qwen_style_tokenizer)) == _EXPECTED[family]


def test_a_lora_wrapped_convolution_is_still_found(qwen_style_tokenizer):
    """A LoRA layer around the depthwise convolution (PEFT takes one whose rank is a multiple of its channels) must
    not hide the layer: the check runs on wrapped models too."""
    model = build_tiny_hybrid("lfm2", qwen_style_tokenizer)
    wrapped = get_peft_model(model, LoraConfig(target_modules=r".*\.conv\.conv", r=64))
    assert sequence_mixer_counts(wrapped) == {"short convolution": 1}


@pytest.mark.parametrize("build", ["dense", "moe"])
def test_attention_only_models_have_none(build, tiny_model, qwen_style_tokenizer):
    model = tiny_model if build == "dense" else build_tiny_moe("qwen3_moe", qwen_style_tokenizer)
    assert sequence_mixers(model) == {}
