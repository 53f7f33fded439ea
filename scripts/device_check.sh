#!/usr/bin/env bash
# The one script run on the device machine (call: `bash scripts/device_check.sh`, carry [".whl"]):
# install carried wheels, build for the H200, run the gpu tests, write the random 0.8B model, run
# `lucebox bench speed` (JSON + md). Everything lands under $OUT (at most 8 files come back).
set -u -o pipefail
OUT=${OUT:-/tmp/lucebox_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/setup.log" 2>&1 || echo "wheel install failed (see setup.log)"
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv | tee -a "$OUT/setup.log"

echo "== build"
make build PROFILE=h200-sm90 PY=python3 >> "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }

echo "== smoke (4 layers, 8 tokens; a hang here stops the script)"
timeout 90 python3 - > "$OUT/smoke.log" 2>&1 <<'PY'
import sys, time
sys.path.insert(0, "scripts")
import numpy as np
from make_random_08b import config_08b, random_internal_weights
from lucebox_cli.engines.megakernel import MegakernelEngine
cfg = config_08b(4)
eng = MegakernelEngine(cfg, random_internal_weights(cfg, 0), max_context=256)
print("info", eng.info)
lg = eng.prefill([1, 2, 3])
print("prefill argmax", int(np.argmax(lg)), "finite", bool(np.isfinite(lg).all()), "pending", eng.pending)
t = time.perf_counter(); toks = eng.decode(64); dt = time.perf_counter() - t
print("decode", toks[:8].tolist(), f"{64/dt:.0f} tok/s (4 layers)", eng.last_kernel_ms(), "ms kernel")
PY
rc=$?; cat "$OUT/smoke.log"; [ $rc -eq 0 ] || { echo "smoke failed rc=$rc"; exit 1; }

echo "== gpu tests"
timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu tests/gpu -q -s -p no:cacheprovider ${PYTEST_ARGS:-} \
  > "$OUT/gpu_tests.log" 2>&1
echo "pytest rc=$?"
tail -25 "$OUT/gpu_tests.log"

echo "== random model + bench"
MODEL=/tmp/random-qwen3.5-0.8b
python3 scripts/make_random_08b.py "$MODEL" ${GGUF:---no-gguf} >> "$OUT/setup.log" 2>&1 || echo "model write failed"
BENCH=(bench speed "$MODEL" -p "${PP:-520}" -n "${TG:-128}" -r "${REPS:-5}")

if python3 -c 'import lucebox_cli.cli.bench' 2>/dev/null; then
  timeout 240 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' "${BENCH[@]}" --json \
    > "$OUT/bench.json" 2> "$OUT/bench.err"
else
  timeout 240 python3 - "$MODEL" > "$OUT/bench.json" 2> "$OUT/bench.err" <<'PY'
import os, sys
from lucebox_cli.cli.bench_speed import run_speed
from lucebox_cli.bench.report import render
rows = run_speed(sys.argv[1], n_prompt=int(os.environ.get("PP", 520)), n_gen=int(os.environ.get("TG", 128)),
                 reps=int(os.environ.get("REPS", 5)), engine="cuda", profile=None, max_context=4096, warmup=1)
print(render(rows, "json"))
PY
fi
echo "bench rc=$?"
tail -5 "$OUT/bench.err"
python3 -c 'import json,sys; from lucebox_cli.bench.report import render; print(render(json.load(open(sys.argv[1])), "md"))' \
  "$OUT/bench.json" | tee "$OUT/bench.md"
