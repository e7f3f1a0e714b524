"""Data pipeline at scale: read, validate and tokenize a generated JSONL file of a million records.

It runs ``ChatSFTDataset`` (records read line by line into Arrow, validated, then rendered and tokenized by a
batched datasets map) in a fresh subprocess per measurement: on a ``--records`` file with 1 and then 2 workers
(``--preprocessing_num_workers``), each on an empty cache; on a ``--large_records`` file with 2 workers, on an
empty cache and then again on the cache that run wrote; and on a copy of the large file with a bad record at line
900,000. It prints, measured in this run: seconds, samples/s, the peak memory of the whole process tree (main
process and workers, sampled every 0.2 s: the sum of their RSS, which counts the pages that forked workers share
with the main process once per process, and of their PSS, which splits shared pages between the processes that
map them), and the bad record's error.

    python bench/data_scale.py [--records 200000] [--large_records 1000000] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORDS = "the a cat dog sat on mat quick brown fox jumps over lazy river mountain answer question why how".split()
BAD_LINE = 900_000


def write_records(path: Path, n: int, seed: int = 0) -> None:
    """``n`` records, alternating alpaca (with and without input) and 1-3 turn messages, 5-40 words a turn."""
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))

    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            if i % 2:
                turns = [(sentence(), sentence()) for _ in range(rng.randint(1, 3))]
                messages = [{"role": r, "content": c} for turn in turns for r, c in zip(("user", "assistant"), turn)]
                record: dict = {"messages": messages}
            else:
                record = {"instruction": sentence(), "input": sentence() if i % 4 else "", "output": sentence()}
            f.write(json.dumps(record) + "\n")


def with_bad_record(source: Path, target: Path, line: int) -> None:
    """A copy of ``source`` whose ``line`` misses its answer."""
    with source.open(encoding="utf-8") as src, target.open("w", encoding="utf-8") as dst:
        for number, text in enumerate(src, start=1):
            dst.write('{"instruction": "no answer here"}\n' if number == line else text)


def run_child(path: Path, tokenizer_dir: Path, cache: Path, num_proc: int) -> dict:
    """One pipeline run in a fresh process, with the peak RSS of its process tree sampled from outside."""
    command = [sys.executable, __file__, "--child", str(path), "--tokenizer", str(tokenizer_dir),
               "--cache", str(cache), "--num_proc", str(num_proc)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peak = {"rss": 0, "pss": 0}

    def sample() -> None:
        parent = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                tree = [p.memory_full_info() for p in [parent, *parent.children(recursive=True)]]
                peak["rss"] = max(peak["rss"], sum(m.rss for m in tree))
                peak["pss"] = max(peak["pss"], sum(m.pss for m in tree))
            except psutil.Error:  # a worker ended between listing and reading it
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = process.communicate()
    sampler.join()
    result = json.loads(out.strip().splitlines()[-1])
    result.update({f"peak_{k}_gib": v / 2**30 for k, v in peak.items()})
    return result


def child(args: argparse.Namespace) -> None:
    """The measured pipeline: what run_sft.py does before the model is loaded."""
    from transformers import AutoTokenizer

    from hf_lora_ds.data import ChatSFTDataset
    from hf_lora_ds.errors import UserError

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    start = time.perf_counter()
    try:
        dataset = ChatSFTDataset(args.child, tokenizer, max_length=2048, cache_dir=args.cache, num_proc=args.num_proc)
        result = {"samples": len(dataset)}
    except UserError as err:
        result = {"error": str(err)}
    result["seconds"] = time.perf_counter() - start
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000, help="File size for the 1 and 2 worker runs.")
    parser.add_argument("--large_records", type=int, default=1_000_000, help="File size for the cold, warm and bad runs.")
    parser.add_argument("--workdir", default=None, help="Where the files and caches go (default: a temp dir).")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--num_proc", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    from hf_lora_ds.tiny import train_chat_tokenizer

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="data_scale-"))
    tokenizer_dir = workdir / "tokenizer"
    train_chat_tokenizer([" ".join(WORDS)] * 20 + ["You are a helpful assistant."] * 5).save_pretrained(tokenizer_dir)
    print(f"{'records':>9} {'workers':>7} {'cache':>5} {'seconds':>8} {'samples/s':>10} {'peak RSS GiB':>13} {'peak PSS GiB':>13}", flush=True)
    small, large = args.records, args.large_records
    runs = [(small, 1, "a", "cold"), (small, 2, "b", "cold"), (large, 2, "c", "cold"), (large, 2, "c", "warm")]
    for n, num_proc, cache, state in runs:
        path = workdir / f"records_{n}.jsonl"
        if not path.exists():
            write_records(path, n)
        result = run_child(path, tokenizer_dir, workdir / f"cache_{cache}", num_proc)
        rate = result["samples"] / result["seconds"]
        print(f"{n:>9} {num_proc:>7} {state:>5} {result['seconds']:>8.1f} {rate:>10.0f} "
              f"{result['peak_rss_gib']:>13.2f} {result['peak_pss_gib']:>13.2f}", flush=True)  # fmt: skip
    line = BAD_LINE if large >= BAD_LINE else int(large * 0.9)
    bad = workdir / f"bad_{large}.jsonl"
    with_bad_record(workdir / f"records_{large}.jsonl", bad, line)
    result = run_child(bad, tokenizer_dir, workdir / "cache_bad", 2)
    print(f"bad record at line {line:,} of {large:,}, 2 workers: error after {result['seconds']:.1f} s, "
          f"peak RSS {result['peak_rss_gib']:.2f} GiB, PSS {result['peak_pss_gib']:.2f} GiB:\n  error: {result.get('error')}")  # fmt: skip


if __name__ == "__main__":
    main()
