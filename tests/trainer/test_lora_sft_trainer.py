from __future__ import annotations

import copy
import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import DataCollatorWithFlattening, TrainerCallback

from hf_lora_ds.callbacks import MemoryTraceCallback
from hf_lora_ds.config import SFTTrainingArguments
from hf_lora_ds.data.batches.collator import SupervisedPositionsCollator, build_collator
from hf_lora_ds.data.batches.packing import PackedDataset, training_samples
from hf_lora_ds.data.dataset import ChatSFTDataset
from hf_lora_ds.errors import UserError
from hf_lora_ds.trainer.lora_sft_trainer import LoraSFTTrainer

RECORDS = [{"instruction": f"{x}=", "output": f"王大丫丫的回答是--->{x - 3} + 3"} for x in range(10, 42)]


def make_trainer(model, tokenizer, tmp_path, callbacks=(), **overrides):
    options = dict(
        output_dir=str(tmp_path / "out"),
        run_callbacks="all",  # as the command line's runs have them (tests/callbacks: the choice itself)
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        lora_dropout=0.0,
    )
    options.update(overrides)
    args = SFTTrainingArguments(**options)
    dataset = ChatSFTDataset(RECORDS, tokenizer, cache_dir=tmp_path)
    return LoraSFTTrainer(
        model,
        args,
        train_dataset=dataset,
        data_collator=build_collator("padded", tokenizer),
        processing_class=tokenizer,
        callbacks=list(callbacks),
    )


def test_lora_weights_change_and_base_weights_do_not(tiny_model, qwen_style_tokenizer, tmp_path, package_log):
    base_before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path)
    assert isinstance(trainer.model, PeftModel)
    lora_before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert lora_before and all("lora_" in n for n in lora_before)
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert all(not torch.equal(after[n], p) for n, p in lora_before.items() if "lora_B" in n)
    base_after = {
        n.removeprefix("base_model.model.").replace(".base_layer", ""): p
        for n, p in trainer.model.named_parameters()
        if "lora_" not in n
    }
    assert base_after.keys() == base_before.keys()
    for name, tensor in base_after.items():
        torch.testing.assert_close(tensor, base_before[name], rtol=0, atol=0)
    out = package_log.read()
    assert "trainable params:" in out and "mask audit: 32 samples" in out


def test_adapter_and_tokenizer_saved_at_end(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)
    trainer.train()
    saved = {p.name for p in (tmp_path / "out").iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json"} <= saved


def test_gradient_checkpointing_trains_lora(tiny_model, qwen_style_tokenizer, tmp_path):
    for kwargs in ({"use_reentrant": False}, {"use_reentrant": True}):
        trainer = make_trainer(
            tiny_model,
            qwen_style_tokenizer,
            tmp_path,
            max_steps=2,
            activation_checkpointing=True,
            activation_checkpointing_kwargs=kwargs,
        )
        b = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
        trainer.train()
        assert all(not torch.equal(dict(trainer.model.named_parameters())[n], p) for n, p in b.items()), kwargs
        tiny_model = trainer.model.unload()


def test_existing_peft_model_is_not_wrapped_twice(tiny_model, qwen_style_tokenizer, tmp_path):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(tiny_model, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    trainer = make_trainer(peft_model, qwen_style_tokenizer, tmp_path)
    assert trainer.model is peft_model
    assert trainer.model.peft_config["default"].r == 2


def test_save_refuses_an_empty_adapter(tiny_model, qwen_style_tokenizer, tmp_path, monkeypatch):
    """What ZeRO-3 without gathering writes: the right keys with zero-size tensors. The save itself must fail."""
    import pytest
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    from transformers import Trainer

    from hf_lora_ds.model.adapter_check import AdapterIntegrityError

    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path)

    def zero3_without_gather(self, output_dir=None, _internal_call=False):
        self.model.save_pretrained(output_dir)
        state = {k: torch.empty(0) for k in get_peft_model_state_dict(self.model)}
        save_file(state, f"{output_dir}/adapter_model.safetensors")

    monkeypatch.setattr(Trainer, "save_model", zero3_without_gather)
    with pytest.raises(AdapterIntegrityError, match="empty"):
        trainer.save_model(str(tmp_path / "broken"))


def test_resume_auto_takes_the_latest_complete_checkpoint(qwen_style_tokenizer, tmp_path, package_log):
    from hf_lora_ds._testing.tiny_models import build_tiny_qwen2
    from hf_lora_ds.training.checkpoints import COMPLETE_MARKER

    def trainer(max_steps):
        model = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2)
        return make_trainer(
            model, qwen_style_tokenizer, tmp_path, max_steps=max_steps, save_strategy="steps", save_steps=2
        )

    out = tmp_path / "out"
    trainer(4).train(resume_from_checkpoint="auto")  # nothing to resume from: a fresh start, said so
    assert "resume: no complete checkpoint" in package_log.read()
    assert (out / "checkpoint-2" / COMPLETE_MARKER).is_file() and (out / "checkpoint-4" / COMPLETE_MARKER).is_file()

    (out / "checkpoint-4" / COMPLETE_MARKER).unlink()  # as if a kill had landed inside the step-4 save
    resumed, recorder = trainer(6), StepRecorder()
    resumed.add_callback(recorder)
    resumed.train(resume_from_checkpoint=True)  # Trainer's own True would take checkpoint-4
    printed = package_log.read()
    assert f"resume: from {out / 'checkpoint-2'}" in printed and "skipped incomplete checkpoint-4" in printed
    assert recorder.steps == [3, 4, 5, 6] and resumed.state.global_step == 6


class StepRecorder(TrainerCallback):
    """The global step after each optimizer step this run actually took."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.steps.append(state.global_step)


def test_final_save_is_traced_as_a_save_phase(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1)  # save_strategy "no"
    tracer = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, MemoryTraceCallback))
    trainer.train()
    assert [record["phase"] for record in tracer.records] == ["train", "save"]
    assert json.loads((tmp_path / "out" / "memory_trace.json").read_text())[-1]["phase"] == "save"


class _FailAtStep(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs) -> None:
        raise RuntimeError("failed mid-run")


def test_a_failed_run_leaves_no_rss_sampler_running(tiny_model, qwen_style_tokenizer, tmp_path):
    """Trainer never calls on_train_end when training raises; the trainer stops the sampler of the open phases."""
    before = set(threading.enumerate())
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, callbacks=[_FailAtStep()], max_steps=1)
    with pytest.raises(RuntimeError, match="failed mid-run"):
        trainer.train()
    started = [t for t in threading.enumerate() if t not in before and t.name == "hf_lora_ds-rss-sampler"]
    assert started == []


def _freeze_lora_b(trainer) -> None:
    """A frozen adapter: B stays at its initial zero, and A gets zero gradients through it."""
    for name, param in trainer.model.named_parameters():
        if "lora_B" in name:
            param.requires_grad_(False)


def test_an_adapter_that_never_trained_fails_the_run(tiny_model, qwen_style_tokenizer, tmp_path):
    import pytest

    from hf_lora_ds.model.adapter_check import UntrainedAdapterError

    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=2)
    _freeze_lora_b(trainer)
    with pytest.raises(
        UntrainedAdapterError,
        match=r"never trained: all 14 lora_B tensors .* after 2 optimizer steps "
        r"at a learning rate up to 0\.01",
    ):
        trainer.train()
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()  # saved all the same, for a look


def test_steps_at_learning_rate_zero_prove_nothing(tiny_model, qwen_style_tokenizer, tmp_path):
    """The only step of a one-step warmup runs at a learning rate of 0: B cannot move, and that is no error."""
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1, warmup_steps=1)
    _freeze_lora_b(trainer)
    trainer.train()
    assert trainer.state.global_step == 1


def _logits(model, ids) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("init", ["pissa", "olora", "corda", "eva", "orthogonal"])
def test_each_init_saves_an_adapter_that_gives_the_trained_model_on_the_original_base(
    init, tiny_model, qwen_style_tokenizer, tmp_path
):
    """Two steps, then the saved adapter on a copy of the base as it was loaded: the trained model's logits to fp32
    rounding (PiSSA, OLoRA and CorDA rewrote the base the run trained on; the saved adapter is converted)."""
    original = copy.deepcopy(tiny_model)
    trainer = make_trainer(
        tiny_model, qwen_style_tokenizer, tmp_path, max_steps=2, lora_init=init, lora_rank=4, lora_init_samples=16
    )
    trainer.train()
    ids = torch.tensor([qwen_style_tokenizer("12=王大丫丫的回答是--->3 + 9")["input_ids"]])
    trained, base = _logits(trainer.model, ids), _logits(original, ids)
    saved = PeftModel.from_pretrained(original, str(tmp_path / "out"))
    assert (_logits(saved, ids) - trained).abs().max() <= 1e-5 * trained.abs().max()
    with trainer.base_model_view():  # the "before" eval's model: the base as loaded
        assert (_logits(trainer.model, ids) - base).abs().max() <= 1e-5 * base.abs().max()


def test_loraplus_trains_b_at_the_ratio_of_a(tiny_model, qwen_style_tokenizer, tmp_path):
    trainer = make_trainer(
        tiny_model, qwen_style_tokenizer, tmp_path, max_steps=1, lora_optimizer="loraplus", loraplus_lr_ratio=8.0
    )
    trainer.train()
    names = {id(param): name for name, param in trainer.model.named_parameters()}
    rates = {".lora_A.": set(), ".lora_B.": set()}
    for group in trainer.optimizer.param_groups:
        for param in group["params"]:
            rates[next(part for part in rates if part in names[id(param)])].add(group["initial_lr"])
    assert rates == {".lora_A.": {1e-2}, ".lora_B.": {8e-2}}


def test_the_trainer_packs_with_batching_packed(tiny_model, qwen_style_tokenizer, tmp_path, package_log):
    """Built in code, without a collator: ``--batching packed`` gives rows of several samples, each restarting its
    positions, as run_sft's do (hf_lora_ds.training.batches)."""
    args = SFTTrainingArguments(
        output_dir=str(tmp_path / "out"),
        batching="packed",
        max_length=256,
        per_device_train_batch_size=1,
        max_steps=1,
        report_to="none",
        save_strategy="no",
    )
    dataset = ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path)
    trainer = LoraSFTTrainer(tiny_model, args, train_dataset=dataset, processing_class=qwen_style_tokenizer)
    assert isinstance(trainer.train_dataset, PackedDataset) and trainer.train_dataset.samples is dataset
    assert "packed: 32 samples in " in package_log.read()
    batch = next(iter(trainer.get_train_dataloader()))
    starts = int((batch["position_ids"] == 0).sum())
    assert batch["input_ids"].shape[0] == 1 and starts > 1  # one row holding several samples
    trainer.train()


def test_the_trainer_batches_padding_free_without_a_collator(tiny_model, qwen_style_tokenizer, tmp_path):
    args = SFTTrainingArguments(
        output_dir=str(tmp_path / "out"),
        batching="padding_free",
        report_to="none",
    )
    dataset = ChatSFTDataset(RECORDS, qwen_style_tokenizer, cache_dir=tmp_path)
    trainer = LoraSFTTrainer(tiny_model, args, train_dataset=dataset, processing_class=qwen_style_tokenizer)
    collator = trainer.data_collator  # the loss's positions added on the host (data/batches/collator.py)
    assert isinstance(collator, SupervisedPositionsCollator)
    assert isinstance(collator.collator, DataCollatorWithFlattening)
    assert trainer.train_dataset is dataset


@pytest.fixture(scope="module")
def checkpointed_run(tmp_path_factory, qwen_style_tokenizer) -> Path:
    """The output_dir of a finished 4-step run that saved complete checkpoints at steps 2 and 4 (once per module:
    each test copies it, see ``_copy_of``)."""
    from hf_lora_ds._testing.tiny_models import build_tiny_qwen2

    work = tmp_path_factory.mktemp("checkpointed")
    model = build_tiny_qwen2(qwen_style_tokenizer, hidden_size=32, num_hidden_layers=2)
    make_trainer(model, qwen_style_tokenizer, work, max_steps=4, save_strategy="steps", save_steps=2).train()
    return work / "out"


def _copy_of(run: Path, tmp_path: Path) -> Path:
    """The checkpointed run's output_dir, copied to where ``make_trainer`` writes (``tmp_path / "out"``)."""
    return Path(shutil.copytree(run, tmp_path / "out"))


def test_resume_is_resolved_once_when_the_trainer_is_built(
    checkpointed_run, tiny_model, qwen_style_tokenizer, tmp_path, monkeypatch
):
    """--resume_from_checkpoint is resolved before the model loads (hf_lora_ds.trainer.run_inputs); train() takes
    that answer as it is: with checkpoints at steps 2 and 4, "auto" resumes from step 4 and trains steps 5 and 6."""
    from hf_lora_ds.trainer import lora_sft_trainer as trainer_module

    out = _copy_of(checkpointed_run, tmp_path)

    def resolved_again(*_args, **_kwargs):
        raise AssertionError("resume resolved a second time")

    monkeypatch.setattr(trainer_module, "resolve_resume_checkpoint", resolved_again)
    trainer = make_trainer(tiny_model, qwen_style_tokenizer, tmp_path, max_steps=6, resume_from_checkpoint="auto")
    assert trainer.resume.checkpoint == str(out / "checkpoint-4")
    recorder = StepRecorder()
    trainer.add_callback(recorder)
    trainer.train()
    assert recorder.steps == [5, 6] and trainer.state.global_step == 6


def test_a_trainer_built_in_code_resumes_where_its_arguments_say(
    checkpointed_run, tiny_model, qwen_style_tokenizer, tmp_path, package_log
):
    """``SFTTrainingArguments(resume_from_checkpoint=path)`` and a plain ``train()``, as a script writes it: the run
    resumes from that checkpoint (an earlier one than "auto" would take), it does not train from step 1."""
    checkpoint = _copy_of(checkpointed_run, tmp_path) / "checkpoint-2"
    trainer = make_trainer(
        tiny_model, qwen_style_tokenizer, tmp_path, max_steps=4, resume_from_checkpoint=str(checkpoint)
    )
    recorder = StepRecorder()
    trainer.add_callback(recorder)
    trainer.train()
    assert recorder.steps == [3, 4] and trainer.state.global_step == 4
    assert f"resume: from {checkpoint}" in package_log.read()


def test_a_trainer_built_in_code_trains_on_every_dataset_entry_its_arguments_name(
    tiny_model, qwen_style_tokenizer, tmp_path
):
    """``train_file`` a LLaMA-Factory dataset_info.json folder and ``dataset`` two of its entries (--train_file,
    --dataset), no records handed: both entries are trained on, each read with its own columns, and the entry not
    named is not (hf_lora_ds.trainer.run_inputs passes ``args.dataset`` on)."""
    folder = tmp_path / "data"
    folder.mkdir()
    info = {
        "sums": {"file_name": "sums.json"},
        "chat": {"file_name": "chat.json", "columns": {"prompt": "question", "response": "answer"}},
        "left_out": {"file_name": "left_out.json"},
    }
    (folder / "dataset_info.json").write_text(json.dumps(info))
    (folder / "sums.json").write_text(json.dumps(RECORDS[:12]))
    chat = [{"question": f"{x}=", "answer": f"{x - 1} + 1"} for x in range(10, 15)]
    (folder / "chat.json").write_text(json.dumps(chat))
    (folder / "left_out.json").write_text(json.dumps(RECORDS))
    args = SFTTrainingArguments(
        output_dir=str(tmp_path / "out"),
        train_file=str(folder),
        dataset="sums,chat",
        dataset_cache_dir=str(tmp_path / "cache"),
        report_to="none",
    )
    trainer = LoraSFTTrainer(tiny_model, args, processing_class=qwen_style_tokenizer)
    samples = training_samples(trainer.train_dataset)
    assert isinstance(samples, ChatSFTDataset)
    assert samples.source_counts == {"sums": 12, "chat": 5}


def test_a_trainer_built_in_code_stops_before_loading_a_run_that_will_not_fit(tiny_model_dir, tmp_path, monkeypatch):
    """The memory plan's check runs for a trainer built in code too (the model by its name, as run_sft builds it):
    on an accelerator with too little memory for the run, building the trainer stops with the plan's message
    before the model loads (hf_lora_ds.trainer.run_inputs, hf_lora_ds.plan.run_plan.check_run_fits)."""
    from hf_lora_ds.trainer import run_inputs

    args = SFTTrainingArguments(
        output_dir=str(tmp_path / "out"), device_memory="64MiB", report_to="none", dataset_cache_dir=str(tmp_path)
    )
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)  # a simulated GPU: the plan's stop applies
    monkeypatch.setattr(run_inputs, "load_base_model", lambda _args: pytest.fail("loaded a run that will not fit"))
    with pytest.raises(UserError, match="the memory plan says this run will not fit"):
        LoraSFTTrainer(str(tiny_model_dir), args, train_dataset=RECORDS)
