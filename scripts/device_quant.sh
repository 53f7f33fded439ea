#!/usr/bin/env bash
# Device run for the quantized matrix ops (issue 7, item 1): build for the H200, run every gpu test
# case of tests/gpu/test_quant_gemv.py in script mode (no pytest needed there), then the bandwidth table.
#   run: carry [".whl"], command: bash scripts/device_quant.sh
set -o pipefail
OUT=${OUT:-/tmp/lbq_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
# Only this op's objects and the core are needed, but the library links every .cu: build in parallel.
time make build PROFILE=h200-sm90 PY=python3 -j16 2>&1 | grep -E "error|warning|lucebox:" | tee "$OUT/build.log"
test -f build/h200-sm90/liblucebox.so || { echo "build failed"; exit 1; }
git rev-parse --short=12 HEAD | tee "$OUT/commit.txt"
timeout 150 python3 tests/gpu/test_quant_gemv.py --bench 2>&1 | tee "$OUT/quant_gemv.log"
