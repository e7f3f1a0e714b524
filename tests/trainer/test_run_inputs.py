"""hf_lora_ds.trainer.run_inputs: LoraSFTTrainer handed a model by its path and raw records, as a script or a
notebook hands them (TRL's SFTTrainer takes the same), tokenizes with exact masks, packs as args.batching says, seeds
before the adapter exists, builds the eval and its accuracy callback, and trains."""

from __future__ import annotations

import datasets
import pytest
import torch

from hf_lora_ds import IGNORE_INDEX, ChatSFTDataset, LoraSFTTrainer, SFTTrainingArguments
from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, build_tiny_hybrid
from hf_lora_ds.callbacks import AnswerAccuracyCallback
from hf_lora_ds.data.batches.packing import PackedDataset
from hf_lora_ds.errors import UserError

RECORDS = [{"instruction": f"{x}=", "output": f"王大丫丫的回答是--->{x - 3} + 3"} for x in range(10, 42)]
EVAL = RECORDS[:4]


def arguments(tmp_path, **overrides) -> SFTTrainingArguments:
    """What a script writes: no model name, no data file (the trainer is handed both)."""
    options = dict(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to="none",
        save_strategy="no",
        dataset_cache_dir=str(tmp_path / "cache"),
    )
    return SFTTrainingArguments(**{**options, **overrides})


def test_a_model_path_and_raw_records_are_packed_and_trained(tiny_model_dir, tmp_path):
    args = arguments(tmp_path, batching="packed", use_cache=False, max_length=64)
    trainer = LoraSFTTrainer(str(tiny_model_dir), args, train_dataset=RECORDS)
    assert isinstance(trainer.train_dataset, PackedDataset)
    packed = trainer.train_dataset.samples
    assert isinstance(packed, ChatSFTDataset) and len(packed) == len(RECORDS)
    # exact masks: the answer and its end-of-turn token trained, the prompt not
    sample = packed[0]
    trained = [token for token, label in zip(sample["input_ids"], sample["labels"]) if label != IGNORE_INDEX]
    text = trainer.processing_class.decode(trained)
    assert text == "王大丫丫的回答是--->7 + 3<|im_end|>", text
    assert args.model_name_or_path == str(tiny_model_dir)  # the run records the model it trained
    trainer.train()
    assert trainer.state.global_step == 2
    assert (tmp_path / "out" / "adapter_model.safetensors").is_file()


def test_the_adapter_starts_the_same_for_the_same_seed(tiny_model_dir, tmp_path):
    """The trainer seeds before it wraps the model (Trainer seeds only after): the adapter's A starts alike."""

    def lora_a(seed: int) -> dict[str, torch.Tensor]:
        trainer = LoraSFTTrainer(str(tiny_model_dir), arguments(tmp_path, seed=seed), train_dataset=RECORDS)
        return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_A" in name}

    torch.manual_seed(1234)  # whatever the caller's generator holds
    first = lora_a(seed=7)
    torch.manual_seed(99)
    again, other = lora_a(seed=7), lora_a(seed=8)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not all(torch.equal(first[name], other[name]) for name in first)


def test_a_datasets_dataset_and_eval_records_give_the_eval_and_its_accuracy(tiny_model_dir, tmp_path):
    args = arguments(tmp_path, eval_strategy="steps", eval_steps=1, eval_task="sum_to_x")
    trainer = LoraSFTTrainer(
        str(tiny_model_dir), args, train_dataset=datasets.Dataset.from_list(RECORDS), eval_dataset=EVAL
    )
    assert [record.data for record in trainer.eval_records] == EVAL
    assert isinstance(trainer.eval_dataset, ChatSFTDataset) and len(trainer.eval_dataset) == len(EVAL)
    assert any(isinstance(cb, AnswerAccuracyCallback) for cb in trainer.callback_handler.callbacks)
    results = trainer.evaluate_answers()
    assert set(results) == {"before", "after"} and results["before"].num_samples == len(EVAL)
    assert (tmp_path / "out" / "eval_report.json").is_file()


def test_the_run_file_flags_are_read_when_no_data_is_handed(tiny_model_dir, tmp_path):
    train = tmp_path / "train.json"
    train.write_text(datasets.Dataset.from_list(RECORDS).to_pandas().to_json(orient="records"), encoding="utf-8")
    trainer = LoraSFTTrainer(str(tiny_model_dir), arguments(tmp_path, train_file=str(train)))
    assert len(trainer.train_dataset) == len(RECORDS)


def test_two_model_names_and_records_without_a_tokenizer_are_one_line_each(tiny_model_dir, tiny_model, tmp_path):
    with pytest.raises(UserError, match="name two models"):
        LoraSFTTrainer(str(tiny_model_dir), arguments(tmp_path, model_name_or_path="other"), train_dataset=RECORDS)
    with pytest.raises(UserError, match="pass processing_class"):
        LoraSFTTrainer(tiny_model, arguments(tmp_path), train_dataset=RECORDS)


@pytest.mark.parametrize("batching", ["packed", "padding_free"])
@pytest.mark.parametrize("family", HYBRID_FAMILIES)
def test_a_hybrid_model_is_refused_packing_before_its_data_is_read(family, batching, qwen_style_tokenizer, tmp_path):
    """Built in code: the one line naming the layers that would let samples leak, before the (missing) training
    file is read (hf_lora_ds.model.packed_boundaries)."""
    model = build_tiny_hybrid(family, qwen_style_tokenizer)
    args = arguments(tmp_path, batching=batching, use_cache=False)
    with pytest.raises(UserError, match=rf"^--batching {batching}: this model's [a-z-]+ layers \(model\.layers\."):
        LoraSFTTrainer(model, args, train_dataset=str(tmp_path / "absent.json"), processing_class=qwen_style_tokenizer)
