"""What a model *is*, in bytes, read from its ``config.json`` alone: the model is built on the meta device (no weight
is read or allocated, so a 72B config takes seconds) and wrapped with PEFT using the run's LoRA settings, so the
frozen and trainable parameter counts and the largest module are counted, not derived from formulas.

Activations are counted the same way: a meta-device forward of a one-layer and a two-layer copy of the decoder records
every tensor autograd saves for backward (``saved_tensors_hooks``), as the run saves them (PEFT's fp32 adapters take
16-bit inputs, RMSNorm upcasts, a 16-bit run without DeepSpeed autocasts, dropout on a GPU keeps a one-byte mask:
``RunDeviceOps``; ZeRO-3's linear, as the run's steps use it, keeps what torch's does). Their difference is what each
further layer adds (the first layer saves less: its input, the frozen embedding's output, needs no gradient).
Memory-efficient attention kernels (sdpa's fused kernels, flash attention) keep their inputs, output and a
log-sum-exp instead of the ``B·H·T²`` score matrix, but on the meta device sdpa takes its math path and would record
the scores: ``meta_attention`` stands in for them.

Mixture-of-Experts layers are counted as their grouped GEMM runs them (``_planned_experts_forward``): each token's
hidden state once per expert it is routed to (the active experts, not all of them) and, for an expert weight LoRA
adapts, the whole stack W + BA that PEFT's ParamWrapper builds and the GEMM keeps for backward. On the meta device the
grouped GEMM itself takes bf16 only and PEFT's fold calls autocast, which has no meta dtype: the ParamWrappers are
switched off for that forward and the stand-in makes the W + BA they would.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch
from peft import LoraConfig
from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper
from transformers import PretrainedConfig
from transformers.integrations.moe import ExpertsInterface
from transformers.modeling_utils import set_zero3_state

from hf_lora_ds.config.lora_init import DataPass, lora_init_from_peft
from hf_lora_ds.model.lora import shape_config, wrap_with_lora
from hf_lora_ds.plan.run_device_ops import RunDeviceOps, meta_attention
from hf_lora_ds.training.adapter_inputs import inputs_as_they_come, uncast_in_training
from hf_lora_ds.vision.modules import auto_model_class

__all__ = [
    "ModelShape",
    "measure_model_shape",
]

_GROUPED = "hf_lora_ds_plan_grouped"  # registered name of the stand-in experts kernel
_LORA_STACKS = "_hf_lora_ds_lora_stacks"  # on an experts module: the stacks LoRA adapts
_MEASURED: dict[tuple, ModelShape] = {}


@dataclass(frozen=True)
class ModelShape:
    """Counts for one model + LoRA setting; activation figures are bytes for one sample of ``seq_len`` tokens."""

    frozen_params: int
    trainable_params: int
    frozen_weight_bytes: int  # as loaded: in the run's dtype, or 4/8-bit packed weights and their scales
    largest_module_bytes: int  # the biggest module's frozen weights, in the compute dtype (a ZeRO-3 gather)
    hidden_size: int
    vocab_size: int
    num_layers: int
    seq_len: int
    first_layer_activation_bytes: int  # the decoder with one layer: that layer, embeddings and the final norm
    layer_activation_bytes: int  # saved by each further layer (the first saves less: its input needs no grad); a
    # hybrid's on average over its layer pattern (attention, linear attention, Mamba, MLP-only layers save unlike)
    layer_input_bytes: int  # a layer's input: what gradient checkpointing keeps per layer
    backward_working_bytes: int  # what a layer's backward allocates on top of what was saved
    recomputed_layer_bytes: int = 0  # the largest further layer, recomputed under checkpointing (0: the average's)
    init_pass_bytes: int = 0  # held by the LoRA init's data pass before step 1 (CorDA's input covariances)
    attention_heads: int = 0  # query heads, key/value heads and head size: what sequence parallelism exchanges
    kv_heads: int = 0
    head_dim: int = 0

    def activation_bytes(self, batch_size: int, gradient_checkpointing: bool) -> int:
        """Saved for backward over the whole forward of ``batch_size`` samples of ``seq_len`` tokens, plus the
        working memory of a layer's backward. With gradient checkpointing only each layer's input is kept, and one
        layer at a time is recomputed in backward.

        The working memory is ``backward_working_bytes`` (see ``_backward_working_bytes``)."""
        if gradient_checkpointing:
            further = max(self.layer_activation_bytes, self.recomputed_layer_bytes)
            recomputed = max(further, self.first_layer_activation_bytes)
            per_sample = self.num_layers * self.layer_input_bytes + recomputed
        else:
            per_sample = self.first_layer_activation_bytes + (self.num_layers - 1) * self.layer_activation_bytes
        return batch_size * (per_sample + self.backward_working_bytes)


def measure_model_shape(
    config: PretrainedConfig,
    lora: LoraConfig,
    dtype: torch.dtype,
    seq_len: int,
    attn_implementation: str | None = None,
    quantization: str | None = None,
    adapters_in_compute_dtype: bool = False,
    train_lora_a: bool = True,
    on_accelerator: bool = False,
) -> ModelShape:
    """Count parameters and saved activations for ``seq_len`` tokens of one sample. ``quantization`` is ``"4bit"``,
    ``"8bit"`` or None; quantized bases are counted with bitsandbytes' storage of their linear layers.
    ``train_lora_a`` False: LoRA-FA, whose A is frozen (no gradient, no optimizer state). ``lora``'s
    initialisation is read for what its data pass holds (``init_pass_bytes``); the shapes are PEFT's default's.

    PEFT keeps adapters in fp32 under a 16-bit base; the run autocasts, and its training step leaves the adapted
    layers' inputs in 16 bits (hf_lora_ds.training.adapter_inputs). DeepSpeed casts all parameters to the compute
    dtype and does not autocast (``adapters_in_compute_dtype``). ``on_accelerator``: the
    run's dropout is CUDA's fused kernel, which saves a bool mask where the CPU's saves one in the input's dtype.
    Results are kept for the process: run_sft plans twice (``--deepspeed auto``, then the plan line)."""
    settings = (
        dtype,
        seq_len,
        attn_implementation,
        quantization,
        adapters_in_compute_dtype,
        train_lora_a,
        on_accelerator,
    )
    key = (config.to_json_string(), repr(lora), *settings)
    if key not in _MEASURED:
        # Building a model draws from torch's CPU generator even on the meta device: planning must not change the
        # LoRA initialisation of the run that plans (run_sft seeds before it plans).
        with torch.random.fork_rng(devices=[]):
            _MEASURED[key] = _measure(config, lora, *settings)
    return _MEASURED[key]


def _measure(
    config: PretrainedConfig,
    lora: LoraConfig,
    dtype: torch.dtype,
    seq_len: int,
    attn_implementation: str | None,
    quantization: str | None,
    adapters_in_compute_dtype: bool,
    train_lora_a: bool,
    on_accelerator: bool,
) -> ModelShape:
    init = lora_init_from_peft(lora.init_lora_weights)
    lora = shape_config(lora)
    model = _meta_peft_model(config, lora, dtype, attn_implementation, adapters_in_compute_dtype)
    if not train_lora_a:
        for name, param in model.named_parameters():
            param.requires_grad_(param.requires_grad and ".lora_A." not in name)
    frozen = [(name, p) for name, p in model.named_parameters() if not p.requires_grad]
    weight_bytes = sum(_stored_bytes(name, p, dtype, quantization) for name, p in frozen)
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    text = config.get_text_config()
    hidden = text.hidden_size
    heads = text.num_attention_heads
    return ModelShape(
        frozen_params=sum(p.numel() for _, p in frozen),
        trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
        frozen_weight_bytes=weight_bytes,
        largest_module_bytes=largest * dtype.itemsize,
        hidden_size=hidden,
        vocab_size=config.get_text_config().vocab_size,
        num_layers=config.get_text_config().num_hidden_layers,
        seq_len=seq_len,
        layer_input_bytes=seq_len * hidden * dtype.itemsize,
        init_pass_bytes=_covariance_bytes(model) if init.data_pass is DataPass.CORDA else 0,
        attention_heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or hidden // heads,
        **_saved_fields(config, lora, dtype, seq_len, attn_implementation, adapters_in_compute_dtype, on_accelerator),
    )


def _saved_fields(
    config: PretrainedConfig,
    lora: LoraConfig,
    dtype: torch.dtype,
    seq_len: int,
    attn_implementation: str | None,
    adapters_in_compute_dtype: bool,
    on_accelerator: bool,
) -> dict[str, int]:
    """``ModelShape``'s counts of what the forward saves, from a one-layer and a two-layer copy of the decoder."""
    # Trainer autocasts a 16-bit run (bf16/fp16 follow --dtype); under DeepSpeed it does not.
    autocast = dtype.itemsize == 2 and not adapters_in_compute_dtype
    ops = RunDeviceOps(dtype if autocast else None, fused_dropout=on_accelerator)

    def saved(measured: PretrainedConfig, layers: int) -> tuple[int, int]:
        return _saved_activation_bytes(
            measured, lora, dtype, attn_implementation, seq_len, layers, adapters_in_compute_dtype, ops
        )

    one, largest_saved = saved(config, 1)
    further, largest_further = _further_layer_bytes(config, lambda second: saved(second, 2)[0] - one)
    return {
        "first_layer_activation_bytes": one,
        "layer_activation_bytes": further,
        "recomputed_layer_bytes": largest_further,
        "backward_working_bytes": _backward_working_bytes(config, seq_len, largest_saved, attn_implementation),
    }


def _covariance_bytes(model: torch.nn.Module) -> int:
    """CorDA's pass keeps an fp32 in x in covariance of the inputs of every adapted layer at once, on every rank
    (PEFT's own note: about twice a 16-bit model)."""
    return sum(4 * module.in_features**2 for module in model.modules() if isinstance(module, LoraLayer))


def _backward_working_bytes(config: PretrainedConfig, seq_len: int, largest_saved: int, attn: str | None) -> int:
    """A layer's backward holds about three tensors the size of the largest one it saved at once (the incoming
    gradient, a temporary, the outgoing gradient). Eager attention holds more: its fp32 score matrices (matmul
    output, scaled, masked, softmax, and their gradients) measured ~8 of them at the peak on the CPU (8-layer model,
    1,129-token samples, with and without gradient checkpointing: bench/memory_plan.py's "activations" shape)."""
    working = 3 * largest_saved
    if attn == "eager":
        text = config.get_text_config()
        working = max(working, 8 * text.num_attention_heads * seq_len * seq_len * 4)
    return working


def _meta_peft_model(
    config: PretrainedConfig, lora: LoraConfig, dtype: torch.dtype, attn: str | None, adapters_in_compute_dtype: bool
):
    # set_zero3_state: from_config would otherwise wrap the build in deepspeed.zero.Init when a ZeRO-3 run is
    # configured (run_sft plans after its arguments exist), and zero.Init cannot partition meta tensors.
    _register_planned_experts()
    with set_zero3_state(), torch.device("meta"):
        model = auto_model_class(config).from_config(
            config, dtype=dtype, attn_implementation=meta_attention(attn), experts_implementation=_GROUPED
        )
    model = wrap_with_lora(model, copy.deepcopy(lora))
    if adapters_in_compute_dtype:
        for param in model.parameters():
            if param.requires_grad:
                param.data = param.data.to(dtype)
    return model


def _stored_bytes(name: str, param: torch.Tensor, dtype: torch.dtype, quantization: str | None) -> int:
    """bitsandbytes packs the decoder's linear weights: NF4/FP4 at 4 bits plus one absmax per 64 weights (double
    quantization stores those in 8 bits: ~0.52 byte/weight in all), LLM.int8 at 1 byte plus a scale per row. The
    rest (embeddings, norms, the head) is cast to fp32 by ``peft.prepare_model_for_kbit_training``."""
    if quantization is None:
        return param.numel() * dtype.itemsize
    if name.endswith(".weight") and param.dim() == 2 and ".layers." in name and "lora_" not in name:
        per_weight = 0.5 + 1 / 64 if quantization == "4bit" else 1.0
        return int(param.numel() * per_weight) + param.shape[0] * 4
    return param.numel() * 4


def _decoder_copy(config: PretrainedConfig, layers: int) -> PretrainedConfig:
    """The first ``layers`` decoder layers. A MoE model's dense first layers (DeepSeek-V3 has 3 of 61) are kept to one,
    so that the second layer, the one counted for each further layer, is a MoE layer as most are."""
    small = copy.deepcopy(config)
    text = small.get_text_config()
    text.num_hidden_layers = layers
    for key in ("layer_types", "layers_block_type", "mlp_only_layers"):
        if isinstance(getattr(text, key, None), list) and _stored(text, key):
            setattr(text, key, getattr(text, key)[:layers])
    for key in ("first_k_dense_replace", "num_dense_layers"):
        if isinstance(getattr(text, key, None), int):
            setattr(text, key, min(getattr(text, key), 1))
    return small


def _layer_pattern(config: PretrainedConfig) -> tuple[str, list] | None:
    """The text config's own list of layer kinds and its key (``layer_types``, Nemotron-H's ``layers_block_type``);
    None where there is none or it is computed from other fields (Jamba, Bamba)."""
    text = config.get_text_config()
    for key in ("layer_types", "layers_block_type"):
        if isinstance(getattr(text, key, None), list) and _stored(text, key):
            return key, getattr(text, key)
    return None


def _further_layer_bytes(config: PretrainedConfig, measure: Callable[[PretrainedConfig], int]) -> tuple[int, int]:
    """What each layer after the first saves on average, and the most one saves: ``measure`` (the second layer of a
    copy) once per kind in the model's own layer pattern, a hybrid's attention, linear-attention, Mamba and MLP-only
    layers each as what it is. One kind, or a computed pattern (Jamba, Bamba): the copy's second layer for all."""
    found = _layer_pattern(config)
    if found is None or len(set(found[1][1:])) < 2:
        saved = measure(config)
        return saved, saved
    key, pattern = found
    by_kind = {}
    for kind in set(pattern[1:]):
        second = copy.deepcopy(config)
        setattr(second.get_text_config(), key, [pattern[0], kind, *pattern[2:]])
        by_kind[kind] = measure(second)
    further = [by_kind[kind] for kind in pattern[1:]]
    return round(sum(further) / len(further)), max(further)


def _stored(config: PretrainedConfig, key: str) -> bool:
    """Whether ``key`` is a field of its own: Jamba's and Bamba's layer patterns are computed from other fields (a
    property without a setter, reached through ``attribute_map`` too) and follow the layer count by themselves."""
    field = config.attribute_map.get(key, key)
    return not isinstance(getattr(type(config), field, None), property)


def _saved_activation_bytes(
    config: PretrainedConfig,
    lora: LoraConfig,
    dtype: torch.dtype,
    attn: str | None,
    seq_len: int,
    layers: int,
    adapters_in_compute_dtype: bool,
    ops: RunDeviceOps,
) -> tuple[int, int]:
    """Bytes autograd keeps for backward over a training forward of the decoder (no LM head: the logits are a term
    of their own), one sample of ``seq_len`` tokens, and the largest tensor among them. Views of one storage count
    once; parameters not at all."""
    model = _meta_peft_model(_decoder_copy(config, layers), lora, dtype, attn, adapters_in_compute_dtype)
    model.train()
    _lora_stacks_as_shapes(model)
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    storages: dict[int, int] = {}
    # Held until counted: a branch autograd drops mid-forward (DeepSeek's group routing) frees its storages, whose
    # addresses the next ones would take, and the count would depend on the allocator.
    held: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in params:
            storages[storage._cdata] = storage.nbytes()
            held.append(tensor)
        return tensor

    decoder = model.get_base_model().get_decoder()
    input_ids = torch.zeros(1, seq_len, dtype=torch.long, device="meta")
    # A ready 4-D mask: transformers would otherwise inspect the (meta) positions for packed sequences.
    causal_mask = torch.zeros(1, 1, seq_len, seq_len, dtype=dtype, device="meta")
    uncast = uncast_in_training(model, autocasts=ops.autocast_dtype is not None, on_accelerator=ops.fused_dropout)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), ops, inputs_as_they_come(uncast):
        decoder(input_ids=input_ids, attention_mask=causal_mask, use_cache=False)
    return sum(storages.values()), max(storages.values(), default=0)


class _GroupedMatmul(torch.autograd.Function):
    """Shapes only: a grouped GEMM of the routed tokens with the expert stack, saving both for backward."""

    @staticmethod
    def forward(ctx, tokens: torch.Tensor, stack: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(tokens, stack)
        return tokens.new_empty(tokens.shape[0], stack.shape[-1])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # never run: the planner's forward is on the meta device
        raise NotImplementedError


def _planned_experts_forward(experts, hidden_states, top_k_index, top_k_weights):
    """transformers' grouped_mm experts forward in shapes (``integrations.moe.grouped_mm_experts_forward``)."""
    top_k = top_k_index.shape[-1]
    routed = hidden_states.repeat_interleave(top_k, dim=0)  # (tokens x top_k, hidden): one row per route
    first = "gate_up_proj" if experts.has_gate else "up_proj"
    out = _GroupedMatmul.apply(routed, _oriented(experts, first))
    if experts.has_bias:
        out = out + getattr(experts, f"{first}_bias")[top_k_index.reshape(-1)]
    out = experts._apply_gate(out) if experts.has_gate else experts.act_fn(out)
    out = _GroupedMatmul.apply(out, _oriented(experts, "down_proj"))
    if experts.has_bias:
        out = out + experts.down_proj_bias[top_k_index.reshape(-1)]
    if experts.has_post_expert_norm:
        out = experts.post_expert_norm(out)
    out = out * top_k_weights.reshape(-1, 1)
    return out.view(hidden_states.shape[0], top_k, -1).sum(dim=1).to(hidden_states.dtype)


def _oriented(experts: torch.nn.Module, name: str) -> torch.Tensor:
    """The stack as (experts, in, out). Adapted by LoRA, it is W + BA: a new tensor of the stack's size."""
    stack = getattr(experts, name)
    if name in getattr(experts, _LORA_STACKS, ()):
        stack = stack.new_empty(stack.shape)
    return stack if experts.is_transposed else stack.transpose(-2, -1)


def _lora_stacks_as_shapes(model: torch.nn.Module) -> None:
    """PEFT's ParamWrappers off for the meta forward (their fold, and the check of the parametrization they register,
    need a real device), each experts module told which of its stacks they adapt; a Linear adapted through its weight
    (lora_targets: a shared expert PEFT's rewrite would take) saves what its x (W + BA)^T would."""
    for wrapper in model.modules():
        if isinstance(wrapper, ParamWrapper):
            wrapper._disable_adapters = True
            base = wrapper.get_base_layer()
            setattr(base, _LORA_STACKS, {*getattr(base, _LORA_STACKS, ()), wrapper.parameter_name})
            if isinstance(base, torch.nn.Linear):
                base.register_forward_hook(lambda linear, args, out: _FoldedLinear.apply(out, args[0], linear.weight))


class _FoldedLinear(torch.autograd.Function):
    """Shapes only: x (W + BA)^T keeps its input and the folded weight W + BA, a new tensor of W's size."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(inputs, weight.new_empty(weight.shape))
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # never run: the planner's forward is on the meta device
        raise NotImplementedError


@cache
def _register_planned_experts() -> None:
    ExpertsInterface.register(_GROUPED, _planned_experts_forward)
