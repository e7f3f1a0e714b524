#!/usr/bin/env bash
# The lent GPU's one command (the device tool runs it from the repository root, .whl/ carried; bench/gpu/README.md):
#
#   bash bench/gpu/device_run.sh                                  # every stage, ends by ~7.5 min
#   bash bench/gpu/device_run.sh --stages build speed --shapes 1.5b-packed   # a rerun that fits what is left
#
# Installs the carried wheels (bench/gpu/wheels.sh) without an index, then runs run_acceptance.py with a deadline
# that ends every stage by DEADLINE_S seconds (420: each stage's budget is cut to what is left), under a hard
# LIMIT_S that leaves the device tool's 600 s limit and the session's 15 minutes room for one partial rerun. The
# results land in $OUT, at most 8 files as the tool brings back: gpu_acceptance.json and .md, doctor.txt,
# stages.log, profiles.json, profiles.txt and run.log (the gpu_tests stage's junit XML stays in the work folder).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-gpu_acceptance}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site --find-links .whl \
    -r .whl/requirements.txt || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
timeout --kill-after=15 "${LIMIT_S:-450}" python3 bench/gpu/run_acceptance.py --out "$out" \
    --deadline_s "${DEADLINE_S:-420}" "$@" 2>&1 | tee "$out/run.log"
