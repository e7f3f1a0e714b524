from hf_lora_ds.cli.flags import BASE_MODEL_SPELLINGS, respell


def test_old_spellings_become_the_run_spelling_with_one_note_each(capsys):
    argv = ["--model", "a", "--base=b", "--adapter", "--model", "--model_name_or_path", "c"]
    assert respell(argv, BASE_MODEL_SPELLINGS, "cmd") == [
        "--model_name_or_path",
        "a",
        "--model_name_or_path=b",
        "--adapter",
        "--model_name_or_path",
        "--model_name_or_path",
        "c",
    ]
    assert capsys.readouterr().err.splitlines() == [
        "cmd: --model is deprecated; use --model_name_or_path",
        "cmd: --base is deprecated; use --model_name_or_path",
        "cmd: --model is deprecated; use --model_name_or_path",
    ]
