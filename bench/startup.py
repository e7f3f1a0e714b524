#!/usr/bin/env python
"""A command's start: the CPU seconds of ``import hf_lora_ds`` and a run's imports, and of one full garbage collection
after them (Trainer runs one as training starts), with the command's imports kept from the collector (paused, then
frozen: hf_lora_ds/command_process.py) and without, measured side by side in fresh interpreters, alternating.

Every rank of a launch and every CLI pays this before it does anything; on a 2-core CPU machine it is most of a
tiny-model test run's cost.

    python bench/startup.py [--repeats 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter: the imports, then their CPU time and the collections run meanwhile, as JSON.
_PROBE = """
import gc, json, resource, time
{without}
collections, collector_s, started = [0], [0.0], {{}}
def count(phase, info):
    if phase == "start":
        started["t"] = time.process_time()
    else:
        collections[0] += 1
        collector_s[0] += time.process_time() - started["t"]
gc.callbacks.append(count)
import hf_lora_ds
package = resource.getrusage(resource.RUSAGE_SELF)
from hf_lora_ds.command_process import command_imports
with command_imports():  # as run_sft.py's command imports
    import hf_lora_ds.run_sft, transformers.trainer, deepspeed, datasets
run = resource.getrusage(resource.RUSAGE_SELF)
start = time.process_time()
gc.collect()
full_collection_s = time.process_time() - start
print(json.dumps({{
    "full_collection_s": full_collection_s,
    "package_cpu_s": package.ru_utime + package.ru_stime,
    "run_imports_cpu_s": run.ru_utime + run.ru_stime,
    "collections": collections[0],
    "collector_s": collector_s[0],
}}))
"""
# Undone: gc.disable and gc.freeze no-ops, so the collector runs through the imports and walks their objects later.
_COLLECTOR_ON = "gc.disable = gc.freeze = lambda: None"


def probe(kept: bool) -> dict:
    code = _PROBE.format(without="" if kept else _COLLECTOR_ON)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=8, help="fresh interpreters per variant, alternating")
    options = parser.parse_args()
    results: dict[str, list[dict]] = {"kept": [], "collector on": []}
    for _ in range(options.repeats):
        results["kept"].append(probe(kept=True))
        results["collector on"].append(probe(kept=False))
    print(f"{'imports':32} {'median CPU s':>13} {'min CPU s':>10} {'collections':>12} {'in collector s':>15}")
    medians = {}
    for variant, runs in results.items():
        for key, label in (("package_cpu_s", "import hf_lora_ds"), ("run_imports_cpu_s", "+ a run's imports")):
            values = [r[key] for r in runs]
            medians[variant, key] = statistics.median(values)
            print(
                f"{label + ' (' + variant + ')':32} {medians[variant, key]:13.2f} {min(values):10.2f} "
                f"{statistics.median(r['collections'] for r in runs):12.0f} "
                f"{statistics.median(r['collector_s'] for r in runs):15.2f}"
            )
        full = statistics.median(r["full_collection_s"] for r in runs)
        print(f"{'a full collection after (' + variant + ')':32} {full:13.3f}")
        medians[variant, "full_collection_s"] = full
    for key, label in (
        ("package_cpu_s", "import hf_lora_ds"),
        ("run_imports_cpu_s", "a run's imports"),
        ("full_collection_s", "a full collection after them"),
    ):
        ratio = medians["kept", key] / medians["collector on", key]
        print(f"{label}: kept from the collector / collector on = {ratio:.2f}")


if __name__ == "__main__":
    main()
