"""Masked tokenizing against the plain chat-template floor, side by side in one run, and where its time goes.

Each round runs, in fresh processes one after the other on the same generated file (``data_scale.write_records``:
alpaca and 1-3 turn chats, no training flags, content parts or tools): ours, ``ChatSFTDataset`` with exact masks in
one worker on an empty cache (the file read into Arrow, every record validated, rendered, tokenized and labelled, the
samples written), then the floor, the same conversations tokenized by batched ``apply_chat_template(tokenize=True)``,
1,000 a call, with no masks (the conversations built beforehand, untimed). Each process reports its wall seconds
and its CPU seconds (all threads: the tokenizers library encodes a batch on every core); each round prints both
rates and both ratios ours / floor. The two alternate, so a neighbour's load on a shared machine falls on both; it
only ever slows a run down, so the run ends with the median ratios and the ratio of the best rates of all rounds.

``--profile`` then runs ours once more under cProfile in this process and prints the functions that took the most
time of their own and the package's functions by cumulative time.

    python bench/masked_tokenizing.py --tokenizer DIR [--records 20000] [--rounds 3] [--profile]
    # DIR: a real tokenizer, e.g. SmolLM2-135M-Instruct's (tests/real_model/smollm2.py converts it into
    # ~/.cache/hf_lora_ds_tests/SmolLM2-135M-Instruct-hf)
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from data_scale import ROOT, write_records  # noqa: E402

sys.path.insert(0, str(ROOT))


def ours(path: Path, tokenizer_dir: Path, cache: Path):
    """The pipeline run_sft.py runs before the model is loaded, with exact masks, in this process: a function that
    runs it and returns its sample count (the imports and the tokenizer loaded beforehand, untimed)."""
    from transformers import AutoTokenizer

    from hf_lora_ds.data.dataset import ChatSFTDataset

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    return lambda: len(ChatSFTDataset(path, tokenizer, max_length=2048, cache_dir=cache))


def floor(path: Path, tokenizer_dir: Path) -> int:
    """The floor: the file's conversations tokenized by the chat template with no masks."""
    from transformers import AutoTokenizer

    from hf_lora_ds.data.formats import to_conversation

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    with path.open(encoding="utf-8") as f:
        conversations = [to_conversation(json.loads(line), "record")["messages"] for line in f]
    return _timed(lambda: _plain(tokenizer, conversations))


def _plain(tokenizer, conversations: list) -> int:
    for begin in range(0, len(conversations), 1000):
        tokenizer.apply_chat_template(conversations[begin : begin + 1000], tokenize=True)
    return len(conversations)


def _timed(run) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    samples = run()
    return {"samples": samples, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}


def in_child(*args: str) -> dict:
    command = [sys.executable, __file__, *args]
    out = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def profile(path: Path, tokenizer_dir: Path, cache: Path, top: int) -> None:
    """Ours once under cProfile: the most time of their own, then the package's functions by cumulative time."""
    run = ours(path, tokenizer_dir, cache)
    profiler = cProfile.Profile()
    profiler.enable()
    run()
    profiler.disable()
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"hf_lora_ds", top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="A saved tokenizer directory (a real model's).")
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="Also profile ours once (in this process).")
    parser.add_argument("--top", type=int, default=25, help="Rows of each profile table.")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--ours", nargs=2, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--floor", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    tokenizer_dir = Path(args.tokenizer)
    if args.ours:
        return print(json.dumps(_timed(ours(args.ours[0], tokenizer_dir, args.ours[1]))))
    if args.floor:
        return print(json.dumps(floor(args.floor, tokenizer_dir)))
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="masked_tokenizing-"))
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"records_{args.records}.jsonl"
    if not path.exists():
        write_records(path, args.records)
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    best = {name: dict.fromkeys(ratios, 0.0) for name in ("ours", "floor")}
    for k in range(args.rounds):
        cache = workdir / f"cache_{time.time_ns()}"
        runs = {"ours": in_child("--ours", str(path), str(cache), "--tokenizer", args.tokenizer)}
        runs["floor"] = in_child("--floor", str(path), "--tokenizer", args.tokenizer)
        rates = {name: {clock: run["samples"] / run[clock] for clock in ratios} for name, run in runs.items()}
        for clock in ratios:
            ratios[clock].append(rates["ours"][clock] / rates["floor"][clock])
            for name in best:
                best[name][clock] = max(best[name][clock], rates[name][clock])
        print(
            f"round {k + 1}: samples/s by wall clock ours {rates['ours']['wall']:,.0f} floor "
            f"{rates['floor']['wall']:,.0f} ratio {ratios['wall'][-1]:.2f}; by CPU time ours "
            f"{rates['ours']['cpu']:,.0f} floor {rates['floor']['cpu']:,.0f} ratio {ratios['cpu'][-1]:.2f}",
            flush=True,
        )
    summary = (
        f"{clock}: median {statistics.median(ratios[clock]):.2f}, best rates {best['ours'][clock]:,.0f} / "
        f"{best['floor'][clock]:,.0f} = {best['ours'][clock] / best['floor'][clock]:.2f}"
        for clock in ratios
    )
    if args.rounds:
        print(f"{args.records:,} records, {args.rounds} rounds, ratio ours / floor by " + "; by ".join(summary))
    if args.profile:
        profile(path, tokenizer_dir, workdir / f"cache_profile_{time.time_ns()}", args.top)


if __name__ == "__main__":
    main()
