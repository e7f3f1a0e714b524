"""hf_lora_ds.model.varlen_attention: on a padding-free batch or a packed row flattened into one, each sample's logits
and gradients equal those it gets alone under sdpa (the CPU path: one causal sdpa per sample); the CUDA path's call
of torch's varlen kernel checked on the meta device (its fake implementation), on a GPU against per-sample sdpa;
what it cannot do refused in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.attention.varlen
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, PretrainedConfig, Qwen2Config, Qwen2ForCausalLM

from hf_lora_ds._testing.tiny_models import build_tiny_causal_lm
from hf_lora_ds.data.batches.collator import build_collator
from hf_lora_ds.errors import UserError
from hf_lora_ds.model.varlen_attention import (
    Bounds,
    _kernel_options,
    _keywords,
    flash_varlen,
    per_sample_sdpa,
    register_varlen_attention,
    varlen_attention_forward,
)
from hf_lora_ds.training.batches import boundary_keys

REAL_VARLEN_ATTN = torch.nn.attention.varlen.varlen_attn
# torch 2.10's kernel takes is_causal and no window or scale (its keywords: TORCH_2_10 below)
needs_a_windowed_kernel = pytest.mark.skipif(
    "window_size" not in _keywords(REAL_VARLEN_ATTN),
    reason="this torch's varlen_attn has no window_size (torch 2.10)",
)
SAMPLES = [list(range(5, 16)), list(range(20, 24)), list(range(30, 37))]  # 11, 4 and 7 tokens


def logits_and_grads(model, forward) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Each sample's logits from ``forward`` (which returns them a sample each) and the gradients of a fixed random
    weighting of them: equal gradients mean each sample's backward saw only itself too."""
    model.zero_grad()
    logits = forward(model)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(piece.shape, generator=generator) for piece in logits]
    sum((piece * weight).sum() for piece, weight in zip(logits, weights)).backward()
    grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
    return [piece.detach() for piece in logits], grads


def alone(model) -> list[torch.Tensor]:
    return [model(input_ids=torch.tensor([ids])).logits[0] for ids in SAMPLES]


def flattened(batching: str, tokenizer):
    """Each sample's logits from one forward of the batch ``batching`` makes of the samples (packed: two rows, the
    first holding two samples, flattened into one row as flash attention takes them)."""

    def forward(model) -> list[torch.Tensor]:
        collator = build_collator(batching, tokenizer, one_row=True, boundary_keys=boundary_keys(batching, model))
        if batching == "packed":
            rows = [SAMPLES[0] + SAMPLES[1], SAMPLES[2]]
            positions = [list(range(11)) + list(range(4)), list(range(7))]
            features = [{"input_ids": r, "labels": r, "position_ids": p} for r, p in zip(rows, positions)]
        else:
            features = [{"input_ids": ids, "labels": ids} for ids in SAMPLES]
        batch = collator(features)
        assert batch["input_ids"].shape == (1, 22) and isinstance(batch["max_length_q"], int)
        logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits[0]
        return list(logits.split([len(ids) for ids in SAMPLES]))

    return forward


@pytest.mark.parametrize("batching", ["padding_free", "packed"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_each_sample_of_a_flattened_batch_equals_itself_alone_under_sdpa(
    arch, batching, qwen_style_tokenizer, varlen_attention
):
    model = build_tiny_causal_lm(arch, qwen_style_tokenizer)  # GQA: 4 query heads, 2 key/value heads
    expected, expected_grads = logits_and_grads(model, alone)
    model.set_attn_implementation(varlen_attention)
    logits, grads = logits_and_grads(model, flattened(batching, qwen_style_tokenizer))
    for got, want in zip(logits, expected):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-4)  # sums of ~1e3 terms


def test_a_sliding_window_layer_keeps_its_window(qwen_style_tokenizer, varlen_attention):
    """Qwen2 with sliding-window layers (a window of 3, shorter than two of the samples) as sdpa's mask has it."""
    base = build_tiny_causal_lm("qwen2", qwen_style_tokenizer).config.to_dict()
    del base["layer_types"]  # derived again from the window settings
    config = Qwen2Config(**{**base, "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0})
    model = Qwen2ForCausalLM(config).eval()
    assert model.model.layers[0].self_attn.sliding_window == 3
    expected = alone(model)
    model.set_attn_implementation(varlen_attention)
    with torch.no_grad():
        for got, want in zip(flattened("padding_free", qwen_style_tokenizer)(model), expected):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def bounds(lengths: list[int], device: str) -> Bounds:
    starts = torch.tensor([0, *lengths], dtype=torch.int32, device=device).cumsum(0, dtype=torch.int32)
    return Bounds(starts, starts, max(lengths), max(lengths))


class OpCalls(TorchDispatchMode):
    """The ops called under it, with their arguments."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls.append((func, args))
        return func(*args, **(kwargs or {}))


@needs_a_windowed_kernel
@pytest.mark.parametrize(("kv_heads", "window"), [(2, None), (4, None), (2, 3)], ids=["gqa", "mha", "sliding"])
def test_the_cuda_call_on_the_meta_device(kv_heads, window):
    """torch's varlen op has a fake implementation: the CUDA branch's tokens-first layout, GQA and window run here.
    The op's arguments are read too, for what its fake ignores: causal, and the window in the kernel's convention."""
    q = torch.empty(22, 4, 16, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(22, kv_heads, 16, device="meta", dtype=torch.bfloat16)
    with OpCalls() as spy:
        out = flash_varlen(q, kv, kv, bounds([11, 4, 7], "meta"), 0.25, window)
    assert out.shape == (22, 4, 16) and out.dtype == torch.bfloat16
    [args] = [args for func, args in spy.calls if func is torch.ops.torch_attn._varlen_attn.default]
    max_q, max_k, is_causal, scale, window_size, *gqa = args[5:11]  # the dispatcher drops a trailing default
    takes_gqa = "enable_gqa" in _keywords(REAL_VARLEN_ATTN)  # torch 2.13 on; 2.11's FA2 as is
    assert (max_q, max_k, scale, gqa == [True]) == (11, 11, 0.25, kv_heads != 4 and takes_gqa)
    assert (is_causal, window_size) == ((True, [-1, 0]) if window is None else (False, [window - 1, 0]))


def torch_2_11_varlen_attn(
    query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)
):
    """torch 2.11's keywords (the GPU machine's torch; 2.13 added ``enable_gqa``), on to this torch's kernel."""
    gqa = query.shape[1] != key.shape[1]
    takes_gqa = "enable_gqa" in _keywords(REAL_VARLEN_ATTN)
    return REAL_VARLEN_ATTN(
        query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window_size=window_size,
        **({"enable_gqa": gqa} if takes_gqa else {}),
    )  # fmt: skip


def test_a_causal_call_at_the_default_scale_runs_on_every_torch_with_the_kernel():
    """No scale given, no window: what torch 2.10's kernel takes too; causal by its is_causal or by the window (-1, 0),
    which sets is_causal from 2.11 on."""
    q = torch.empty(22, 4, 16, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(22, 2, 16, device="meta", dtype=torch.bfloat16)
    with OpCalls() as spy:
        assert flash_varlen(q, kv, kv, bounds([11, 4, 7], "meta"), None, None).shape == (22, 4, 16)
    [args] = [args for func, args in spy.calls if func is torch.ops.torch_attn._varlen_attn.default]
    assert args[7] is True  # the op's is_causal


@needs_a_windowed_kernel
def test_the_cuda_call_takes_what_an_older_torch_s_kernel_takes(monkeypatch):
    """torch 2.11's varlen_attn has no ``enable_gqa`` (2.13 added it): a GQA model's call must not pass it."""
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", torch_2_11_varlen_attn)
    q = torch.empty(22, 4, 16, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(22, 2, 16, device="meta", dtype=torch.bfloat16)
    assert flash_varlen(q, kv, kv, bounds([11, 4, 7], "meta"), 0.25, 3).shape == (22, 4, 16)


TORCH_2_10 = frozenset({"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k", "is_causal", "return_aux"})


@pytest.mark.parametrize(
    ("scaling", "window", "options"),
    [(None, None, {"is_causal": True}), (0.25, None, {"is_causal": True}), (0.5, None, "takes no attention scale"),
     (None, 3, "has no sliding window")],
    ids=["default-scale", "the-default-scale-given", "another-scale", "sliding-window"],
)  # fmt: skip
def test_a_kernel_without_window_or_scale_is_called_causal_or_refused(scaling, window, options):
    """torch 2.10's varlen_attn: causal by ``is_causal``; what it cannot do (a scale other than 1/sqrt(d), a sliding
    window) refused in one line rather than run as something else."""
    q, k = torch.empty(5, 4, 16, device="meta"), torch.empty(5, 2, 16, device="meta")
    if isinstance(options, dict):
        assert _kernel_options(TORCH_2_10, q, k, scaling, window) == options
    else:
        with pytest.raises(UserError, match=f"^--attn_implementation varlen_attn: torch .*'s varlen_attn {options}"):
            _kernel_options(TORCH_2_10, q, k, scaling, window)


def test_a_narrower_value_is_padded_for_the_kernel_and_cropped():
    """MLA's value head dim is smaller than the query's; FlashAttention takes one head dim."""
    q = torch.empty(6, 4, 16, device="meta", dtype=torch.bfloat16)
    value = torch.empty(6, 4, 8, device="meta", dtype=torch.bfloat16)
    assert flash_varlen(q, q, value, bounds([6], "meta"), None, None).shape == (6, 4, 8)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("window", [None, 64])
def test_gpu_varlen_kernel_matches_per_sample_sdpa_in_bf16(window):
    lengths = [300, 17, 129, 1]
    generator = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(sum(lengths), heads, 64, device="cuda", dtype=torch.bfloat16, generator=generator)
        for heads in (8, 2, 2)
    )
    edges = bounds(lengths, "cuda")
    got = flash_varlen(q, k, v, edges, 0.125, window)
    want = per_sample_sdpa(q.float(), k.float(), v.float(), edges, 0.125, window)
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)


class Attention(torch.nn.Module):
    is_causal = True


def forward(*, module=None, dropout=0.0, **kwargs):
    q = torch.zeros(1, 4, 6, 8)
    edges = dict(zip(Bounds._fields, bounds([6], "cpu")))
    return varlen_attention_forward(module or Attention(), q, q, q, None, dropout=dropout, **{**edges, **kwargs})


@pytest.mark.parametrize(
    ("case", "message"),
    [
        (dict(softcap=50.0), "softcaps its attention logits or has attention sinks; use eager"),
        (dict(s_aux=torch.zeros(4)), "softcaps its attention logits or has attention sinks; use eager"),
        (dict(dropout=0.1), "attention_dropout (0.1) is not applied by this kernel; use sdpa"),
        (dict(is_causal=False), "Attention attends bidirectionally; use sdpa"),
        (dict(cu_seq_lens_q=None), "needs padding-free or packed batches"),
    ],
    ids=["softcap", "sinks", "dropout", "bidirectional", "padded"],
)
def test_what_it_cannot_do_is_refused_in_one_line(case, message):
    with pytest.raises(UserError, match="^--attn_implementation varlen_attn") as refused:
        forward(**case)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert forward()[0].shape == (1, 6, 4, 8)  # the same call without it runs


def test_a_vision_language_model_is_refused_and_a_text_model_registered(varlen_attention):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    vlm = AutoConfig.for_model("qwen2_vl")
    with pytest.raises(UserError, match="varlen_attn: vision-language models are not supported"):
        register_varlen_attention(vlm)
    register_varlen_attention(PretrainedConfig())
    assert ALL_ATTENTION_FUNCTIONS[varlen_attention] is varlen_attention_forward
    assert varlen_attention not in type(ALL_ATTENTION_FUNCTIONS)._global_mapping  # the process's overrides only


@pytest.mark.parametrize(
    ("field", "message"),
    [("attn_logit_softcapping", "softcaps its attention logits"), ("attention_dropout", "attention_dropout (0.1)")],
)
def test_a_config_the_kernel_cannot_run_is_refused_at_loading(field, message, varlen_attention):
    config = AutoConfig.for_model("qwen2", **{field: 0.1})
    with pytest.raises(UserError, match="^--attn_implementation varlen_attn") as refused:
        register_varlen_attention(config)
    assert message in str(refused.value)


def test_a_float32_model_is_refused_on_cuda_and_autocast_activations_cast():
    from hf_lora_ds.model.varlen_attention import _half_precision

    module = torch.nn.Sequential(torch.nn.Linear(2, 2))
    module.config = PretrainedConfig()
    q = torch.zeros(3, 2, 4)
    with pytest.raises(UserError, match="runs in bfloat16 or float16 on CUDA: add --bf16"):
        _half_precision(module, q, q, q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert {t.dtype for t in _half_precision(module, q, q, q)} == {torch.bfloat16}
