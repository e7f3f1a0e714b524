"""hf_lora_ds.model.packed_boundaries: which models' non-attention layers keep packed samples apart, and the line that
refuses packing for the others. On this CPU every hybrid family is refused; the allow branch is shown with the CUDA
kernels declared present (their exactness needs a GPU with the kernels, which these tests do not claim)."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, MORE_HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds.data.batches.collator import build_collator
from hf_lora_ds.model import packed_boundaries
from hf_lora_ds.model.packed_boundaries import kernels_present, packed_batch_keys, packing_refusal

KIND_WORDS = {
    "qwen3_5_text": "linear-attention",
    "qwen3_next": "linear-attention",
    "granitemoehybrid": "state-space",
    "nemotron_h": "state-space",
    "jamba": "state-space",
    "falcon_h1": "state-space",
    "lfm2": "short-convolution",
    "bamba": "state-space",
    "minimax": "linear-attention",
    "kimi_linear": "linear-attention",
}
# What transformers 5.24 forwards to each family's kernels (None: Jamba's decoder layer forwards nothing).
ALLOWED_KEYS = {
    "qwen3_5_text": ("seq_idx", "cu_seq_lens_q"),
    "qwen3_next": ("seq_idx", "cu_seq_lens_q"),
    "granitemoehybrid": ("seq_idx",),
    "nemotron_h": ("seq_idx",),
    "jamba": None,
    "falcon_h1": ("seq_idx",),
    "lfm2": ("seq_idx",),
    "bamba": ("seq_idx",),
}


@pytest.fixture(scope="module", params=HYBRID_FAMILIES)
def hybrid(request, qwen_style_tokenizer):
    return request.param, build_tiny_hybrid(request.param, qwen_style_tokenizer).eval()


@pytest.mark.parametrize("batching", ["packed", "padding_free"])
def test_every_hybrid_family_is_refused_in_one_line_naming_its_layers(hybrid, batching):
    family, model = hybrid
    assert packed_batch_keys(model) is None
    line = packing_refusal(batching, model)
    assert line is not None and "\n" not in line
    assert line.startswith(f"--batching {batching}: this model's {KIND_WORDS[family]} layers (model.layers.")
    assert line.endswith("use --batching padded")
    assert packing_refusal("padded", model) is None


@pytest.mark.parametrize("family", MORE_HYBRID_FAMILIES)
def test_linear_attention_without_a_convolution_is_refused_too(family, qwen_style_tokenizer):
    """MiniMax's lightning attention leaks across packed samples as the others do, with no convolution to find."""
    line = packing_refusal("packed", build_tiny_hybrid(family, qwen_style_tokenizer))
    assert line is not None and line.startswith(f"--batching packed: this model's {KIND_WORDS[family]} layers (")


def test_attention_only_models_still_pack(tiny_model):
    assert packed_batch_keys(tiny_model) == ()
    assert packing_refusal("packed", tiny_model) is None and packing_refusal("padding_free", tiny_model) is None


def test_with_the_cuda_kernels_present_the_families_transformers_feeds_boundaries_may_pack(hybrid, monkeypatch):
    family, model = hybrid
    monkeypatch.setattr(packed_boundaries, "kernels_present", lambda modules: True)
    assert packed_batch_keys(model) == ALLOWED_KEYS[family]
    assert (packing_refusal("packed", model) is None) == (ALLOWED_KEYS[family] is not None)
    monkeypatch.setattr(packed_boundaries, "kernels_present", lambda modules: False)
    assert packed_batch_keys(model) is None


def test_kernels_need_cuda_and_every_module(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert kernels_present(["json", "math"])
    assert not kernels_present(["json", "hf_lora_ds_no_such_kernel"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not kernels_present(["json"])


def test_the_leak_the_refusal_stops_is_real(hybrid, qwen_style_tokenizer):
    """Two samples in one row with restarting positions: the second's logits are not its logits alone on the torch
    paths, by over ten times the tolerance within which a plain Qwen2's are (tests/data/batches/test_packing.py): the
    refusal is needed. (From 3e-4 for the tiny LFM2, whose convolution spans 3 tokens, to 0.66 for Granite 4.)"""
    family, model = hybrid
    render = qwen_style_tokenizer.apply_chat_template
    first, second = (
        render([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False)
        for text in ("hello there, how are you", "Tell me a joke about cats.")
    )
    ids = torch.tensor([first + second])
    positions = torch.tensor([list(range(len(first))) + list(range(len(second)))])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, len(first) :]
        alone = model(input_ids=torch.tensor([second]), use_cache=False).logits[0]
    assert (packed - alone).abs().max() > 1e-4


@pytest.mark.gpu
def test_on_cuda_with_the_kernels_packed_samples_give_their_logits_alone(hybrid, qwen_style_tokenizer):
    """The allow branch measured where it can be: two samples in one padding-free row, with the boundary keys the
    collator adds for the family, give the second sample's logits alone. Skipped where the family's kernels are not
    installed (never run yet: no GPU with mamba-ssm, causal-conv1d or flash-linear-attention has been lent)."""
    family, model = hybrid
    model = copy.deepcopy(model).cuda()
    keys = packed_batch_keys(model)
    if keys is None:
        pytest.skip(f"{family}: its boundary-aware kernels are not installed here")
    render = qwen_style_tokenizer.apply_chat_template
    first, second = (
        render([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True, return_dict=False)
        for text in ("hello there, how are you", "Tell me a joke about cats.")
    )
    collator = build_collator("padding_free", qwen_style_tokenizer, boundary_keys=keys)
    batch = collator([{"input_ids": first, "labels": first}, {"input_ids": second, "labels": second}])
    inputs = {key: value.cuda() if torch.is_tensor(value) else value for key, value in batch.items() if key != "labels"}
    with torch.no_grad():
        packed = model(**inputs, use_cache=False).logits[0, len(first) :]
        alone = model(input_ids=torch.tensor([second], device="cuda"), use_cache=False).logits[0]
    torch.testing.assert_close(packed, alone, rtol=1e-3, atol=1e-3)
