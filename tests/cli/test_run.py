"""run_sft.main() end to end on a tiny model, and its refusal of bad input before training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
import yaml
from safetensors.torch import load_file
from transformers import AutoTokenizer

import run_sft
from hf_lora_ds._testing.tiny_models import MOE_FAMILIES, MORE_MOE_FAMILIES, build_tiny_moe
from hf_lora_ds.data.formats import register_format
from hf_lora_ds.data.records import DataError
from hf_lora_ds.errors import UserError
from hf_lora_ds.model import varlen_attention as varlen_module
from hf_lora_ds.model.experts import moe_blocks
from hf_lora_ds.model.varlen_attention import per_sample_sdpa
from hf_lora_ds.resources import DEMO_ARGUMENTS
from hf_lora_ds.trainer import run_inputs


@pytest.fixture
def sum_files(tmp_path):
    def write(name, xs):
        records = [{"instruction": f"{x}=", "input": "", "output": f"王大丫丫的回答是--->{x - 2} + 2"} for x in xs]
        path = tmp_path / name
        path.write_text(json.dumps(records, ensure_ascii=False))
        return str(path)

    return write("train.json", range(10, 42)), write("eval.json", range(50, 56))


def demo_flags(tiny_model_dir, sum_files, out):
    train, evaluation = sum_files
    return [
        "--model_name_or_path",
        str(tiny_model_dir),
        "--train_file",
        train,
        "--eval_file",
        evaluation,
        "--output_dir",
        str(out),
        "--max_steps",
        "3",
        "--per_device_train_batch_size",
        "8",
        "--dataset_cache_dir",
        str(out / "cache"),
    ]


def test_main_trains_evaluates_and_reports(tiny_model_dir, sum_files, tmp_path, capsys):
    out = tmp_path / "run"
    summary = run_sft.main(demo_flags(tiny_model_dir, sum_files, out))
    report = json.loads((out / "eval_report.json").read_text())
    assert set(report) == {"before", "after"}
    assert report == json.loads(json.dumps(summary))
    for phase in ("before", "after"):  # the report's accuracy is the share of predictions judged correct
        predictions = [json.loads(line) for line in (out / f"predictions_{phase}.jsonl").read_text().splitlines()]
        correct = sum(prediction["correct"] for prediction in predictions)
        assert len(predictions) == report[phase]["num_samples"] == 6
        assert (report[phase]["num_correct"], report[phase]["accuracy"]) == (correct, correct / 6)
        assert all(p["correct"] == (p["reason"] is None) for p in predictions)  # a wrong answer says why
    assert {"adapter_model.safetensors", "adapter_config.json", "tokenizer.json", "report.html"} <= {
        p.name for p in out.iterdir()
    }
    printed = capsys.readouterr().out
    assert "mask audit: 32 samples" in printed and "before" in printed and "after" in printed
    coverage = "layers   attention  mlp\n0-1      4/4        3/3\n"
    assert "train-to-inference round trip: 32/32 trained turns" in printed and coverage in printed
    assert coverage in (out / "report.html").read_text()


def test_packed_batching_trains_rows_of_several_samples(tiny_model_dir, sum_files, tmp_path, capsys):
    """``run_sft.py --batching packed``: the trainer gets PackedDataset rows (several samples, one row a batch, so
    no padding at all) and the throughput it logs counts the rows' tokens. The demo's rows, filled >= 0.98, are
    tests/data/batches/test_packing.py's (in process, without a training run)."""
    out = tmp_path / "packed"
    flags = demo_flags(tiny_model_dir, sum_files, out)
    flags[flags.index("--per_device_train_batch_size") + 1] = "1"
    run_sft.main([*flags, "--batching", "packed", "--max_length", "512", "--max_steps", "2", "--eval_file", ""])
    printed = capsys.readouterr().out
    assert "packed: 32 samples in " in printed
    rows = int(printed.split("packed: 32 samples in ")[1].split()[0])
    assert rows <= 32 // 4
    logged = {
        k: v for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] for k, v in entry.items()
    }
    assert logged["throughput/run_padding_efficiency"] == 1.0
    assert logged["throughput/run_tokens"] > 2 * 4 * 50  # two rows of 4+ samples of 50+ tokens


def test_varlen_attention_trains_padding_free_and_evaluates(
    tiny_model_dir, sum_files, tmp_path, capsys, monkeypatch, varlen_attention_cleared
):
    """``--attn_implementation varlen_attn`` end to end on the CPU: auto batching goes padding-free, every training
    forward runs the kernel's per-sample path, the plan and engine lines are printed, and eval by generation (before
    and after) runs under sdpa."""
    calls = []
    monkeypatch.setattr(varlen_module, "per_sample_sdpa", lambda *args: calls.append(1) or per_sample_sdpa(*args))
    out = tmp_path / "varlen"
    flags = demo_flags(tiny_model_dir, sum_files, out)
    summary = run_sft.main([*flags, "--max_steps", "2", "--attn_implementation", varlen_attention_cleared])
    assert summary["before"]["num_samples"] == summary["after"]["num_samples"] == 6
    assert len(calls) == 2 * 2  # two steps of two layers (autograd runs the backward)
    printed = capsys.readouterr().out
    assert "memory plan: " in printed and "engine: plain" in printed
    logged = {
        k: v for entry in json.loads((out / "trainer_state.json").read_text())["log_history"] for k, v in entry.items()
    }
    assert logged["throughput/run_padding_efficiency"] == 1.0 and logged["train_loss"] > 0


def test_config_file_overrides_only_what_it_sets(tiny_model_dir, sum_files, tmp_path):
    out = tmp_path / "cfg"
    train, evaluation = sum_files
    config = {
        "model_name_or_path": str(tiny_model_dir),
        "train_file": train,
        "eval_file": evaluation,
        "output_dir": str(out),
        "max_steps": 3,
        "lora_rank": 4,
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    args = run_sft.parse_args([str(path)])
    assert args.lora_rank == 4 and args.max_steps == 3
    assert args.learning_rate == DEMO_ARGUMENTS["learning_rate"]


def test_bad_record_fails_before_any_model_is_loaded(tiny_model_dir, sum_files, tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "1=", "output": "0 + 1"}\n{"instruction": "2=", "output": ["1", "1"]}\n')
    loaded = []
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: loaded.append(a))
    flags = demo_flags(tiny_model_dir, sum_files, tmp_path / "bad_run")
    flags[flags.index("--train_file") + 1] = str(bad)
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: field 'output' must be a string"):
        run_sft.main(flags)
    flags[flags.index("--train_file") + 1] = sum_files[0]
    flags[flags.index("--eval_file") + 1] = str(bad)
    with pytest.raises(DataError, match=r"bad.jsonl, line 2: field 'output' must be a string"):
        run_sft.main(flags)
    assert loaded == []


@pytest.mark.parametrize(("log_level", "shown"), [("passive", True), ("warning", False)])
def test_the_runs_lines_are_on_stdout_as_log_level_says(tiny_model_dir, sum_files, tmp_path, capsys, log_level, shown):
    """The command shows the package's messages plainly on stdout (hf_lora_ds.cli.log): the lines said before a bad
    eval record stops the run, by default (rank 0 at info), none at ``--log_level warning``."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instruction": "2=", "output": ["1", "1"]}\n')
    flags = demo_flags(tiny_model_dir, sum_files, tmp_path / "run")
    flags[flags.index("--eval_file") + 1] = str(bad)
    with pytest.raises(DataError):
        run_sft.main([*flags, "--log_level", log_level])
    out = capsys.readouterr().out
    lines = [
        line for line in out.splitlines() if line.startswith(("world size 1 ", "data: 32 samples", "memory plan: "))
    ]
    assert len(lines) == (3 if shown else 0), out


def test_a_record_format_registered_before_the_run_reads_its_training_file(
    tiny_model_dir, tmp_path, own_formats, capsys
):
    """As docs/data.md shows it: a script registers its format, then runs run_sft's command line."""

    @register_format(fields=("q", "a"))
    def qa(record, reading):
        q, a = reading.string(record, "q"), reading.string(record, "a")
        return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}

    train = tmp_path / "qa.jsonl"
    train.write_text("".join(json.dumps({"q": f"{x}=", "a": f"{x - 1} + 1", "id": x}) + "\n" for x in range(10, 18)))
    out = tmp_path / "qa_run"
    flags = ["--model_name_or_path", str(tiny_model_dir), "--train_file", str(train), "--eval_file", ""]
    run_sft.main([*flags, "--output_dir", str(out), "--max_steps", "1", "--dataset_cache_dir", str(out / "cache")])
    printed = capsys.readouterr().out
    assert f"data: 8 samples from 1 source(s) ({train}: 8); unused fields: id (8 records)" in printed
    assert "mask audit: 8 samples" in printed
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1


def test_defaults_point_at_the_bundled_demo():
    for key in ("model_name_or_path", "train_file", "eval_file"):
        assert Path(DEMO_ARGUMENTS[key]).exists(), key


def test_mixture_of_sharegpt_and_a_saved_dataset_from_yaml(tiny_model_dir, tmp_path, capsys):
    import datasets

    chat = tmp_path / "chat.jsonl"
    turns = [[{"from": "human", "value": f"{x}="}, {"from": "gpt", "value": f"{x - 1} + 1"}] for x in range(10, 18)]
    chat.write_text("".join(json.dumps({"conversations": t}) + "\n" for t in turns))
    saved = tmp_path / "saved"
    datasets.Dataset.from_list([{"question": f"{x}=", "answer": f"{x} + 0"} for x in range(8)]).save_to_disk(saved)
    out = tmp_path / "mix"
    config = {
        "model_name_or_path": str(tiny_model_dir),
        "eval_file": None,
        "output_dir": str(out),
        "train_file": [{"path": str(chat), "weight": 3}, f"{saved}:1"],
        "columns": "prompt=question,response=answer",
        "max_steps": 1,
        "per_device_train_batch_size": 4,
        "dataset_cache_dir": str(out / "cache"),
    }
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(config))
    run_sft.main([str(path)])
    printed = capsys.readouterr().out
    assert f"data: 16 samples from 2 source(s) ({chat}: 12, {saved}: 4)" in printed
    assert f"  {chat}: mask audit: 12 samples" in printed and f"  {saved}: mask audit: 4 samples" in printed
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert {f"data/samples/{chat}": 12, f"data/samples/{saved}": 4, "step": 0} in history
    assert f"data/samples/{saved}" in (out / "report.html").read_text()


def train_moe_family(family, tokenizer, sum_files, tmp_path, capsys):
    """run_sft.main with the demo's defaults (all-linear, lora_dropout 0.05, float32 on the CPU) on a tiny model of
    ``family`` with the demo's tokenizer: trains, saves an adapter whose expert lora_B tensors are all non-zero, and
    evaluates before and after. On bf6ee54 every family ended in a traceback before training."""
    base = tmp_path / family
    build_tiny_moe(family, tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    train, evaluation = sum_files
    out = tmp_path / "run"
    argv = ["--model_name_or_path", str(base), "--train_file", train, "--eval_file", evaluation]
    summary = run_sft.main([*argv, "--output_dir", str(out), "--max_steps", "2"])
    assert summary["before"]["num_samples"] == summary["after"]["num_samples"] == 6
    weights = load_file(out / "adapter_model.safetensors")
    experts = {name: tensor for name, tensor in weights.items() if ".experts." in name and "lora_B" in name}
    assert len(experts) == 2 * len(moe_blocks(build_tiny_moe(family, tokenizer)))  # gate_up_proj, down_proj a layer
    assert all(tensor.abs().sum() > 0 for tensor in experts.values())
    logged = json.loads((out / "trainer_state.json").read_text())["log_history"]
    counts = next(entry for entry in logged if "throughput/run_active_params" in entry)
    assert counts["throughput/run_active_params"] < counts["throughput/run_all_params"]  # MFU's N is N_active
    assert "experts: LoRA on gate_up_proj, down_proj (fused) of 4 experts" in capsys.readouterr().out


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_the_moe_families_train_save_and_evaluate_with_the_demo_defaults(family, sum_files, tmp_path, capsys):
    train_moe_family(
        family, AutoTokenizer.from_pretrained(DEMO_ARGUMENTS["model_name_or_path"]), sum_files, tmp_path, capsys
    )


@pytest.mark.parametrize("family", MORE_MOE_FAMILIES)
def test_more_moe_families_train_the_same_way(family, sum_files, tmp_path, capsys):
    train_moe_family(
        family, AutoTokenizer.from_pretrained(DEMO_ARGUMENTS["model_name_or_path"]), sum_files, tmp_path, capsys
    )


@pytest.fixture(scope="module")
def hybrid_dirs(tmp_path_factory, qwen_style_tokenizer):
    """Each tiny hybrid family saved with its tokenizer, as a ``--model_name_or_path`` directory."""
    from hf_lora_ds._testing.tiny_hybrids import HYBRID_FAMILIES, build_tiny_hybrid

    dirs = {}
    for family in HYBRID_FAMILIES:
        dirs[family] = tmp_path_factory.mktemp(family)
        build_tiny_hybrid(family, qwen_style_tokenizer).save_pretrained(dirs[family])
        qwen_style_tokenizer.save_pretrained(dirs[family])
    return dirs


@pytest.mark.parametrize("batching", ["packed", "padding_free"])
def test_hybrid_models_are_refused_packing_in_one_line_before_their_data_is_read(
    hybrid_dirs, sum_files, tmp_path, monkeypatch, batching
):
    """From the command line, each family's refusal names its layers' kind; neither tokenizer nor weights load."""
    kinds = {"qwen3_5_text": "linear-attention", "qwen3_next": "linear-attention", "lfm2": "short-convolution"}
    monkeypatch.setattr(run_inputs, "load_tokenizer", _unreachable)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", _unreachable)
    for family, directory in hybrid_dirs.items():
        flags = [*demo_flags(directory, sum_files, tmp_path / family), "--batching", batching, "--use_cache", "false"]
        with pytest.raises(UserError) as refused:
            run_sft.main(flags)
        line = str(refused.value)
        assert "\n" not in line and line.endswith("use --batching padded")
        assert line.startswith(f"--batching {batching}: this model's {kinds.get(family, 'state-space')} layers ")


def _unreachable(*args, **kwargs):
    raise AssertionError("loaded before --batching was checked")


def test_the_command_line_starts_its_bar_after_the_setup_lines(tiny_model_dir, sum_files, tmp_path, capfd, monkeypatch):
    """The command line asks for the setup-first bar (the trainer keeps Trainer's own): what the callbacks attached
    after the bar print at train begin (the engine: line, the load's memory) stands before it, not on its line."""
    from hf_lora_ds import LoraSFTTrainer
    from tests.callbacks.test_progress_bar import SetupLine

    class SetupLineAfterTheBar(LoraSFTTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(SetupLine())  # as the run's own callbacks are: after the bar Trainer made

    monkeypatch.setattr("hf_lora_ds.cli.run.LoraSFTTrainer", SetupLineAfterTheBar)
    flags = [*demo_flags(tiny_model_dir, sum_files, tmp_path / "run"), "--eval_file", "", "--disable_tqdm", "false"]
    run_sft.main([*flags, "--max_steps", "2", "--run_callbacks", "none"])
    err = capfd.readouterr().err
    assert "engine: plain\n" in err and err.index("engine: plain") < err.index(" 0/2 [")  # the training bar's start
