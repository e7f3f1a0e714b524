"""The supervised-position loss must equal transformers' full-logits loss: value and every LoRA gradient, on padded and
padding-free multi-turn batches, under gradient accumulation, and in evaluation."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from peft import LoraConfig
from transformers import Qwen2ForCausalLM
from transformers.modeling_utils import slice_logits_to_keep  # noqa: F401 (accepts_position_mask looks it up here)

from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.data.batches.collator import (
    SUPERVISED_POSITIONS,
    SupervisedPositionsCollator,
    build_collator,
    shifted_labels,
    supervised_positions,
)
from hf_lora_ds.data.batches.packing import PackedDataset
from hf_lora_ds.data.dataset import IGNORE_INDEX, ChatSFTDataset
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer
from hf_lora_ds.training import fused_head_loss
from hf_lora_ds.training.loss_head import full_logits_reason
from hf_lora_ds.training.supervised_logits import accepts_position_mask, supervised_cross_entropy

TURNS = [
    "Hello",
    "Tell me a joke about cats.",
    "What is the capital of France?",
    "Bonjour!",
    "Paris is.",
    "The quick brown fox jumps over the lazy dog.",
    "good morning",
    "how can I help you today?",
]


def conversation(i: int) -> dict:
    """1-3 turn chats of varied lengths: supervised counts differ from sample to sample."""
    messages = []
    for turn in range(1 + i % 3):
        messages += [
            {"role": "user", "content": TURNS[(i + turn) % len(TURNS)]},
            {"role": "assistant", "content": " ".join(TURNS[(i * 3 + turn) % len(TURNS)] for _ in range(1 + i % 4))},
        ]
    return {"messages": messages}


RECORDS = [conversation(i) for i in range(16)]
# Random A and B (B is zero at PEFT's default init, which would leave every lora_A gradient zero and unchecked).
LORA = LoraConfig(
    r=4, lora_alpha=8, target_modules="all-linear", lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM"
)


@pytest.fixture
def dataset(qwen_style_tokenizer, tmp_path):
    return ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path)


def make_trainer(model, tokenizer, dataset, tmp_path, supervised: bool, batching: str = "padded", **overrides):
    options = dict(
        output_dir=str(tmp_path / f"out-{supervised}"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        supervised_logits_only=supervised,
        use_cache=False,
        seed=0,
    )
    options.update(overrides)
    torch.manual_seed(0)  # the same random LoRA weights in every trainer
    return LoraSFTTrainer(
        copy.deepcopy(model),
        SFTTrainingArguments(**options),
        train_dataset=dataset,
        eval_dataset=dataset,
        data_collator=build_collator(batching, tokenizer),
        processing_class=tokenizer,
        lora_config=LORA,
    )


def loss_and_lora_grads(trainer, batches):
    """compute_loss over ``batches`` as one accumulated step, as Trainer's training loop calls it."""
    model = trainer.model
    model.train()
    model.zero_grad()
    batches = [trainer._prepare_inputs(dict(batch)) for batch in batches]  # onto the model's device
    num_items = trainer._get_num_items_in_batch(batches, trainer.args.device) if len(batches) > 1 else None
    total = 0.0
    for batch in batches:
        loss = trainer.compute_loss(model, batch, num_items_in_batch=num_items)
        loss.backward()
        total += loss.detach()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return total, grads


class FusedCalls:
    """Counts the fused head-and-loss calls and the chunks of rows each one splits its supervised rows into."""

    def __init__(self, monkeypatch, budget=None):
        self.chunks = []
        if budget is not None:  # a small budget: many chunks per call
            monkeypatch.setattr(fused_head_loss, "CHUNK_BYTES", budget)
        apply = fused_head_loss.FusedHeadLoss.apply

        def counted(hidden, weight, targets, rows):
            self.chunks.append(-(-hidden.shape[0] // rows))
            return apply(hidden, weight, targets, rows)

        monkeypatch.setattr(fused_head_loss.FusedHeadLoss, "apply", counted)


def assert_same_loss_and_grads(
    tiny64, tokenizer, dataset, tmp_path, batching, micro_batches, tolerance=(1e-5, 1e-7), fused=True, **overrides
):
    collate = build_collator(batching, tokenizer)
    samples = list(dataset)
    batches = [collate(samples[i : i + 4]) for i in range(0, 4 * micro_batches, 4)]
    supervised = make_trainer(tiny64, tokenizer, dataset, tmp_path, True, batching, **overrides)
    full = make_trainer(tiny64, tokenizer, dataset, tmp_path, False, batching, **overrides)
    assert supervised.supervised_logits_only and not full.supervised_logits_only
    supervised._fused_head_loss = fused
    loss, grads = loss_and_lora_grads(supervised, batches)
    expected_loss, expected_grads = loss_and_lora_grads(full, batches)
    torch.testing.assert_close(loss, expected_loss, rtol=tolerance[0] / 10, atol=1e-6)
    assert grads.keys() == expected_grads.keys() and any("lora_A" in name for name in grads)
    rtol, atol = tolerance
    for name, grad in grads.items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(grad, expected_grads[name], rtol=rtol, atol=atol, msg=name)


@pytest.fixture
def tiny64(qwen_style_tokenizer):
    return build_tiny_qwen2(qwen_style_tokenizer, hidden_size=64, num_hidden_layers=2)


@pytest.mark.parametrize("batching", ["padded", "padding_free"])
def test_loss_and_every_lora_gradient_equal_full_logits(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, batching, monkeypatch
):
    """The fused head-and-loss (the default), with a budget of 8 rows per chunk (fp32: 16 bytes a logit)."""
    calls = FusedCalls(monkeypatch, budget=128 * len(qwen_style_tokenizer))
    assert_same_loss_and_grads(tiny64, qwen_style_tokenizer, dataset, tmp_path, batching, micro_batches=1)
    assert len(calls.chunks) == 1 and calls.chunks[0] > 3


@pytest.mark.parametrize("batching", ["padded", "padding_free"])
def test_accumulated_loss_and_gradients_equal_full_logits(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, batching, monkeypatch
):
    """Three micro-batches with different supervised counts, normalised by num_items_in_batch of all three."""
    calls = FusedCalls(monkeypatch, budget=128 * len(qwen_style_tokenizer))
    assert_same_loss_and_grads(tiny64, qwen_style_tokenizer, dataset, tmp_path, batching, micro_batches=3)
    assert len(calls.chunks) == 3 and min(calls.chunks) > 3


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_logits_path_still_equals_full_logits(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, micro_batches, monkeypatch
):
    """The supervised-position logits path, kept for heads the fused loss cannot stand in for."""
    calls = FusedCalls(monkeypatch)
    assert_same_loss_and_grads(
        tiny64, qwen_style_tokenizer, dataset, tmp_path, "padding_free", micro_batches, fused=False
    )
    assert calls.chunks == []


def test_training_with_accumulation_and_eval_matches_full_logits(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    """Trainer's own loop: logged train losses, eval losses during training and the trained adapter all equal."""
    runs = {}
    for supervised in (True, False):
        trainer = make_trainer(
            tiny64,
            qwen_style_tokenizer,
            dataset,
            tmp_path,
            supervised,
            max_steps=3,
            gradient_accumulation_steps=2,
            per_device_train_batch_size=3,
            eval_strategy="steps",
            eval_steps=1,
            per_device_eval_batch_size=5,
        )
        trainer.train()
        history = trainer.state.log_history
        runs[supervised] = (
            [e["loss"] for e in history if "loss" in e],
            [e["eval_loss"] for e in history if "eval_loss" in e],
            {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad},
        )
    (losses, eval_losses, weights), (full_losses, full_eval_losses, full_weights) = runs[True], runs[False]
    assert len(losses) == len(eval_losses) == 3
    assert losses == pytest.approx(full_losses, rel=1e-6)
    assert eval_losses == pytest.approx(full_eval_losses, rel=1e-6)
    # Adam moves each weight by ~lr (5e-2) a step whatever its gradient's size, so gradients that agree to rounding
    # (checked at 1e-5 above) can still differ by 1e-5..1e-4 in weights whose gradient is near zero.
    for name, tensor in weights.items():
        torch.testing.assert_close(tensor, full_weights[name], rtol=1e-5, atol=1e-4, msg=name)


def test_evaluation_with_metrics_gets_full_logits(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    """compute_metrics reads (batch, seq, vocab) logits: those evaluations must not take the supervised path."""
    shapes = []

    def metrics(prediction):
        shapes.append(prediction.predictions.shape)
        return {}

    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True, per_device_eval_batch_size=16)
    trainer.compute_metrics = metrics
    loss_with_logits = trainer.evaluate()["eval_loss"]
    assert len(shapes) == 1 and shapes[0][0] == len(dataset) and shapes[0][2] == len(qwen_style_tokenizer)
    trainer.args.prediction_loss_only = True
    assert trainer.evaluate()["eval_loss"] == pytest.approx(loss_with_logits, rel=1e-6)


def test_outputs_hold_the_loss_or_the_supervised_rows(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    batch = build_collator("padded", qwen_style_tokenizer)(list(dataset)[:4])
    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True)
    loss, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
    assert outputs.logits is None and outputs.loss is loss  # fused: no logits at all
    trainer._fused_head_loss = False
    loss, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
    supervised = int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())
    assert outputs.logits.shape == (supervised, len(qwen_style_tokenizer)) and outputs.loss is loss


class ScaledLogitsLM(Qwen2ForCausalLM):
    """A causal LM that changes its head's output after its own loss (as soft-capping or logit scaling models do
    before theirs)."""

    def forward(self, input_ids=None, logits_to_keep=0, **kwargs):
        outputs = super().forward(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
        outputs.logits = outputs.logits * 2.0
        return outputs


def test_models_that_change_the_head_output_take_the_logits_path(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, package_log
):
    model = ScaledLogitsLM(tiny64.config)
    model.load_state_dict(tiny64.state_dict())
    batch = build_collator("padded", qwen_style_tokenizer)(list(dataset)[:4])
    trainer = make_trainer(model, qwen_style_tokenizer, dataset, tmp_path, True)
    full = make_trainer(model, qwen_style_tokenizer, dataset, tmp_path, False)
    for _ in range(2):  # the line once, the logits path from then on
        loss, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
        assert outputs.logits is not None and not trainer._fused_head_loss
    notice = [line for line in package_log.read().splitlines() if "fused LM head loss" in line]
    assert notice == [
        "fused LM head loss: off, ScaledLogitsLM.forward changes the head's output; the loss uses "
        "supervised-position logits"
    ]
    logits = full.model(**{key: value for key, value in batch.items() if key != "labels"}).logits  # scaled
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten())
    torch.testing.assert_close(loss, expected)


class NoPositionMaskLM(Qwen2ForCausalLM):
    """A causal LM whose forward has no ``logits_to_keep`` (some remote-code models; transformers releases before
    boolean masks could not take one either): its head sees every position."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, labels=None, **kwargs):
        return super().forward(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, labels=labels, **kwargs
        )


@pytest.mark.parametrize("fused", [True, False], ids=["fused-head", "logits"])
def test_models_without_a_position_mask_still_train_on_supervised_positions(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, fused, monkeypatch
):
    """The fused head selects the supervised rows itself (the first GPU run's transformers 5.17 fell back to full
    logits: 1.8x TRL's peak memory); without the fused head, the loss reads the supervised rows of full logits."""
    assert accepts_position_mask(tiny64)
    model = NoPositionMaskLM(tiny64.config)
    model.load_state_dict(tiny64.state_dict())
    assert not accepts_position_mask(model)
    calls = FusedCalls(monkeypatch)
    assert_same_loss_and_grads(model, qwen_style_tokenizer, dataset, tmp_path, "padded", micro_batches=2, fused=fused)
    assert bool(calls.chunks) is fused


def test_models_without_a_position_mask_or_a_plain_head_fall_back_with_one_line(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, package_log
):
    model = NoPositionMaskLM(tiny64.config)
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    trainer = make_trainer(model, qwen_style_tokenizer, dataset, tmp_path, True, max_steps=1)
    notice = [line for line in package_log.read().splitlines() if "supervised-position logits" in line]
    assert notice == [
        "supervised-position logits: off, NoPositionMaskLM.forward takes no boolean logits_to_keep mask "
        "and its LM head is not a plain bias-free nn.Linear; the loss uses full logits"
    ]
    assert not trainer.supervised_logits_only
    trainer.train()  # the standard path trains


def test_chunked_cross_entropy_equals_one_chunk():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 11, generator=generator, requires_grad=True)
    targets = torch.randint(0, 11, (37,), generator=generator)
    whole = supervised_cross_entropy(logits, targets)
    (whole_grad,) = torch.autograd.grad(whole, logits)
    chunked = supervised_cross_entropy(logits, targets, chunk_elements=11 * 5)  # 8 chunks, the last short
    (chunked_grad,) = torch.autograd.grad(chunked, logits)
    expected = torch.nn.functional.cross_entropy(logits, targets, reduction="sum")
    torch.testing.assert_close(whole, expected)
    torch.testing.assert_close(chunked, expected)
    torch.testing.assert_close(chunked_grad, whole_grad)


def test_throughput_still_counts_supervised_tokens(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    """The model gets logits_to_keep instead of labels: the trainer's ThroughputCallback must count the same
    supervised tokens."""
    trainer = make_trainer(
        tiny64,
        qwen_style_tokenizer,
        dataset,
        tmp_path,
        True,
        max_steps=-1,
        num_train_epochs=1,
        run_callbacks="throughput",
    )
    trainer.train()
    logged = [
        entry["throughput/run_supervised_tokens"]
        for entry in trainer.state.log_history
        if "throughput/run_supervised_tokens" in entry
    ]
    assert logged == [sum(sum(label != IGNORE_INDEX for label in sample["labels"]) for sample in dataset)]


def test_liger_fused_cross_entropy_takes_precedence(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    """Liger's fused linear cross-entropy (its default) never builds full logits either, and it replaces the forward:
    the trainer leaves the loss to it. With that kernel switched off, the supervised path applies again."""
    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True)
    trainer.args.use_liger_kernel = True  # set after init: liger-kernel itself is not installed on CPU test machines
    assert "fused linear cross-entropy" in full_logits_reason(trainer)
    trainer.args.liger_kernel_config = {"fused_linear_cross_entropy": False, "rms_norm": True}
    assert full_logits_reason(trainer) is None


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("attention", ["sdpa", "flash_attention_2"])
def test_gpu_padding_free_bf16_matches_full_logits(tiny64, qwen_style_tokenizer, dataset, tmp_path, attention):
    """The GPU default: padding-free batches with flash attention, bf16 weights; bf16 tolerances."""
    if attention == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn is not installed")
    tiny64.set_attn_implementation(attention)
    assert_same_loss_and_grads(
        tiny64.to(torch.bfloat16),
        qwen_style_tokenizer,
        dataset,
        tmp_path,
        "padding_free",
        micro_batches=2,
        tolerance=(2e-2, 1e-4),
        bf16=True,
        dtype="bfloat16",
    )


@pytest.mark.gpu
@needs_cuda
def test_gpu_liger_kernel_trains_with_one_line(tiny64, qwen_style_tokenizer, dataset, tmp_path, package_log):
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel is not installed")
    trainer = make_trainer(
        tiny64.to(torch.bfloat16),
        qwen_style_tokenizer,
        dataset,
        tmp_path,
        True,
        max_steps=2,
        use_liger_kernel=True,
        bf16=True,
        dtype="bfloat16",
    )
    assert not trainer.supervised_logits_only
    assert "supervised-position logits: off, --use_liger_kernel's fused linear cross-entropy" in package_log.read()
    trainer.train()
    assert all(torch.isfinite(torch.tensor(e["loss"])) for e in trainer.state.log_history if "loss" in e)


def batches_with_and_without_positions(dataset, tokenizer, batching, micro_batches):
    """The same micro-batches twice: as the trainer's collator makes them (``SUPERVISED_POSITIONS`` found on the
    host) and as a user's collator would (none: the loss finds them on the device)."""
    plain = build_collator(batching, tokenizer)
    samples = list(dataset if batching != "packed" else PackedDataset(dataset, 256))
    groups = [samples[i : i + 4] for i in range(0, 4 * micro_batches, 4)]
    with_positions = [SupervisedPositionsCollator(plain)(group) for group in groups]
    without = [plain(group) for group in groups]
    assert all(SUPERVISED_POSITIONS in batch for batch in with_positions)
    assert not any(SUPERVISED_POSITIONS in batch for batch in without)
    return with_positions, without


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "logits"])
@pytest.mark.parametrize("batching", ["padded", "padding_free", "packed"])
def test_host_side_positions_give_the_same_loss_and_gradients(
    tiny64, qwen_style_tokenizer, dataset, tmp_path, batching, fused
):
    """Loss and every LoRA gradient with the collator's positions equal those found on the device, over three
    accumulated micro-batches (red: an index off by one, or rows taken in another order, change both)."""
    with_positions, without = batches_with_and_without_positions(dataset, qwen_style_tokenizer, batching, 3)
    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True, batching)
    trainer._fused_head_loss = None if fused else False
    loss, grads = loss_and_lora_grads(trainer, with_positions)
    expected_loss, expected_grads = loss_and_lora_grads(trainer, without)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_shifted_label_shards_take_their_positions_on_the_host(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    """Sequence-parallel shards come without ``labels`` and are sharded after the collator: the trainer indexes each
    shard's ``shift_labels`` while it is on the CPU, and the loss is the one found on the device."""
    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True, "packed")
    _, batches = batches_with_and_without_positions(dataset, qwen_style_tokenizer, "packed", 2)
    shards = [{**batch, "shift_labels": shifted_labels(batch)} for batch in batches]
    for shard in shards:
        del shard["labels"]
    trainer.sequence_parallel = 2  # what _get_num_items_in_batch reads; no process group: the count stays local
    indexed = [dict(shard) for shard in shards]
    trainer._get_num_items_in_batch(indexed, trainer.args.device)
    for shard in indexed:
        assert torch.equal(shard[SUPERVISED_POSITIONS], supervised_positions(shard["shift_labels"]))
    trainer.sequence_parallel = 1  # the loss of each shard alone (sequence_parallel_loss needs a process group)
    loss, grads = loss_and_lora_grads(trainer, indexed)
    expected_loss, expected_grads = loss_and_lora_grads(trainer, shards)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-6, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-7, msg=name)


def test_the_positions_never_reach_the_forward(tiny64, qwen_style_tokenizer, dataset, tmp_path):
    """Training and evaluation (loss only, and with metrics' full logits) with the collator's positions: the model's
    forward never receives the key."""
    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True, eval_strategy="steps", eval_steps=1)
    assert isinstance(trainer.data_collator, SupervisedPositionsCollator)
    seen = []
    trainer.model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(set(kwargs)), with_kwargs=True)
    trainer.train()
    trainer.compute_metrics = lambda prediction: {"rows": float(len(prediction.predictions))}
    trainer.evaluate()  # with metrics: Trainer's own loss from full logits
    assert {"loss_only", "metrics"} <= {"metrics" if "labels" in keys else "loss_only" for keys in seen}
    assert all(SUPERVISED_POSITIONS not in keys for keys in seen)


@pytest.mark.parametrize(
    "overrides",
    [dict(accelerator_config={"split_batches": True}), dict(accelerator_config={"dispatch_batches": True})],
    ids=["split_batches", "dispatch_batches"],
)
def test_batches_sliced_after_the_collator_get_no_positions(tiny64, qwen_style_tokenizer, dataset, tmp_path, overrides):
    trainer = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True, **overrides)
    assert not isinstance(trainer.data_collator, SupervisedPositionsCollator)
    plain = make_trainer(tiny64, qwen_style_tokenizer, dataset, tmp_path, True)
    assert isinstance(plain.data_collator, SupervisedPositionsCollator)
