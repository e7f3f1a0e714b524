"""The memory planner against measured peaks: predicted vs measured per-rank memory, per configuration.

Trains a few steps of two Qwen2-shaped models built here (no download) under no DeepSpeed, torchrun DDP, ZeRO-0..3
and both offload configs with 2 CPU ranks, reads each run's per-rank peak from MemoryTraceCallback
(``memory/train/cpu_total_peak_mib_max``: the larger rank's peak resident memory during training), and asks
``python -m hf_lora_ds.plan --json`` for the same run. On a CPU-only machine the planner's "device" is the process's
host memory, so the two are the same quantity.

    python bench/memory_plan.py                      # both shapes, every configuration (~15 min on 2 cores)
    python bench/memory_plan.py --shapes logits --configs none stage3

Shapes: ``states`` (~110M parameters, short samples: the weights dominate) and ``logits`` (a 151,936-token
vocabulary with 2 layers and long answers: logits and activations dominate).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUN_SFT = REPO / "run_sft.py"
WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy river mountain answer question why how".split()
CONFIGS = ("none", "ddp", "stage0", "stage1", "stage2", "stage3", "stage2_offload", "stage3_offload", "fsdp2")
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class ModelSpec:
    """A Qwen2-shaped model, the samples it trains on and the run settings that make one term dominate."""

    name: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    heads: int
    kv_heads: int
    words_per_answer: int
    batch_size: int
    lora_rank: int = 8
    attn_implementation: str = "sdpa"
    max_steps: int = 2  # the second step's forward runs with the optimizer states the first one made


SHAPES = {
    # ~110M parameters (a 151,936 x 640 embedding), short samples: the frozen weights dominate
    "states": ModelSpec("states", 151936, 640, 6, 1728, 10, 2, words_per_answer=8, batch_size=2),
    # rank-512 adapters on every linear layer of a small model: ~40M trainable parameters, Adam states dominate
    "optimizer": ModelSpec("optimizer", 512, 256, 8, 768, 8, 4, words_per_answer=8, batch_size=2, lora_rank=512),
    # eager attention over ~1,000-token samples: saved activations (B·H·T² scores) dominate; one step, as the
    # rank-8 adapter's optimizer states (~1 MiB) add nothing a second step would show
    "activations": ModelSpec(
        "activations",
        512,
        256,
        8,
        768,
        8,
        8,
        words_per_answer=1000,
        batch_size=2,
        attn_implementation="eager",
        max_steps=1,
    ),
    # a 151,936-token vocabulary, 2 layers, ~400-token answers: the logits dominate
    "logits": ModelSpec("logits", 151936, 64, 2, 192, 4, 2, words_per_answer=400, batch_size=2),
}


def build_model_dir(spec: ModelSpec, directory: Path) -> Path:
    """Randomly initialised weights of ``spec`` with a small chat tokenizer (ids below 600 of the vocabulary)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hf_lora_ds._testing.tiny_models import train_chat_tokenizer

    tokenizer = train_chat_tokenizer([" ".join(WORDS)] * 50)
    config = Qwen2Config(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def write_records(spec: ModelSpec, path: Path, count: int = 16, seed: int = 0) -> Path:
    """Short questions and answers of ``words_per_answer`` words (about that many tokens): supervised-heavy."""
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as out:
        for _ in range(count):
            question = " ".join(rng.choice(WORDS) for _ in range(8))
            answer = " ".join(rng.choice(WORDS) for _ in range(spec.words_per_answer))
            out.write(json.dumps({"instruction": question, "output": answer}) + "\n")
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _launch_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _LAUNCH_VARIABLES}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    return env


def run_arguments(
    spec: ModelSpec, model_dir: Path, train_file: Path, config: str, checkpointing: bool, on_gpu: bool = False
) -> list[str]:
    if config.startswith("fsdp"):
        deepspeed = ["--fsdp", "full_shard", "--fsdp_config", str(REPO / "fsdp_configs" / f"{config}.json")]
    else:
        deepspeed = [] if config in ("none", "ddp") else ["--deepspeed", str(REPO / "ds_configs" / f"{config}.json")]
    return [
        "--model_name_or_path",
        str(model_dir),
        "--train_file",
        str(train_file),
        "--eval_file",
        "",
        "--per_device_train_batch_size",
        str(spec.batch_size),
        "--max_length",
        "2048",
        "--lora_rank",
        str(spec.lora_rank),
        "--max_steps",
        str(spec.max_steps),
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--gradient_checkpointing",
        str(checkpointing),
        "--use_cpu",
        str(not on_gpu),
        "--attn_implementation",
        spec.attn_implementation,
        *deepspeed,
    ]


def measure(
    spec: ModelSpec,
    model_dir: Path,
    train_file: Path,
    config: str,
    checkpointing: bool,
    workdir: Path,
    nproc: int = 2,
    on_gpu: bool = False,
) -> float:
    """The larger per-rank peak (MiB) while training: resident memory on the CPU, ``max_memory_allocated`` on a
    GPU. ``none`` is one plain process, ``ddp`` and ``fsdp2`` torchrun, the others the deepspeed launcher."""
    out = workdir / f"{spec.name}-{config}-{'gc' if checkpointing else 'nogc'}"
    port = _free_port()
    args = run_arguments(spec, model_dir, train_file, config, checkpointing, on_gpu) + ["--output_dir", str(out)]
    if config == "none":
        command = [sys.executable, str(RUN_SFT)]
    elif config == "ddp" or config.startswith("fsdp"):
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            str(nproc),
            "--master_port",
            str(port),
            str(RUN_SFT),
        ]
    else:
        command = [
            sys.executable,
            "-m",
            "deepspeed.launcher.runner",
            "--num_gpus",
            str(nproc),
            "--master_port",
            str(port),
            str(RUN_SFT),
        ]
    done = subprocess.run(command + args, cwd=REPO, env=_launch_env(), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{config} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    key = f"memory/train/{'gpu' if on_gpu else 'cpu'}_total_peak_mib_max"
    return max(entry[key] for entry in history if key in entry)


def planner_world(config: str, nproc: int = 2) -> int:
    """The ranks a configuration's run has: ``none`` is one plain process."""
    return 1 if config == "none" else nproc


def plan_rows(spec: ModelSpec, model_dir: Path, train_file: Path, world: int, on_gpu: bool = False) -> list[dict]:
    """The planner's rows for the runs of ``spec`` on ``world`` ranks (``python -m hf_lora_ds.plan --json``): one per
    shipped configuration and gradient checkpointing, each with ``device_bytes`` per rank and ``device_items``."""
    args = run_arguments(spec, model_dir, train_file, "none", False, on_gpu)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_lora_ds.plan",
            *args,
            "--output_dir",
            tempfile.mkdtemp(),
            "--world_size",
            str(world),
            "--nproc_per_node",
            str(world),
            "--json",
        ],
        cwd=REPO,
        env=_launch_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"planner failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def planned_row(rows: list[dict], config: str, checkpointing: bool) -> dict:
    """``config``'s row among ``plan_rows``' (``none`` and ``ddp`` are the planner's ``none``)."""
    name = "none" if config in ("none", "ddp") else f"{config}.json"
    return next(r for r in rows if r["config"] == name and r["gradient_checkpointing"] == checkpointing)


def predict(
    spec: ModelSpec,
    model_dir: Path,
    train_file: Path,
    config: str,
    checkpointing: bool,
    nproc: int = 2,
    on_gpu: bool = False,
) -> dict:
    """The planner's row for one run."""
    rows = plan_rows(spec, model_dir, train_file, planner_world(config, nproc), on_gpu)
    return planned_row(rows, config, checkpointing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--gradient_checkpointing", nargs="+", default=["false"], choices=["false", "true"])
    options = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="memory_plan-"))
    print(f"{'shape':8} {'configuration':16} {'gc':4} {'predicted MiB':>14} {'measured MiB':>13} {'ratio':>6}")
    for shape in options.shapes:
        spec = SHAPES[shape]
        model_dir = build_model_dir(spec, workdir / f"model-{shape}")
        train_file = write_records(spec, workdir / f"{shape}.jsonl")
        worlds = {planner_world(config) for config in options.configs}
        rows = {world: plan_rows(spec, model_dir, train_file, world) for world in worlds}
        for config in options.configs:
            for gc in (value == "true" for value in options.gradient_checkpointing):
                predicted = planned_row(rows[planner_world(config)], config, gc)["device_bytes"] / 2**20
                measured = measure(spec, model_dir, train_file, config, gc, workdir)
                print(
                    f"{shape:8} {config:16} {'yes' if gc else 'no':4} {predicted:14.0f} {measured:13.0f} "
                    f"{predicted / measured:6.2f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
