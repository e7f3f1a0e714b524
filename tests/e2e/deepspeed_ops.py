"""DeepSpeed's CPU Adam op (every ``*_offload`` config), JIT-built by ninja on first use, ~1-2 min on 2 cores, then
cached in ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``). Left to the launches, the first one to
need it would pay the build inside its timeout, and its ranks would race on the build directory. So the suite starts
the build in the background as it starts (tests/conftest.py), while the tests that need no launch run, and every e2e
worker waits for it before its first launch (tests/e2e/conftest.py); torch's build lock makes a second build wait
for the first and load its library. (DeepSpeed's other CPU op, the shared-memory allreduce, the package's runs never
build: hf_lora_ds._compat.)

    python tests/e2e/deepspeed_ops.py [BuilderName ...]   (default: CPUAdamBuilder)
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BUILDERS = ("CPUAdamBuilder",)


def command() -> list[str]:
    return [sys.executable, str(Path(__file__).resolve())]


def start_in_background(env: dict[str, str], log: Path) -> subprocess.Popen:
    """The build, in a session of its own, its output to ``log``; nobody waits for the process itself."""
    with open(log, "w") as out:
        return subprocess.Popen(command(), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def main(names: list[str]) -> None:
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    for name in names or BUILDERS:
        builder = accelerator.create_op_builder(name)
        if builder is None or not builder.is_compatible():
            sys.exit(f"DeepSpeed op builder {name} is not available on accelerator {accelerator.device_name()}")
        start = time.perf_counter()
        builder.load()
        print(f"{name}: ready in {time.perf_counter() - start:.1f} s ({accelerator.device_name()})", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
