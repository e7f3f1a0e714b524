#!/usr/bin/env bash
# JIT-build DeepSpeed's CPU ops once per CI run, before any test launches DeepSpeed.
#
# Why: on the CPU accelerator DeepSpeed compiles shm_comm (every multi-rank launch) and cpu_adam (every
# *_offload config) with ninja on first use, ~1-3 min each on 2 cores. Left to the tests, the first launch of
# each op pays it inside a test timeout, and two ranks (or two tests) may race on the same build directory.
# Built here, every later launch loads the cached .so from $TORCH_EXTENSIONS_DIR (default
# ~/.cache/torch_extensions); cache that directory between CI runs, keyed on the torch + deepspeed versions.
#
# Usage: .ci/prebuild_deepspeed_ops.sh [BuilderName ...]   (default: ShareMemCommBuilder CPUAdamBuilder)
set -euo pipefail

if [ "$#" -eq 0 ]; then
  set -- ShareMemCommBuilder CPUAdamBuilder
fi

python - "$@" <<'PY'
import sys
import time

from deepspeed.accelerator import get_accelerator

accelerator = get_accelerator()
for name in sys.argv[1:]:
    builder = accelerator.create_op_builder(name)
    if builder is None or not builder.is_compatible():
        sys.exit(f"DeepSpeed op builder {name} is not available on accelerator {accelerator.device_name()}")
    start = time.perf_counter()
    builder.load()
    print(f"{name}: ready in {time.perf_counter() - start:.1f} s ({accelerator.device_name()})", flush=True)
PY
