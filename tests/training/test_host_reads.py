"""The package's own code reads nothing back from the device in a training step that does not log: each such read
makes the host wait for the GPU's queue to drain, and on an H200 that waiting, not FLOPs, set the speed (issue 64).
A logging step reads a small fixed number (the non-finite check's window, the throughput counts); the first step
once compares the fused head's loss with the model's output."""

from __future__ import annotations

import warnings
from collections import Counter

import pytest
import torch
from transformers import TrainerCallback

from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer
from tests.trainer.test_lora_sft_trainer import RECORDS
from tests.training.host_reads import PACKAGE, counting_host_reads

STEPS, LOGGING_STEPS = 6, 3
AT_LOGGING_STEP = 3  # the non-finite check's window, the throughput counts, and at the last step their run totals
ONCE_AT_THE_FIRST_STEP = 1  # the fused head's loss compared with what the model returned


class StepNumber(TrainerCallback):
    """Keeps ``reads.step`` at the optimizer step under way (-1 after training)."""

    def __init__(self, reads) -> None:
        self.reads = reads

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.reads.step = state.global_step + 1

    def on_train_end(self, args, state, control, **kwargs) -> None:
        self.reads.step = -1


def make_trainer(model, tokenizer, tmp_path, batching: str, **overrides) -> LoraSFTTrainer:
    """The command line's run: every run callback, the collator ``batching`` builds, two micro-batches a step."""
    options = dict(
        output_dir=str(tmp_path / "out"),
        run_callbacks="all",
        batching=batching,
        max_steps=STEPS,
        logging_steps=LOGGING_STEPS,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        lora_dropout=0.0,
        max_length=256,
    )
    options.update(overrides)
    return LoraSFTTrainer(model, SFTTrainingArguments(**options), train_dataset=RECORDS, processing_class=tokenizer)


def reads_per_step(trainer: LoraSFTTrainer, everyone: bool = False) -> dict[int, Counter[str]]:
    with counting_host_reads(everyone) as reads:
        trainer.add_callback(StepNumber(reads))
        trainer.train()
    return {step: counts for step, counts in reads.reads.items() if 1 <= step <= STEPS}


def assert_within_budget(reads: dict[int, Counter[str]]) -> None:
    for step in range(1, STEPS + 1):
        counts = reads.get(step, Counter())
        if step % LOGGING_STEPS == 0:
            budget = AT_LOGGING_STEP
        else:
            budget = ONCE_AT_THE_FIRST_STEP if step == 1 else 0
        assert sum(counts.values()) <= budget, f"step {step}: {dict(counts)}"


@pytest.mark.parametrize("batching", ["padded", "padding_free", "packed"])
def test_no_host_read_in_a_step_that_does_not_log(tiny_model, qwen_style_tokenizer, tmp_path, batching):
    """Red with a per-step ``.item()`` in the package's step (e.g. the non-finite check reading every loss), or a
    boolean-mask index of the supervised positions on the device."""
    reads = reads_per_step(make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, batching))
    assert_within_budget(reads)
    assert any(reads.get(step) for step in range(LOGGING_STEPS, STEPS + 1, LOGGING_STEPS))  # the counter counts


@pytest.mark.parametrize("batching", ["padded", "padding_free", "packed"])
def test_in_a_step_that_does_not_log_only_transformers_mask_check_reads(
    tiny_model, qwen_style_tokenizer, tmp_path, batching
):
    """Trainer's and transformers' code counted too. Trainer's NaN filter of the logged loss (two reads a
    micro-batch) is off, the package's non-finite guard covering it. What is left is sdpa's mask preparation in
    transformers' masking_utils: a padded batch's mask read for its causal shortcut, a flattened batch's positions
    for its samples' bounds. ``varlen_attn`` has no mask function there, so it skips both. (accelerate reads its RNG
    states when an epoch starts: CPU tensors, and a small data set starts one every few steps here.)"""
    reads = reads_per_step(make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, batching), everyone=True)
    theirs = ("transformers/masking_utils.py", "accelerate/data_loader.py")
    for step in (2, 4, 5):
        assert reads[step] and all(key.startswith(theirs) for key in reads[step]), reads


def test_a_user_collator_s_batches_are_read_once_a_micro_batch(tiny_model, qwen_style_tokenizer, tmp_path):
    """Without the collator's positions (a trainer whose batches are sliced after it) the loss finds them on the
    device: the counter sees that read, so the budget above is not met by counting nothing."""
    trainer = make_trainer(
        tiny_model, qwen_style_tokenizer, tmp_path, "padded", accelerator_config={"split_batches": True}
    )
    step_two = reads_per_step(trainer)[2]
    assert sum(step_two.values()) == 2 and all(key.endswith(" nonzero") for key in step_two), step_two


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_no_synchronisation_from_the_package_in_a_step_that_does_not_log(
    tiny_model, qwen_style_tokenizer, tmp_path
):
    """On CUDA, torch's own sync detector: every synchronising call warns, and none may come from the package's code
    in a step that does not log (Trainer's and the model's own are theirs)."""
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, "packed", bf16=True)
    syncs: dict[int, list[str]] = {}

    class Detect(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs) -> None:
            self.step = state.global_step + 1

    detect = Detect()
    trainer.add_callback(detect)
    original = warnings.showwarning

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchroniz" in str(message) and filename.startswith(PACKAGE):
            syncs.setdefault(getattr(detect, "step", 0), []).append(f"{filename}:{lineno}")

    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = record
            trainer.train()
    finally:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = original
    per_step = {step: Counter(where) for step, where in syncs.items() if 1 <= step <= STEPS}
    assert_within_budget(per_step)
