"""Throughput and MFU: exact values on a fake clock, FLOPs per token against torch's own FLOP counter, and where
the peak FLOP/s comes from."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from peft import LoraConfig, get_peft_model
from torch.utils.flop_counter import FlopCounterMode
from transformers import Qwen2Config, Qwen2ForCausalLM

from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, MORE_HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds._testing.tiny_models import build_tiny_moe
from hf_lora_ds.callbacks import ThroughputCallback, throughput
from hf_lora_ds.callbacks.throughput import flops_per_token, flops_shape, matmul_parameters, peak_flops_per_device
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.model.lora import lora_config_from_args, wrap_with_lora
from tests.callbacks.callback_helpers import FakeClock, lora_model

PEAK_FLOPS = 1e9


def _expected_shape(config, rank: int) -> tuple[int, int]:
    """Counted by hand from the Qwen2 config: 7 projections per layer, the tied LM head, r·(in+out) per LoRA pair."""
    h, inter, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    kv = config.num_key_value_heads * (h // config.num_attention_heads)
    shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inter), (h, inter), (inter, h)]
    frozen = layers * sum(i * o for i, o in shapes) + config.vocab_size * h
    trainable = layers * sum(rank * (i + o) for i, o in shapes)
    return frozen, trainable


def test_lora_model_counts_frozen_and_trainable_weights(qwen_style_tokenizer):
    model = lora_model(qwen_style_tokenizer)
    assert matmul_parameters(model) == _expected_shape(model.config, rank=4)


@pytest.mark.parametrize("seq_len", [32, 128])
def test_flops_per_token_matches_torch_flop_counter(seq_len):
    """An independent count: torch's FlopCounterMode over one real forward + backward of a LoRA model (eager
    attention, whose matmuls it sees). The formula leaves out what the first layer's frozen weights skip in backward
    (no input gradient is needed below them), measured at under 3% here; dropping the attention term (-28% at 128
    tokens) or charging the frozen base as trainable (+45%) is far outside 5%."""
    config = Qwen2Config(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = get_peft_model(Qwen2ForCausalLM(config), LoraConfig(r=4, target_modules="all-linear"))
    input_ids = torch.randint(0, config.vocab_size, (2, seq_len))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=input_ids, labels=input_ids).loss.backward()
    counted = counter.get_total_flops() / input_ids.numel()
    assert flops_per_token(flops_shape(model), seq_len) == pytest.approx(counted, rel=0.05)


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    clock = FakeClock(train_s=1.0, eval_s=100.0)
    monkeypatch.setattr(throughput, "time", SimpleNamespace(perf_counter=clock))
    return clock


def _logged(trainer, key):
    return [entry[key] for entry in trainer.state.log_history if key in entry]


def test_rates_efficiency_and_mfu_are_exact_on_a_fake_clock(make_trainer, qwen_style_tokenizer, fake_clock):
    """4 training forwards of exactly 1 s; an evaluation (100 s a forward) and a checkpoint save (100 s) after step 2
    must not count. Every window then lasts exactly 2 s, and each metric has one right value."""
    model = lora_model(qwen_style_tokenizer)
    fake_clock.attach(model)
    trainer = make_trainer(model=model, eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2)
    save = trainer._save_checkpoint

    def slow_save(*args, **kwargs):
        fake_clock.advance(100.0)
        return save(*args, **kwargs)

    trainer._save_checkpoint = slow_save
    callback = ThroughputCallback(peak_flops=PEAK_FLOPS).attach(trainer)
    trainer.train()

    windows = [fake_clock.forwards[:2], fake_clock.forwards[2:]]
    assert len(fake_clock.forwards) == 4
    for name in ("tokens_per_second", "supervised_tokens_per_second", "padding_efficiency", "mfu"):
        assert len(_logged(trainer, f"throughput/{name}")) == 2, name
    for index, window in enumerate(windows):
        real, padded = sum(f["real"] for f in window), sum(f["padded"] for f in window)
        seq_len = padded / sum(f["rows"] for f in window)
        assert _logged(trainer, "throughput/tokens_per_second")[index] == pytest.approx(real / 2.0)
        assert _logged(trainer, "throughput/padding_efficiency")[index] == pytest.approx(real / padded)
        mfu = real / 2.0 * flops_per_token(flops_shape(trainer.model), seq_len) / PEAK_FLOPS
        assert _logged(trainer, "throughput/mfu")[index] == pytest.approx(mfu)

    real, padded = (sum(f[key] for f in fake_clock.forwards) for key in ("real", "padded"))
    supervised = trainer.train_dataset.supervised_tokens()
    assert _logged(trainer, "throughput/run_tokens") == [real]
    assert _logged(trainer, "throughput/run_tokens_per_second") == [pytest.approx(real / 4.0)]
    assert _logged(trainer, "throughput/run_supervised_tokens_per_second") == [pytest.approx(supervised / 4.0)]
    assert _logged(trainer, "throughput/run_padding_efficiency") == [pytest.approx(real / padded)]
    run_mfu = real / 4.0 * flops_per_token(flops_shape(trainer.model), padded / 8) / PEAK_FLOPS
    assert _logged(trainer, "throughput/run_mfu") == [pytest.approx(run_mfu)]
    assert callback.peak_flops_source == "given"


def test_cpu_peak_is_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    flops, source = peak_flops_per_device(torch.device("cpu"), torch.float32)
    assert flops > 1e8  # even a slow shared core does more than 0.1 GFLOP/s
    assert "measured" in source


def test_cpu_peak_is_the_best_measurement_this_machine_ever_made(monkeypatch, tmp_path):
    """A measurement on a busy machine (3.0 after 5.0) does not lower the peak; a better one raises it."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measurements = iter([5.0, 3.0, 7.0])
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda device, dtype: next(measurements))
    peaks = [peak_flops_per_device(torch.device("cpu"), torch.float32) for _ in range(3)]
    assert [flops for flops, _ in peaks] == [5.0, 5.0, 7.0]
    assert str(tmp_path / "hf_lora_ds" / "cpu_peak_flops.json") in peaks[0][1]


def test_an_mfu_above_one_warns_once_naming_the_assumed_peak(qwen_style_tokenizer, caplog):
    callback = ThroughputCallback(peak_flops=1e3)
    callback._shape = throughput.flops_shape(lora_model(qwen_style_tokenizer))
    counts = {"supervised": 10, "real": 100, "padded": 100, "sequences": 1}
    with caplog.at_level("WARNING", logger=throughput.__name__):
        assert callback._rates(counts, 1.0, "")["throughput/mfu"] > 1
        callback._rates(counts, 1.0, "run_")
    warnings = [record.getMessage() for record in caplog.records if "above 1" in record.getMessage()]
    assert len(warnings) == 1 and "assumed peak of 1000 FLOP/s per device (given)" in warnings[0]
    caplog.clear()
    callback = ThroughputCallback(peak_flops=1e30)
    callback._shape = throughput.flops_shape(lora_model(qwen_style_tokenizer))
    with caplog.at_level("WARNING", logger=throughput.__name__):
        assert callback._rates(counts, 1.0, "")["throughput/mfu"] < 1
    assert not caplog.records


@pytest.mark.parametrize(
    ("name", "dtype", "tflops"),
    [
        ("NVIDIA H100 PCIe", torch.bfloat16, 756.0),  # the PCIe card's figure, not the SXM "H100" entry's 989.4
        ("NVIDIA L40S", torch.float16, 362.1),  # not the "L40" entry's 181.0
        ("NVIDIA H100 80GB HBM3", torch.float32, None),  # datasheet figures are for bf16/fp16: measured instead
        ("Some Future GPU", torch.bfloat16, None),
    ],
)
def test_peak_for_gpus_takes_the_most_specific_datasheet_entry_or_measures(monkeypatch, name, dtype, tflops):
    monkeypatch.setattr(throughput.torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(throughput, "measure_matmul_flops", lambda device, dtype: 7.0)
    flops, source = peak_flops_per_device(torch.device("cuda", 0), dtype)
    if tflops is None:
        assert (flops, source) == (7.0, f"measured matmul (cuda, {dtype})")
    else:
        assert flops == tflops * 1e12 and name in source


def test_packed_rows_and_their_sequence_parallel_shards_count_padding_as_padding():
    """A packed batch has no attention mask: its padding is the pad-token sample PackedCollator ends a row with."""
    counter = throughput._TokenCounter()
    counter.pad_token_id = 0
    training = SimpleNamespace(training=True)
    ids, positions = (
        torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]]),
        torch.tensor([[0, 1, 0, 1, 0, 1], [0, 1, 2, 0, 1, 2]]),
    )
    counter(training, (), {"input_ids": ids, "position_ids": positions})
    counts = counter.take(torch.device("cpu"))
    assert (counts["real"], counts["padded"], counts["sequences"]) == (10, 12, 4)
    # The same rows split over 2 sequence-parallel ranks: the second shard of row 0 is part of the padding sample.
    for shard in (slice(0, 3), slice(3, 6)):
        counter(training, (), {"input_ids": ids[:, shard], "position_ids": positions[:, shard]})
    counts = counter.take(torch.device("cpu"))
    assert (counts["real"], counts["padded"], counts["sequences"]) == (10, 12, 4)


def test_a_moe_model_counts_its_active_experts(qwen_style_tokenizer):
    """MFU's N is N_active: a routed expert's weights, and their LoRA factors, count for the 2 of 4 experts a token
    goes through; the rest of the model whole."""
    model = wrap_with_lora(
        build_tiny_moe("qwen3_moe", qwen_style_tokenizer), lora_config_from_args(SFTTrainingArguments.unbuilt())
    )
    every_frozen, every_trainable = matmul_parameters(model, active=False)
    experts = [(p.numel(), p.requires_grad) for n, p in model.named_parameters() if ".experts." in n]
    stacks = sum(numel for numel, trained in experts if not trained)
    adapters = sum(numel for numel, trained in experts if trained)
    assert stacks == 2 * 4 * (32 * 32 + 32 * 16) and adapters == 2 * 4 * 8 * (32 + 32 + 32 + 16)
    assert matmul_parameters(model) == (every_frozen - stacks // 2, every_trainable - adapters // 2)
    callback = ThroughputCallback(peak_flops=PEAK_FLOPS)
    args = SimpleNamespace(device=torch.device("cpu"), eval_on_start=False)
    callback.on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None, model=model)
    assert callback._active_params == (sum(matmul_parameters(model)), every_frozen + every_trainable)


@pytest.mark.parametrize("family", HYBRID_FAMILIES + MORE_HYBRID_FAMILIES)
def test_a_hybrid_model_s_flops_count_each_layer_kind_as_what_it_is(family, qwen_style_tokenizer):
    """Only the attention layers pay the 12·d_attn·T of attention; a linear-attention layer updates its value heads x
    key x value head size state (18 a state element per token), a Mamba layer its inner x state size one (12), a short
    convolution nothing beyond its weights. Read from the config's sizes here, from the modules in the code."""
    model = build_tiny_hybrid(family, qwen_style_tokenizer)
    text = model.config.get_text_config()
    attention_layers = {  # one attention layer in each tiny model, Falcon-H1's in every layer beside its Mamba
        "falcon_h1": text.num_hidden_layers,
    }.get(family, 1)
    states = {
        "qwen3_5_text": lambda: (
            18 * text.linear_num_value_heads * text.linear_key_head_dim * text.linear_value_head_dim
        ),
        "qwen3_next": lambda: 18 * text.linear_num_value_heads * text.linear_key_head_dim * text.linear_value_head_dim,
        "granitemoehybrid": lambda: 12 * text.mamba_n_heads * text.mamba_d_head * text.mamba_d_state,
        "bamba": lambda: 12 * text.mamba_n_heads * text.mamba_d_head * text.mamba_d_state,
        "falcon_h1": lambda: 12 * text.num_hidden_layers * text.mamba_d_ssm * text.mamba_d_state,
        "nemotron_h": lambda: 12 * text.mamba_num_heads * text.mamba_head_dim * text.ssm_state_size,
        "jamba": lambda: 12 * text.mamba_expand * text.hidden_size * text.mamba_d_state,
        "lfm2": lambda: 0,
        # one head size; MiniMax's plain linear attention updates and reads its state (12), Kimi's delta rule (18)
        "minimax": lambda: 12 * text.num_attention_heads * text.head_dim**2,
        "kimi_linear": lambda: 18 * text.linear_num_heads * text.linear_head_dim**2,
    }
    frozen, trainable, layers, attn_dim, recurrent = flops_shape(model)
    assert (layers, attn_dim, recurrent) == (
        attention_layers,
        text.hidden_size,
        states[family](),
    )  # 4 heads of hidden / 4, or of 16
    longer = flops_per_token(flops_shape(model), 64) - flops_per_token(flops_shape(model), 32)
    assert longer == 12 * attention_layers * attn_dim * 32  # the length costs only where attention is
