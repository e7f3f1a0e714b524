"""Every recipe in examples/ parses with run_sft's own parser and trains for two steps, so none can drift out of date.

Each recipe runs as its first line says to launch it (the flags after the file name included), in one process, with
these swaps and nothing else:
- the model becomes the bundled tiny Qwen2 and the data small slices of the bundled sum-to-x files;
- output_dir a temporary directory, max_steps 2, SwanLab's log directory a temporary one;
- on a machine without CUDA, a bf16/fp16 recipe trains in float32 (``--dtype float32 --bf16 false --fp16 false``):
  CPU bf16 training is ~20x slower and fp16 is not supported there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import run_sft

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = Path(REPO, "examples")
RECIPES = sorted(EXAMPLES.glob("*.yaml"))
BUNDLED = Path(REPO, "data")
LAUNCH = re.compile(r"^# Launch: (?P<launcher>.+?) run_sft\.py (?P<recipe>\S+\.yaml)(?P<flags>.*)$")


_LAUNCHER_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def launch_line(recipe: Path) -> re.Match:
    first = recipe.read_text(encoding="utf-8").splitlines()[0]
    match = LAUNCH.match(first)
    assert match, f"{recipe.name}: the first line must be '# Launch: <launcher> run_sft.py examples/...yaml [flags]'"
    return match


def test_every_recipe_is_listed_with_its_launch_command():
    assert len(RECIPES) == 6, [recipe.name for recipe in RECIPES]
    for recipe in RECIPES:
        assert launch_line(recipe)["recipe"] == f"examples/{recipe.name}"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_recipe_parses_as_launched(recipe, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name the bundled data and ds_configs relative to the repository
    config = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    args = run_sft.parse_args([str(recipe), *launch_line(recipe)["flags"].split(), "--use_cpu", "true"])
    for key, value in config.items():
        if key != "report_to":  # a list once parsed
            assert getattr(args, key) == value, key
    assert "max_steps" in config  # the demo's 150 steps do not leak into a recipe (checked equal above)


def test_flags_after_a_recipe_override_it_and_unknown_keys_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    recipe = EXAMPLES / "qwen2.5-14b-instruct_2x32gb.yaml"
    args = run_sft.parse_args([str(recipe), "--lora_rank", "4", "--use_cpu", "true"])
    assert (args.lora_rank, args.lora_alpha) == (4, 32)  # the flag wins; the rest of the recipe stays
    typo = tmp_path / "typo.yaml"
    typo.write_text("model_name_or_path: x\nlora_rnak: 4\n")
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['lora_rnak'\]"):
        run_sft.parse_args([str(typo)])


def adapted_flags(recipe: Path, data: dict[str, Path], out: Path) -> list[str]:
    """The swaps listed in the module docstring, as flags after the recipe's own launch flags."""
    flags = [
        "--model_name_or_path",
        str(BUNDLED / "tiny-qwen2-sum"),
        "--train_file",
        str(data["train"]),
        "--eval_file",
        str(data["eval"]),
        "--output_dir",
        str(out),
        "--max_steps",
        "2",
        "--dataset_cache_dir",
        str(out.parent / "cache"),
        "--disable_tqdm",
        "true",
    ]
    if yaml.safe_load(recipe.read_text(encoding="utf-8")).get("dtype", "auto") in ("bfloat16", "float16") and (
        not torch.cuda.is_available()
    ):
        flags += ["--dtype", "float32", "--bf16", "false", "--fp16", "false"]
    return flags


@pytest.fixture(scope="module")
def small_sum_to_x(tmp_path_factory) -> dict[str, Path]:
    """64 training and 4 eval records of the bundled data (the recipes' batches, with room for two steps)."""
    root = tmp_path_factory.mktemp("recipe-data")
    files = {}
    for name, count in (("train", 64), ("eval", 4)):
        records = json.loads((BUNDLED / "sum_to_x" / f"{name}.json").read_text(encoding="utf-8"))[:count]
        files[name] = root / f"{name}.json"
        files[name].write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return files


def runs_alone(recipe: Path) -> bool:
    """Launched with plain python, without DeepSpeed or SwanLab: nothing of the run outlives ``run_sft.main``."""
    config = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    return launch_line(recipe)["launcher"] == "python" and not config.get("deepspeed") and config["report_to"] == "none"


@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda path: path.stem)
def test_recipe_trains_two_steps(recipe, small_sum_to_x, tmp_path, monkeypatch):
    """As launched, with one rank: in this process where the recipe runs alone (a fresh interpreter's imports cost
    ~10 s), else a separate process, so DeepSpeed's process group and SwanLab's run start and end with it."""
    if "load_in_4bit: true" in recipe.read_text(encoding="utf-8"):
        pytest.importorskip("bitsandbytes")
    out = tmp_path / "out"
    argv = [
        f"examples/{recipe.name}",
        *launch_line(recipe)["flags"].split(),
        *adapted_flags(recipe, small_sum_to_x, out),
    ]
    if runs_alone(recipe):
        monkeypatch.chdir(REPO)  # recipes name the bundled data and ds_configs relative to the repository
        run_sft.main(argv)
    else:
        # Without this test process's launcher variables (pytest itself started by a launcher): the recipe's own
        # process would take them as its launch, and fail to bind a MASTER_PORT this process may listen on.
        inherited = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES}
        env = {
            **inherited,
            "OMP_NUM_THREADS": "1",
            "SWANLAB_LOG_DIR": str(tmp_path / "swanlog"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(
            [sys.executable, str(REPO / "run_sft.py"), *argv],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"{recipe.name}:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert json.loads((out / "eval_report.json").read_text())["after"]["num_samples"] == 4
    assert (out / "adapter_model.safetensors").is_file()
