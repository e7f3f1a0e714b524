"""The planner's counts from a config alone equal those of a real model: parameters, bytes, saved activations."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds._testing.tiny_models import MOE_FAMILIES, build_tiny_moe, build_tiny_qwen2
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.errors import MissingPathError, UserError
from hf_lora_ds.model.experts import unwrapped_name
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora
from hf_lora_ds.model.source import load_model_config
from hf_lora_ds.plan.model_shape import _decoder_copy, measure_model_shape
from hf_lora_ds.resources import MODEL_CONFIGS
from hf_lora_ds.training.adapter_inputs import inputs_as_they_come, uncast_lora_layers


def lora(rank: int = 4) -> LoraConfig:
    return LoraConfig(r=rank, lora_alpha=8, lora_dropout=0.1, target_modules="all-linear", task_type="CAUSAL_LM")


def saved_bytes(model: torch.nn.Module, forward: Callable[[], Any]) -> int:
    """What autograd really keeps for backward over ``forward()``, ``model`` training (its parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(storages.values())


def real_saved_bytes(model: torch.nn.Module, seq_len: int, device: str = "cpu") -> int:
    """What autograd really keeps for backward in a training forward of the decoder (parameters excluded)."""
    input_ids = torch.ones(1, seq_len, dtype=torch.long, device=device)
    return saved_bytes(model, lambda: model.get_base_model().get_decoder()(input_ids=input_ids, use_cache=False))


def test_counts_equal_a_real_peft_model(qwen_style_tokenizer):
    real = get_peft_model(build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=3), lora())
    shape = measure_model_shape(real.get_base_model().config, lora(), torch.float32, seq_len=16)
    frozen = [p for p in real.parameters() if not p.requires_grad]
    assert shape.trainable_params == sum(p.numel() for p in real.parameters() if p.requires_grad) > 0
    assert shape.frozen_params == sum(p.numel() for p in frozen)
    assert shape.frozen_weight_bytes == 4 * shape.frozen_params
    assert shape.largest_module_bytes == 4 * real.get_input_embeddings().weight.numel()
    assert (shape.num_layers, shape.hidden_size, shape.vocab_size) == (3, 32, len(qwen_style_tokenizer))


def test_saved_activations_equal_a_real_forward_with_eager_attention(qwen_style_tokenizer):
    """The meta-device count (one layer, two layers) extrapolates exactly to a real 3-layer forward on the CPU."""
    torch.manual_seed(0)
    real = get_peft_model(build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=3), lora())
    real.get_base_model().set_attn_implementation("eager")
    shape = measure_model_shape(
        real.get_base_model().config, lora(), torch.float32, seq_len=24, attn_implementation="eager"
    )
    expected = real_saved_bytes(real, 24)
    backward = shape.backward_working_bytes
    assert shape.activation_bytes(1, gradient_checkpointing=False) == expected + backward
    assert shape.activation_bytes(3, gradient_checkpointing=False) == 3 * (expected + backward)
    assert shape.backward_working_bytes == 8 * 4 * 24 * 24 * 4  # eager: 8 fp32 score matrices of 4 heads


def test_a_16_bit_run_is_counted_as_its_autocast_saves_and_a_deepspeed_one_without(qwen_style_tokenizer):
    """Trainer autocasts a bf16 run: PEFT's fp32 adapters then save a bf16 copy of each input, not an fp32 one (the
    count without autocast over-planned a GPU run's activations by 18%). DeepSpeed casts the adapters and does not
    autocast."""
    torch.manual_seed(0)
    base = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=3).to(torch.bfloat16)
    base.set_attn_implementation("eager")
    real = get_peft_model(base, lora())
    shape = measure_model_shape(base.config, lora(), torch.bfloat16, seq_len=24, attn_implementation="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        autocast = real_saved_bytes(real, 24)
    assert shape.activation_bytes(1, gradient_checkpointing=False) == autocast + shape.backward_working_bytes
    assert autocast < real_saved_bytes(real, 24)  # the fp32 copies autocast does without

    real.to(torch.bfloat16)
    deepspeed = measure_model_shape(
        base.config, lora(), torch.bfloat16, 24, attn_implementation="eager", adapters_in_compute_dtype=True
    )
    assert deepspeed.activation_bytes(1, False) == real_saved_bytes(real, 24) + deepspeed.backward_working_bytes


def test_under_zero3_a_step_keeps_what_the_plan_counts(qwen_style_tokenizer, monkeypatch):
    """ZeRO-3 replaces F.linear with DeepSpeed's own, which keeps every linear layer's input, a frozen one's too (both
    norms' outputs and the MLP's product a layer, 16% of a Qwen2.5-0.5B layer); the run's steps use the same function
    keeping only a trained weight's input (hf_lora_ds.training.zero3_linear), which the DeepSpeed plan counts."""
    from deepspeed.runtime.zero.linear import zero3_linear_wrap

    from hf_lora_ds.training.zero3_linear import lora_zero3_linear

    torch.manual_seed(0)
    base = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=3).to(torch.bfloat16)
    base.set_attn_implementation("eager")
    real = get_peft_model(base, lora()).to(torch.bfloat16)  # DeepSpeed casts the adapters too
    plan = measure_model_shape(base.config, lora(), torch.bfloat16, 24, "eager", adapters_in_compute_dtype=True)
    with monkeypatch.context() as patched:  # after planning: the plan's forward keeps torch's F.linear
        patched.setattr(torch.nn.functional, "linear", lora_zero3_linear)
        step = real_saved_bytes(real, 24)
        patched.setattr(torch.nn.functional, "linear", zero3_linear_wrap)
        deepspeed = real_saved_bytes(real, 24)
    assert plan.activation_bytes(1, gradient_checkpointing=False) == step + plan.backward_working_bytes
    assert deepspeed > step


class NativeDropout(torch.nn.Module):
    """Dropout as ATen runs it for a CUDA input (``native_dropout``, a bool mask), here on the CPU."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.native_dropout(x, self.p, self.training)[0]


def test_a_gpu_run_s_dropout_keeps_a_bool_mask(qwen_style_tokenizer):
    """On a GPU each LoRA dropout keeps a one-byte mask; the CPU's keeps its noise in the fp32 input's dtype, which
    the planner counted for GPU runs too (a third of a Qwen2.5-0.5B layer's saved bytes). A GPU run's training step
    leaves the adapters' inputs in bf16 (hf_lora_ds.training.adapter_inputs)."""
    torch.manual_seed(0)
    base = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=3).to(torch.bfloat16)
    base.set_attn_implementation("eager")
    real = get_peft_model(base, lora())
    for module in real.modules():
        if isinstance(module, LoraLayer):
            module.lora_dropout["default"] = NativeDropout(0.1)
    gpu = measure_model_shape(base.config, lora(), torch.bfloat16, 24, attn_implementation="eager", on_accelerator=True)
    cpu = measure_model_shape(base.config, lora(), torch.bfloat16, 24, attn_implementation="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16), inputs_as_they_come(uncast_lora_layers(real)):
        expected = real_saved_bytes(real, 24)
    assert gpu.activation_bytes(1, gradient_checkpointing=False) == expected + gpu.backward_working_bytes
    assert gpu.activation_bytes(1, False) < cpu.activation_bytes(1, False)


def test_a_gpu_run_without_dropout_keeps_no_copy_of_the_adapted_inputs(qwen_style_tokenizer):
    """Without dropout, PEFT's cast and autocast's cast back keep a second bf16 copy of each adapted input; a GPU
    run's training step leaves the input as it is (hf_lora_ds.training.adapter_inputs), which the base layer keeps
    anyway."""
    torch.manual_seed(0)
    base = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=3).to(torch.bfloat16)
    base.set_attn_implementation("eager")
    no_dropout = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    real = get_peft_model(base, no_dropout)
    gpu = measure_model_shape(
        base.config, no_dropout, torch.bfloat16, 24, attn_implementation="eager", on_accelerator=True
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        peft_cast = real_saved_bytes(real, 24)
        with inputs_as_they_come(uncast_lora_layers(real)):
            uncast = real_saved_bytes(real, 24)
    assert gpu.activation_bytes(1, gradient_checkpointing=False) == uncast + gpu.backward_working_bytes
    assert uncast < peft_cast


def test_gradient_checkpointing_keeps_layer_inputs_and_one_layer():
    config = load_model_config(str(MODEL_CONFIGS / "qwen2.5-0.5b-instruct"))
    shape = measure_model_shape(config, lora(8), torch.bfloat16, seq_len=256)
    without = shape.activation_bytes(1, gradient_checkpointing=False)
    with_gc = shape.activation_bytes(1, gradient_checkpointing=True)
    assert with_gc == 24 * 256 * 896 * 2 + shape.layer_activation_bytes + shape.backward_working_bytes
    assert with_gc < without / 5
    # What sequence parallelism exchanges: 14 query heads, 2 key/value heads (grouped-query attention) of 64
    assert (shape.attention_heads, shape.kv_heads, shape.head_dim) == (14, 2, 64)


def test_eager_attention_keeps_the_scores_fused_does_not():
    config = load_model_config(str(MODEL_CONFIGS / "qwen2.5-0.5b-instruct"))
    fused = measure_model_shape(config, lora(8), torch.bfloat16, seq_len=512, attn_implementation="sdpa")
    eager = measure_model_shape(config, lora(8), torch.bfloat16, seq_len=512, attn_implementation="eager")
    scores = 14 * 512 * 512  # heads x T x T per layer and sample
    assert eager.layer_activation_bytes - fused.layer_activation_bytes >= scores * 4  # fp32 softmax at least


def test_published_qwen_sizes_and_quantized_weights():
    """Qwen2.5-0.5B has 494,032,768 parameters (tied head); 7B 7,615,616,512. 4-bit packs the decoder's linear
    layers to ~0.52 byte each and peft's k-bit preparation keeps the rest (embeddings, head) in fp32."""
    small = measure_model_shape(load_model_config("Qwen/Qwen2.5-0.5B-Instruct"), lora(8), torch.bfloat16, 16)
    assert small.frozen_params == 494_032_768
    config = load_model_config(str(MODEL_CONFIGS / "qwen2.5-7b-instruct"))
    bf16 = measure_model_shape(config, lora(16), torch.bfloat16, 16)
    nf4 = measure_model_shape(config, lora(16), torch.bfloat16, 16, quantization="4bit")
    assert bf16.frozen_params == 7_615_616_512 and bf16.frozen_weight_bytes == 2 * bf16.frozen_params
    embeddings = 2 * 152064 * 3584  # untied input and output embeddings
    linear = bf16.frozen_params - embeddings - 28 * 2 * 3584 - 3584 - 28 * (3584 + 2 * 512)  # norms and biases
    assert nf4.frozen_weight_bytes == pytest.approx(4 * (bf16.frozen_params - linear) + 0.52 * linear, rel=0.01)
    assert nf4.frozen_weight_bytes < 0.6 * bf16.frozen_weight_bytes


def test_bad_model_paths_are_one_line_errors(tmp_path):
    with pytest.raises(MissingPathError, match="no such directory"):
        load_model_config(str(tmp_path / "missing"))
    with pytest.raises(MissingPathError, match="has no config.json"):
        load_model_config(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(UserError, match="no 'model_type'"):
        load_model_config(str(tmp_path / "config.json"))


def test_planning_leaves_torchs_random_state_alone():
    """run_sft seeds, then plans, then builds the LoRA model: a plan that drew from the generator would change the
    adapter's initialisation of the first run in a process only (later ones hit the shape cache)."""
    config = load_model_config(str(MODEL_CONFIGS / "qwen2.5-0.5b-instruct"))
    before = torch.random.get_rng_state()
    measure_model_shape(config, lora(3), torch.float32, seq_len=37)  # settings no other test plans: not cached
    assert torch.equal(torch.random.get_rng_state(), before)


def test_the_lora_variant_is_counted(qwen_style_tokenizer):
    """LoRA-FA trains B only; CorDA's pass holds an fp32 in x in covariance per adapted layer; PiSSA's SVD at wrap
    time is not run on the meta model (its shapes are plain LoRA's)."""
    config = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2).config
    plain = measure_model_shape(config, lora(), torch.float32, 16)
    a_only = sum(4 * size for size in (32, 32, 32, 32, 32, 32, 96)) * 2  # r x in per module, 2 layers
    assert measure_model_shape(config, lora(), torch.float32, 16, train_lora_a=False).trainable_params == (
        plain.trainable_params - a_only
    )
    corda = LoraConfig(**{**lora().to_dict(), "init_lora_weights": "corda", "peft_type": None})
    inputs = (32, 32, 32, 32, 32, 32, 96)  # q, k, v, o, gate, up: hidden; down: intermediate
    assert measure_model_shape(config, corda, torch.float32, 16).init_pass_bytes == 2 * sum(4 * n * n for n in inputs)
    pissa = LoraConfig(**{**lora().to_dict(), "init_lora_weights": "pissa", "peft_type": None})
    assert measure_model_shape(config, pissa, torch.float32, 16).trainable_params == plain.trainable_params
    assert plain.init_pass_bytes == 0


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_counts_every_expert_weight_and_saves_what_a_real_forward_of_the_active_experts_does(
    family, qwen_style_tokenizer
):
    """The planner's meta forward (its stand-in for the grouped GEMM) saves what a real CPU forward of the LoRA'd
    MoE saves: the routed tokens of the active experts, and W + BA of every adapted expert stack; the parameters
    count every expert's weights and adapters. Before, the meta model raised (ParamWrapper's dropout, the meta grouped
    GEMM's bf16 check, PEFT's autocast on meta)."""
    lora = lora_config_from_args(SFTTrainingArguments.unbuilt())  # the demo's: experts adapted, dropout 0.05
    model = build_tiny_moe(family, qwen_style_tokenizer, hidden_size=64)
    model.set_attn_implementation("eager")
    real = wrap_with_lora(model, lora)
    shape = measure_model_shape(model.config, lora, torch.float32, seq_len=24, attn_implementation="eager")
    assert shape.frozen_params == sum(p.numel() for p in real.parameters() if not p.requires_grad)
    assert shape.trainable_params == sum(p.numel() for p in real.parameters() if p.requires_grad)
    planned = shape.first_layer_activation_bytes + shape.layer_activation_bytes  # 2 layers
    assert planned == pytest.approx(real_saved_bytes(real, 24), rel=0.005)
    if family == "qwen3_moe":  # 2 layers x W + BA of gate_up_proj (4 x 64 x 64) and down_proj (4 x 64 x 32), fp32
        none = lora_config_from_args(SFTTrainingArguments.unbuilt(lora_target_experts="none"))
        without = measure_model_shape(model.config, none, torch.float32, seq_len=24, attn_implementation="eager")
        stacks = 2 * (4 * 64 * 64 + 4 * 64 * 32) * 4
        assert planned - (without.first_layer_activation_bytes + without.layer_activation_bytes) == stacks


def test_a_moe_model_s_further_layers_are_counted_as_moe_layers_past_its_dense_first_ones(qwen_style_tokenizer):
    """DeepSeek-V3 has 3 dense layers of 61: the layer counted for each further one is a MoE layer all the same."""
    config = build_tiny_moe("deepseek_v3", qwen_style_tokenizer).config
    lora = lora_config_from_args(SFTTrainingArguments.unbuilt())
    layers = {}
    for dense_first in (1, 2):
        config.first_k_dense_replace = dense_first
        layers[dense_first] = measure_model_shape(config, lora, torch.float32, seq_len=16).layer_activation_bytes
    assert layers[2] == layers[1]


@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_a_hybrid_model_is_measured_and_its_copies_keep_their_layer_pattern(family, qwen_style_tokenizer):
    """Jamba and Bamba compute their layer pattern (a property without a setter, Bamba's reached through
    ``layer_types`` too): the copies set the layer count only, and the pattern follows it."""
    config = build_tiny_hybrid(family, qwen_style_tokenizer).config
    one, two = (_decoder_copy(config, layers).get_text_config() for layers in (1, 2))
    assert (one.num_hidden_layers, two.num_hidden_layers) == (1, 2)
    with torch.device("meta"):
        assert len(AutoModelForCausalLM.from_config(two).model.layers) == 2
    shape = measure_model_shape(
        config, lora_config_from_args(SFTTrainingArguments.unbuilt()), torch.float32, seq_len=16
    )
    assert shape.layer_activation_bytes > 0 and shape.num_layers == config.get_text_config().num_hidden_layers


def test_a_dense_first_layer_s_mlp_adapters_are_counted_under_explicit_targets(
    qwen_style_tokenizer: PreTrainedTokenizerFast,
) -> None:
    """The planner's one-layer copy of DeepSeek-V3 holds only its dense first layer (no MoE block): named targets
    must adapt that layer's MLP there as the whole model has it, not as PEFT's transformers-4 rewrite would (it drops
    gate_proj/up_proj/down_proj). Dropped, the first layer is planned with the attention's adapters only and the
    difference lands on each further layer: a 2-layer total stays right, a 3-layer model's does not."""
    targets = lora_config_from_args(
        SFTTrainingArguments.unbuilt(lora_target_modules="o_proj,gate_proj,up_proj,down_proj")
    )
    config = build_tiny_moe("deepseek_v3", qwen_style_tokenizer, hidden_size=64).config
    config.num_hidden_layers = 3  # a dense layer, then two MoE layers
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    real = wrap_with_lora(model, targets)
    assert {"model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"} <= {
        unwrapped_name(name) for name, module in real.named_modules() if isinstance(module, LoraLayer)
    }
    shape = measure_model_shape(config, targets, torch.float32, seq_len=24, attn_implementation="eager")
    planned = shape.activation_bytes(1, gradient_checkpointing=False) - shape.backward_working_bytes
    assert planned == pytest.approx(real_saved_bytes(real, 24), rel=0.005)
    attention_only = lora_config_from_args(SFTTrainingArguments.unbuilt(lora_target_modules="o_proj"))
    without_mlp = measure_model_shape(config, attention_only, torch.float32, 24, attn_implementation="eager")
    assert shape.first_layer_activation_bytes > without_mlp.first_layer_activation_bytes


# A real forward through Gated DeltaNet's torch path saved one or two 16,384-byte blocks (64 x 64 fp32) more or less by
# what had run before it in the process (a full suite: 32,769 bytes, 1.5%): that family's count is held within 2%
# (three copies of its second layer were 22% over), the others' exactly.
@pytest.mark.parametrize(("family", "within"), [("qwen3_next", 0.02), ("lfm2", 0.001), ("nemotron_h", 0.001)])
def test_a_hybrid_s_further_layers_are_each_counted_as_their_kind(family, within, qwen_style_tokenizer):
    """Four layers in the model's own pattern, the second unlike others (attention first, then linear attention or a
    short convolution, alternating; Nemotron-H: Mamba, attention, MLP, experts): the plan equals a real forward,
    where three copies of the second layer were 22% over (Qwen3-Next) or 5% under (LFM2), and checkpointing
    recomputes the layer that saves most."""
    config = build_tiny_hybrid(family, qwen_style_tokenizer).config
    if family != "nemotron_h":
        second, first = config.layer_types
        config.num_hidden_layers, config.layer_types = 4, [first, second, first, second]
    targets = lora_config_from_args(SFTTrainingArguments.unbuilt())
    torch.manual_seed(0)
    real = wrap_with_lora(AutoModelForCausalLM.from_config(config, attn_implementation="eager"), targets)
    shape = measure_model_shape(config, targets, torch.float32, seq_len=24, attn_implementation="eager")
    planned = shape.activation_bytes(1, gradient_checkpointing=False) - shape.backward_working_bytes
    assert planned == pytest.approx(real_saved_bytes(real, 24), rel=within)
    assert shape.recomputed_layer_bytes > shape.layer_activation_bytes
