"""hf_lora_ds.trainer.answers: the before eval sees the base the run started from (the adapter off), the after eval
the trained model, both reported; no eval records, no eval."""

from __future__ import annotations

from peft.tuners.lora import LoraLayer

from hf_lora_ds import LoraSFTTrainer, SFTTrainingArguments
from hf_lora_ds.trainer import answers

RECORDS = [{"instruction": f"{x}=", "output": f"王大丫丫的回答是--->{x - 3} + 3"} for x in range(10, 26)]


def trainer(model_dir, tmp_path, **eval_data) -> LoraSFTTrainer:
    args = SFTTrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=1, report_to="none", dataset_cache_dir=str(tmp_path / "cache")
    )
    return LoraSFTTrainer(str(model_dir), args, train_dataset=RECORDS, **eval_data)


def test_before_evaluates_with_the_adapter_off_and_after_with_it_on(tiny_model_dir, tmp_path, monkeypatch):
    seen = {}

    def evaluate_phase(model, tokenizer, records, task, args, phase):
        layers = [module for module in model.modules() if isinstance(module, LoraLayer)]
        seen[phase] = {layer.disable_adapters for layer in layers}
        return evaluate(model, tokenizer, records, task, args, phase)

    evaluate = answers.evaluate_phase
    monkeypatch.setattr(answers, "evaluate_phase", evaluate_phase)
    run = trainer(tiny_model_dir, tmp_path, eval_dataset=RECORDS[:3])
    run.train()
    results = run.evaluate_answers()
    assert seen == {"before": {True}, "after": {False}}
    assert [results[phase].num_samples for phase in ("before", "after")] == [3, 3]
    assert (tmp_path / "out" / "eval_report.json").is_file() and (tmp_path / "out" / "report.html").is_file()


def test_without_eval_records_there_is_no_eval(tiny_model_dir, tmp_path):
    run = trainer(tiny_model_dir, tmp_path)
    assert run.evaluate_answers() == {}
    assert not (tmp_path / "out" / "eval_report.json").exists()
