from __future__ import annotations

import json

import pytest

from hf_lora_ds.cli.audit import main
from hf_lora_ds.errors import UserError
from tests.data.audit.test_mask_audit import RECORDS, write_records


def test_audit_cli(tiny_model_dir, tmp_path, capsys):
    data = tmp_path / "train.jsonl"
    data.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in RECORDS))
    report = main(["--train_file", str(data), "--model_name_or_path", str(tiny_model_dir)])
    out = capsys.readouterr().out
    assert "samples:                          3" in out and "[[" in out
    assert report.spans == 4


def test_audit_cli_takes_a_mixture_of_sources(tiny_model_dir, tmp_path, capsys):
    import datasets

    a = write_records(tmp_path / "a.jsonl", RECORDS)
    datasets.Dataset.from_list([{"question": "1=", "answer": "0 + 1"}] * 2).save_to_disk(tmp_path / "b_dir")
    main(
        [
            "--train_file",
            f"{a}:3,{tmp_path / 'b_dir'}:2",
            "--model_name_or_path",
            str(tiny_model_dir),
            "--columns",
            "prompt=question,response=answer",
        ]
    )
    out = capsys.readouterr().out
    assert f"data: 5 samples from 2 source(s) ({a}: 3, {tmp_path / 'b_dir'}: 2)" in out
    assert f"--- source {a} ---\nsamples:                          3" in out
    assert f"--- source {tmp_path / 'b_dir'} ---\nsamples:                          2" in out


@pytest.mark.parametrize("flag", ["--output_dir", "--dataset_cache_dir"])
def test_a_file_where_a_directory_is_needed_is_refused_as_run_sft_refuses_it(flag, tiny_model_dir, tmp_path):
    data = write_records(tmp_path / "train.jsonl", RECORDS)
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(UserError, match=f"{flag} {afile}: {afile} is a file, not a directory"):
        main(["--train_file", str(data), "--model_name_or_path", str(tiny_model_dir), flag, str(afile)])


def test_the_audit_says_what_the_lora_variant_does(tiny_model_dir, tmp_path, capsys):
    data = write_records(tmp_path / "train.jsonl", RECORDS)
    main(
        [
            "--train_file",
            str(data),
            "--model_name_or_path",
            str(tiny_model_dir),
            "--lora_init",
            "corda",
            "--lora_init_samples",
            "64",
            "--lora_dropout",
            "0",
            "--lora_optimizer",
            "loraplus",
        ]
    )
    assert (
        "LoRA init corda; a pass over 64 training samples before step 1; adapter converted at the end to plain "
        "LoRA of rank 16 for the original base; LoRA+: B at 16x the learning rate of A"
    ) in capsys.readouterr().out


def test_audit_shows_samples_with_their_trained_spans(tiny_model_dir, tmp_path, capsys):
    """jsonl: stdout is one object a sample; each trained span of its text is exactly an answer and its end of turn,
    located here in the text independently of the labels."""
    from hf_lora_ds.data.records import load_records

    data = write_records(tmp_path / "train.jsonl", RECORDS)
    argv = ["--train_file", data, "--model_name_or_path", str(tiny_model_dir), "--show_samples", "2"]
    main([*argv, "--show_samples_format", "jsonl"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line, record in zip(lines, load_records(data)):
        sample = json.loads(line)
        answer = record.data["output"] + "<|im_end|>"
        start = sample["text"].index("<|im_start|>assistant\n" + answer) + len("<|im_start|>assistant\n")
        assert sample["trained"] == [[start, start + len(answer)]] and sample["where"] == record.where
    main(argv)
    out = capsys.readouterr().out
    assert f"--- sample 1 ({data}, line 2), supervised tokens in [[ ]]:\n" in out and "[[0 + 1<|im_end|>]]" in out


def test_audit_reads_dataset_info_entries_named_by_dataset(tiny_model_dir, tmp_path, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    write_records(folder / "sums.jsonl", [{"q": "1=", "a": "0 + 1", "note": "x"}])
    (folder / "dataset_info.json").write_text(
        json.dumps({"sums": {"file_name": "sums.jsonl", "columns": {"prompt": "q", "response": "a"}}})
    )
    main(["--train_file", str(folder), "--dataset", "sums", "--model_name_or_path", str(tiny_model_dir)])
    assert "data: 1 samples from 1 source(s) (sums: 1); unused fields: note (1 record)" in capsys.readouterr().out


def test_audit_jsonl_shows_the_human_turns_axolotl_flags_trained_once(tiny_model_dir, tmp_path, capsys):
    """axolotl's documented per-message example, through the audit as a script reads it: each human turn flagged
    train: true is one trained span, its content and end of turn."""
    from tests.data.peer_records import JOKE, axolotl_documented_example

    data = write_records(tmp_path / "axolotl.jsonl", [axolotl_documented_example()])
    argv = ["--train_file", data, "--model_name_or_path", str(tiny_model_dir), "--show_samples", "1"]
    main([*argv, "--show_samples_format", "jsonl"])
    shown = json.loads(capsys.readouterr().out.strip())
    spans = [shown["text"][a:b] for a, b in shown["trained"]]
    assert spans == ["Hello<|im_end|>", "How are you?<|im_end|>", " very well", "<|im_end|>", JOKE + "<|im_end|>"] + [
        "Hi there!<|im_end|>"
    ]
