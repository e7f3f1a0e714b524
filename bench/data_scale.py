"""Data pipeline at scale: read, validate and tokenize a generated JSONL file of a million records.

It runs ``ChatSFTDataset`` (records read line by line into Arrow, validated, then rendered and tokenized by a
batched datasets map) in a fresh subprocess per measurement: on a ``--records`` file with 1 and then 2 workers
(``--preprocessing_num_workers``), each on an empty cache; on a ``--large_records`` file with 2 workers, on an
empty cache and then again on the cache that run wrote; and on a copy of the large file with a bad record at line
900,000. Beside the 1-worker run, the floor: the same records tokenized by batched
``apply_chat_template(..., tokenize=True)``, 1,000 conversations a call, with no masks, in one process (the
conversations built beforehand, untimed), and our rate as a fraction of it. It prints, measured in this run: seconds,
samples/s, and the peak memory of the whole process tree (main process
and workers, sampled every 0.2 s from /proc/<pid>/smaps_rollup): the sum of RSS, which counts the pages forked
workers share with the main process once per process; PSS, which splits shared pages between the processes that map
them; and PSS split into anonymous memory (what the pipeline allocates: it cannot be dropped while the run lasts)
and file-backed pages (the memory-mapped Arrow tables and libraries, page cache the kernel reclaims under pressure).
Then the bad record's error.

    python bench/data_scale.py [--records 200000] [--large_records 1000000] [--workdir DIR] [--memory_limit GIB]
                               [--tokenizer DIR]   # a real one, e.g. SmolLM2's 49k BPE (tests/real_model's cache)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
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


_SMAPS_FIELDS = {"Rss": "rss", "Pss": "pss", "Pss_Anon": "pss_anon", "Pss_File": "pss_file"}


def _smaps_rollup(pid: int) -> dict[str, int]:
    """A process's memory in bytes by kind, from Linux's /proc/<pid>/smaps_rollup."""
    memory = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, value = line.split(":", 1)
        if name in _SMAPS_FIELDS:
            memory[_SMAPS_FIELDS[name]] = int(value.split()[0]) * 1024
    return memory


def memory_cgroup(limit_gib: float) -> Path:
    """A new memory cgroup capped at ``limit_gib``, page cache included (Linux, root; cgroup v1's memory controller
    or cgroup v2). Under the cap the kernel drops file-backed pages it can read again, and kills the run if the
    memory it allocates does not fit."""
    name = f"data_scale_{os.getpid()}"
    limit = str(int(limit_gib * 2**30))
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir():
        group = v1 / name
        group.mkdir()
        (group / "memory.limit_in_bytes").write_text(limit)
        if (group / "memory.memsw.limit_in_bytes").exists():  # no swapping out of the cap either
            (group / "memory.memsw.limit_in_bytes").write_text(limit)
        return group
    group = Path("/sys/fs/cgroup") / name
    group.mkdir()
    (group / "memory.max").write_text(limit)
    (group / "memory.swap.max").write_text("0")
    return group


def cgroup_peak_gib(group: Path) -> float:
    """The most memory the cgroup was charged with: its processes' own pages and the page cache they used."""
    peak = group / "memory.max_usage_in_bytes"
    return int((peak if peak.exists() else group / "memory.peak").read_text()) / 2**30


def run_child(
    path: Path,
    tokenizer_dir: Path,
    cache: Path,
    num_proc: int,
    cgroup: Path | None = None,
    timeout: float | None = None,
) -> dict:
    """One pipeline run in a fresh process (in ``cgroup``, if given), with the peak memory of its process tree sampled
    from outside; a run killed or past ``timeout`` seconds comes back as ``{"failed": why}``."""
    command = [
        sys.executable,
        __file__,
        "--child",
        str(path),
        "--tokenizer",
        str(tokenizer_dir),
        "--cache",
        str(cache),
        "--num_proc",
        str(num_proc),
    ]
    join = (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid()))) if cgroup else None
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=join, start_new_session=True
    )
    peak = dict.fromkeys(_SMAPS_FIELDS.values(), 0)

    def sample() -> None:
        parent = psutil.Process(process.pid)
        while process.poll() is None:
            time.sleep(0.2)
            try:
                tree = [_smaps_rollup(p.pid) for p in [parent, *parent.children(recursive=True)]]
            except (psutil.Error, OSError):  # a worker ended between listing and reading it
                continue
            for key in peak:
                peak[key] = max(peak[key], sum(memory[key] for memory in tree))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the workers too: a pool whose worker was killed waits forever
        out, _ = process.communicate()
        out = json.dumps({"failed": f"not finished after {timeout:.0f} s"})
    sampler.join()
    lines = out.strip().splitlines()
    result = json.loads(lines[-1]) if lines else {"failed": f"exit status {process.returncode}"}
    result.update({f"peak_{k}_gib": v / 2**30 for k, v in peak.items()})
    return result


def plain_child(args: argparse.Namespace) -> None:
    """The floor: the file's conversations tokenized by the chat template with no masks, batched as the pipeline
    batches, in this one process; reading and converting the records is not timed."""
    from transformers import AutoTokenizer

    from hf_lora_ds.data.formats import to_conversation

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    with args.plain.open(encoding="utf-8") as f:
        conversations = [to_conversation(json.loads(line), "record")["messages"] for line in f]
    start = time.perf_counter()
    for begin in range(0, len(conversations), 1000):
        tokenizer.apply_chat_template(conversations[begin : begin + 1000], tokenize=True)
    print(json.dumps({"samples": len(conversations), "seconds": time.perf_counter() - start}))


def run_plain(path: Path, tokenizer_dir: Path) -> dict:
    """``plain_child`` in a fresh process, as each pipeline run is."""
    command = [sys.executable, __file__, "--plain", str(path), "--tokenizer", str(tokenizer_dir)]
    out = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def child(args: argparse.Namespace) -> None:
    """The measured pipeline: what run_sft.py does before the model is loaded."""
    from transformers import AutoTokenizer

    from hf_lora_ds.data.dataset import ChatSFTDataset
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
    parser.add_argument(
        "--large_records", type=int, default=1_000_000, help="File size for the cold, warm and bad runs."
    )
    parser.add_argument("--workdir", default=None, help="Where the files and caches go (default: a temp dir).")
    parser.add_argument(
        "--memory_limit",
        type=float,
        default=None,
        help="Also run the large file (2 workers, cold) in a memory cgroup capped at this many GiB, "
        "page cache included (Linux, as root).",
    )
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plain", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--tokenizer",
        default=None,
        help="A saved tokenizer directory to tokenize with (a real model's 49k-token BPE is slower "
        "than the default: a tiny word-level one built here).",
    )
    parser.add_argument("--cache", help=argparse.SUPPRESS)
    parser.add_argument("--num_proc", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.plain:
        return plain_child(args)

    from hf_lora_ds._testing.tiny_models import train_chat_tokenizer

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="data_scale-"))
    workdir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = Path(args.tokenizer) if args.tokenizer else workdir / "tokenizer"
    if not args.tokenizer:
        train_chat_tokenizer([" ".join(WORDS)] * 20 + ["You are a helpful assistant."] * 5).save_pretrained(
            tokenizer_dir
        )
    print(f"{'':>38} {'peak GiB of the process tree':>37}")
    print(
        f"{'records':>9} {'workers':>7} {'cache':>5} {'seconds':>8} {'samples/s':>10} "
        f"{'RSS sum':>9} {'PSS':>6} {'PSS anon':>9} {'PSS file':>9}",
        flush=True,
    )
    small, large = args.records, args.large_records
    runs = [(small, 1, "a", "cold"), (small, 2, "b", "cold"), (large, 2, "c", "cold"), (large, 2, "c", "warm")]
    seconds = {}
    for n, num_proc, cache, state in runs:
        path = workdir / f"records_{n}.jsonl"
        if not path.exists():
            write_records(path, n)
        result = run_child(path, tokenizer_dir, workdir / f"cache_{cache}", num_proc)
        seconds[n, num_proc, state] = result["seconds"]
        rate = result["samples"] / result["seconds"]
        print(
            f"{n:>9} {num_proc:>7} {state:>5} {result['seconds']:>8.1f} {rate:>10.0f} {result['peak_rss_gib']:>9.2f} "
            f"{result['peak_pss_gib']:>6.2f} {result['peak_pss_anon_gib']:>9.2f} {result['peak_pss_file_gib']:>9.2f}",
            flush=True,
        )
        if num_proc == 1:  # the floor, measured right after ours on the same file
            ours, plain = rate, run_plain(path, tokenizer_dir)
    floor = plain["samples"] / plain["seconds"]
    print(
        f"plain floor, {small:,} records, 1 process: batched apply_chat_template(tokenize=True), no masks: "
        f"{floor:.0f} samples/s; ours (1 worker, cold, exact masks): {ours:.0f} samples/s; "
        f"ratio ours / plain {ours / floor:.2f}",
        flush=True,
    )
    line = BAD_LINE if large >= BAD_LINE else int(large * 0.9)
    bad = workdir / f"bad_{large}.jsonl"
    with_bad_record(workdir / f"records_{large}.jsonl", bad, line)
    result = run_child(bad, tokenizer_dir, workdir / "cache_bad", 2)
    print(
        f"bad record at line {line:,} of {large:,}, 2 workers: error after {result['seconds']:.1f} s, "
        f"peak PSS {result['peak_pss_gib']:.2f} GiB ({result['peak_pss_anon_gib']:.2f} anonymous):\n"
        f"  error: {result.get('error')}"
    )
    if args.memory_limit:
        group = memory_cgroup(args.memory_limit)
        limit = 3 * seconds[large, 2, "cold"] + 120
        result = run_child(workdir / f"records_{large}.jsonl", tokenizer_dir, workdir / "cache_capped", 2, group, limit)
        outcome = result.get("failed") or f"{result['samples']:,} samples in {result['seconds']:.1f} s"
        print(
            f"{large:,} records, 2 workers, cold, capped at {args.memory_limit} GiB with page cache: {outcome}; "
            f"peak PSS {result['peak_pss_gib']:.2f} GiB ({result['peak_pss_anon_gib']:.2f} anonymous), "
            f"peak charge to the cgroup {cgroup_peak_gib(group):.2f} GiB"
        )
        group.rmdir()


if __name__ == "__main__":
    main()
