#!/usr/bin/env bash
# Device run for the quantized matrix ops (issue 7, item 1): every gpu test case of
# tests/gpu/test_quant_gemv.py in script mode (no pytest needed there) and the bandwidth table.
#   run: carry [".whl", ".cache/<you>-build/qmm"], command:
#        LUCEBOX_QMM_LIB=$PWD/.cache/<you>-build/qmm/libqmm.so bash scripts/device_quant.sh
# With LUCEBOX_QMM_LIB unset it builds that library there (core + these ops only, ~1 min of device time);
# build it here instead with the same nvcc lines and carry it.
set -o pipefail
OUT=${OUT:-/tmp/lbq_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || echo "wheel install failed"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short=12 HEAD | tee "$OUT/commit.txt"
if [ -z "${LUCEBOX_QMM_LIB:-}" ]; then
    # The library of just the core and these ops (the full `make build` also compiles every other op).
    F="-O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden --expt-relaxed-constexpr -arch=sm_90 -Icuda/include -Icuda/common"
    mkdir -p /tmp/qmm
    for f in cuda/core/errors.cu cuda/core/pdl.cu cuda/ops/gemv_q.cu cuda/ops/gemm_q_smalln.cu cuda/ops/quant_repack.cu \
        cuda/ops/dev_buffers.cu; do nvcc $F -c $f -o /tmp/qmm/$(basename $f).o & done
    wait
    nvcc -shared -cudart static -arch=sm_90 /tmp/qmm/*.o -o /tmp/qmm/libqmm.so || exit 1
    export LUCEBOX_QMM_LIB=/tmp/qmm/libqmm.so
fi
export LUCEBOX_QMM_LIB
timeout 200 python3 tests/gpu/test_quant_gemv.py --bench 2>&1 | tee "$OUT/quant_gemv.log"
