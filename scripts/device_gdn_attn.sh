#!/usr/bin/env bash
# Device run for the 27B DeltaNet / attention ops (issue 7, items 2 and 3): build the library for the
# H200, run tests/gpu/test_gdn_ops.py and tests/gpu/test_attn_ops.py, then time the ops at the 27B
# shapes (scripts/bench_gdn_attn.py, needs torch). Everything lands under $OUT.
#   run: command: bash scripts/device_gdn_attn.sh   (no wheels needed; PROFILE=rtx3090-sm86 on a 3090)
set -u -o pipefail
OUT=${OUT:-/tmp/lb_gdn_attn_out}
PROFILE=${PROFILE:-h200-sm90}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short=12 HEAD 2>/dev/null | tee "$OUT/commit.txt"

echo "== build ($PROFILE)"
make build PROFILE="$PROFILE" PY=python3 -j"$(nproc)" > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }

echo "== gpu tests"
timeout "${TEST_TIMEOUT:-420}" python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gdn_ops.py \
  tests/gpu/test_attn_ops.py ${PYTEST_ARGS:-} > "$OUT/gdn_attn_tests.log" 2>&1
rc=$?
echo "pytest rc=$rc"
grep -E "passed|failed|error" "$OUT/gdn_attn_tests.log" | tail -5
grep -E "^(FAILED|ERROR)" "$OUT/gdn_attn_tests.log" | head -40

echo "== bench (27B shapes)"
timeout 120 python3 scripts/bench_gdn_attn.py --json "$OUT/bench_gdn_attn.json" 2>&1 | tee "$OUT/bench.log" | tail -12
exit $rc
