"""Tiny hybrid chat models: attention layers beside linear-attention, state-space (Mamba) or short-convolution layers,
built from their transformers configs with no download (hidden 64, 2-4 layers, one layer of each kind).

``HYBRID_FAMILIES`` are the families of issue 61, as transformers names their text models; where a family also comes
as a Mixture-of-Experts model (Qwen3-Next, Granite 4, Nemotron-H, Jamba), the tiny one has experts too.
``MORE_HYBRID_FAMILIES`` are built the same way for checks that every kind of layer is recognised: MiniMax's
lightning attention has no convolution, Kimi's delta attention keeps its decay in a gate.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["HYBRID_FAMILIES", "MORE_HYBRID_FAMILIES", "build_tiny_hybrid"]

_EXPERTS = {"num_experts_per_tok": 2}
# Gated DeltaNet heads (Qwen3.5, Qwen3-Next).
_LINEAR_ATTENTION = {
    "head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}
# Mamba-2 heads (Granite 4, Falcon-H1, Bamba); Nemotron-H spells the same sizes its own way.
_MAMBA2 = {"mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_chunk_size": 32}

# Each family's own fields at hidden 64: the layer pattern (one non-attention layer first, then attention) and sizes.
_FIELDS: dict[str, dict] = {
    "qwen3_5_text": {"layer_types": ["linear_attention", "full_attention"], **_LINEAR_ATTENTION},
    "qwen3_next": {
        "layer_types": ["linear_attention", "full_attention"],
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
        "num_experts": 4,
        **_EXPERTS,
        **_LINEAR_ATTENTION,
    },
    "granitemoehybrid": {
        "layer_types": ["mamba", "attention"],
        "num_local_experts": 4,
        "shared_intermediate_size": 128,
        **_EXPERTS,
        **_MAMBA2,
    },
    "nemotron_h": {
        "layers_block_type": ["mamba", "attention", "mlp", "moe"],
        "num_hidden_layers": 4,
        "head_dim": 16,
        "ssm_state_size": 16,
        "mamba_num_heads": 4,
        "mamba_head_dim": 32,
        "n_groups": 1,
        "chunk_size": 32,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "moe_intermediate_size": 32,
        "moe_shared_expert_intermediate_size": 32,
        **_EXPERTS,
    },
    "jamba": {
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 4,
        "mamba_d_state": 8,
        "mamba_dt_rank": 8,
        **_EXPERTS,
    },
    "falcon_h1": {"head_dim": 16, "mamba_d_ssm": 128, **_MAMBA2},
    "lfm2": {"layer_types": ["conv", "full_attention"], "block_multiple_of": 16, "block_auto_adjust_ff_dim": False},
    "bamba": {"attn_layer_indices": [1], **_MAMBA2},
}
HYBRID_FAMILIES = tuple(_FIELDS)
_MORE_FIELDS: dict[str, dict] = {
    "minimax": {
        "layer_types": ["linear_attention", "full_attention"],
        "num_local_experts": 4,
        "head_dim": 16,
        **_EXPERTS,
    },
    "kimi_linear": {
        "layer_types": ["linear_attention", "full_attention"],
        "mlp_layer_types": ["dense", "sparse"],
        "num_experts": 4,
        "num_experts_per_token": 2,
        "moe_intermediate_size": 32,
        "linear_head_dim": 16,
        "linear_num_heads": 4,
        "head_dim": 16,
        "kv_lora_rank": 16,
        "q_lora_rank": None,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
    },
}
MORE_HYBRID_FAMILIES = tuple(_MORE_FIELDS)


def build_tiny_hybrid(
    family: str, tokenizer: PreTrainedTokenizerBase, hidden_size: int = 64, seed: int = 0
) -> PreTrainedModel:
    """A randomly initialised hybrid model of ``family`` (a transformers ``model_type`` of ``HYBRID_FAMILIES`` or
    ``MORE_HYBRID_FAMILIES``) sized for ``tokenizer``: hidden 64, 4 attention heads; deterministic for a given
    ``seed``."""
    common = {
        "vocab_size": len(tokenizer),
        "hidden_size": hidden_size,
        "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": None,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    config = AutoConfig.for_model(family, **{**common, **{**_FIELDS, **_MORE_FIELDS}[family]})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
