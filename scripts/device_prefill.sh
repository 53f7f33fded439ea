#!/usr/bin/env bash
# Device run for the tensor-core prefill: build (unless a carried build/h200-sm90 .so loads), the op
# tests, pp520 timing with a per-op breakdown, then the whole-model gpu tests. From the repo root:
#   bash scripts/device_prefill.sh     (run tool: carry [".whl", "build/pf/h200-sm90/liblucebox.so"], LUCEBOX_BUILD_DIR=build/pf)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || echo "wheel install failed"
PROFILE=h200-sm90
export LUCEBOX_BUILD_DIR=${LUCEBOX_BUILD_DIR:-build}
if ! python -c "from lucebox_cli.engines import _lib; _lib.load('$PROFILE')" 2>/dev/null; then
  echo "== building $PROFILE"
  make -j16 build PROFILE=$PROFILE PY=python BUILD_DIR=$LUCEBOX_BUILD_DIR 2>&1 | tail -3
fi
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
T=tests/gpu/test_prefill.py
echo "== op tests"
timeout 60 python -m pytest -q -s -p no:cacheprovider --tb=short $T -k "gemm or deltanet or attn" 2>&1 | grep -v "^$" | tail -40
echo "== pp520 timing"
timeout 70 python scripts/bench_prefill.py -p 520 -r 10 2>&1 | tail -16
echo "== whole-model tests"
timeout 140 python -m pytest -q -s -p no:cacheprovider --tb=short $T -k "not gemm and not deltanet and not attn" 2>&1 | grep -v "^$" | tail -40
echo "== commit $(git rev-parse --short HEAD 2>/dev/null)"
