"""Batched vs one-by-one generation on the tiny model: generated tokens/s of each, their ratio, identical outputs.

Blog recipes evaluate one prompt at a time; hf_lora_ds.eval batches (left-padded, length-sorted) and promises the
same outputs. This script measures both with the same code path (``generate`` with batch size 1 and with
``--batch_size``), side by side in one run, after a warm-up, alternating the two ``--repeats`` times and keeping each
one's fastest run (the least disturbed by other processes), and fails if any output differs. Target: >= 10x at
batch 32 on a CPU.

    python bench/generation.py                       # bundled data/tiny-qwen2-sum if built, else a random tiny model
    python bench/generation.py --model DIR --data FILE --num_prompts 64 --batch_size 32

Timings on a shared machine are noisy; run it twice before trusting a number. Intra-op threads default to torch's
own default, the count ``hf_lora_ds.eval`` runs with: on this project's 2-core CPU (SmolLM2-135M, 64 prompts) two
threads made the batched run ~15% faster and one-by-one ~8% slower than one thread (a single row is bound by reading
the weights, and two threads share that bandwidth); ``--threads 1`` measures the other end. On a busy machine
threads waiting on each other can slow either mode by an order of magnitude: measure on an idle one.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_lora_ds._testing.tiny_models import CHATML_DEFAULT_SYSTEM_TEMPLATE, build_tiny_qwen2, train_chat_tokenizer
from hf_lora_ds.eval import DEFAULT_PREFIX, generate, get_task, load_samples

DATA = Path(__file__).resolve().parent.parent / "data"


def load_model(model_dir: Path | None, records: list[dict]):
    """The bundled model if present, else a random Qwen2 of the bundled shape with a tokenizer trained on the data."""
    model_dir = model_dir or (DATA / "tiny-qwen2-sum")
    if (model_dir / "config.json").is_file():
        return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir), str(model_dir)
    corpus = [r["instruction"] + r["output"] for r in records]
    tokenizer = train_chat_tokenizer(corpus * 4, vocab_size=512, chat_template=CHATML_DEFAULT_SYSTEM_TEMPLATE)
    model = build_tiny_qwen2(tokenizer, hidden_size=128, num_hidden_layers=4)
    return model, tokenizer, "random Qwen2 (hidden 128, 4 layers; data/tiny-qwen2-sum not built)"


def bench_records(path: Path, num_prompts: int) -> list[dict]:
    if path.is_file():
        records = json.loads(path.read_text(encoding="utf-8"))
    else:
        pairs = [(x, x % 9 + 1) for x in range(10, 999, 7)]
        records = [{"instruction": f"{x}=", "output": f"{DEFAULT_PREFIX}{a} + {x - a}"} for x, a in pairs]
    return (records * (num_prompts // len(records) + 1))[:num_prompts]


def timed(model, tokenizer, prompts, batch_size, max_new_tokens):
    start = time.perf_counter()
    outputs = generate(model, tokenizer, prompts, batch_size=batch_size, max_new_tokens=max_new_tokens)
    return outputs, time.perf_counter() - start


def _seconds(times: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="model dir (default: data/tiny-qwen2-sum if built)")
    parser.add_argument("--data", type=Path, default=DATA / "sum_to_x" / "eval.json", help="sum-to-x records")
    parser.add_argument("--num_prompts", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: longest reference + 9, as eval")
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads (default: %(default)s)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode; the fastest counts")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    records = bench_records(args.data, args.num_prompts)
    model, tokenizer, described = load_model(args.model, records)
    samples = load_samples(records, get_task("sum_to_x"))
    prompts = [tokenizer.apply_chat_template(s.prompt, tokenize=False, add_generation_prompt=True) for s in samples]
    references = tokenizer([s.reference for s in samples], add_special_tokens=False)["input_ids"]
    max_new_tokens = args.max_new_tokens or max(map(len, references)) + 9
    model.eval()

    timed(model, tokenizer, prompts[: args.batch_size], args.batch_size, 4)  # warm-up: allocator, kernels, caches
    one_times, batched_times = [], []
    for _ in range(args.repeats):
        one, seconds = timed(model, tokenizer, prompts, 1, max_new_tokens)
        one_times.append(seconds)
        batched, seconds = timed(model, tokenizer, prompts, args.batch_size, max_new_tokens)
        batched_times.append(seconds)
    one_s, batched_s = min(one_times), min(batched_times)

    mismatches = [i for i, (a, b) in enumerate(zip(one, batched)) if a != b]
    tokens = sum(g.num_tokens for g in one)
    one_rate, batched_rate = tokens / one_s, sum(g.num_tokens for g in batched) / batched_s
    print(f"model: {described}; device {model.device}; {torch.get_num_threads()} intra-op thread(s)")
    print(
        f"{len(prompts)} prompts, max_new_tokens {max_new_tokens}, {tokens} tokens generated "
        f"({sum(g.stopped for g in one)} prompts stopped at the end-of-turn token)"
    )
    print(f"one by one:      {one_s:8.2f} s  {one_rate:9.1f} generated tokens/s  (runs: {_seconds(one_times)})")
    print(
        f"batch size {args.batch_size:<4d} {batched_s:8.2f} s  {batched_rate:9.1f} generated tokens/s  "
        f"(runs: {_seconds(batched_times)})"
    )
    print(f"ratio batched / one-by-one: {batched_rate / one_rate:.1f}x (target >= 10x)")
    print(f"identical outputs: {not mismatches}" + (f" (differ at prompts {mismatches[:10]})" if mismatches else ""))
    if mismatches:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
