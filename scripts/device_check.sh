#!/usr/bin/env bash
# The one script run on the device machine. Call it with the device tool as
#   command: LUCEBOX_GIT_COMMIT=<sha> bash scripts/device_check.sh
#   carry:   [".whl", ".gl/dflash", "build/h200-sm90/liblucebox.so"]   (build it here first: make build PROFILE=h200-sm90)
# It installs the carried wheels (the device has no gguf), uses the carried library (else builds), runs every
# gpu test, then the benches: `lucebox bench speed` on the random-weight 0.8B (pp520 / tg128), the 27B quantized
# GEMV bandwidth table, the 27B DeltaNet/attention op timings, and the full random 27B (scripts/device_27b.sh:
# pp520, tg128, tg128 at depth 4096, the 23-slot verify, `lucebox run`). About 6 minutes with everything.
# Results: $OUT/summary.txt (every headline line), $OUT/bench.md, and every log in $OUT/results.tgz (the device
# tool returns at most 8 files).
# Knobs: SKIP_TESTS=1 (benches only), TESTS="tests/gpu/x.py ..." (a subset), BENCHES="speed quant gdn 27b" (which
# benches; "none" for tests only; "ncu" adds scripts/ncu_kernels.sh's counters; "ring" adds the 0.8B weight-ring A/B, RINGS="auto,2x2048,..." its list),
# LUCEBOX_BUILD_DIR=dir (use dir/$PROFILE/liblucebox.so, e.g. a carried .cache/<name>-build), AB_ENV="VAR=a VAR=b"
# (the GEMV rows and the 27B bench again under each assignment of a runtime knob; AB_ENV_27B: another list
# for the 27B bench alone; AB_ENV_SPEED: the 0.8B speed bench's pp row again under each), AB_PREFILL="own cublas" (the speed bench's pp row again under each
# LUCEBOX_PREFILL_GEMM value: the 0.8B prefill GEMMs on our kernel vs a run-time cuBLAS).
set -u -o pipefail
OUT=${OUT:-/tmp/lucebox_out}
PROFILE=${PROFILE:-h200-sm90}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LUCEBOX_GIT_COMMIT=${LUCEBOX_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/setup.log" 2>&1 || echo "wheel install failed (see setup.log)"
export PYTHONPATH=/tmp/site:$PWD
S="$OUT/summary.txt"
{ echo "commit $LUCEBOX_GIT_COMMIT"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader; } | tee "$S"

lib=${LUCEBOX_BUILD_DIR:-build}/$PROFILE/liblucebox.so
if [ -f "$lib" ]; then
  # the library must export every function of this tree's C ABI table (a library built from another commit
  # than the tree the device tool copied wastes the whole call): refuse in seconds, before any test
  python3 - "$lib" <<'PY' || { echo "the carried $lib does not match this tree (see above): build it from this commit" | tee -a "$S"; exit 1; }
import sys
from pathlib import Path
from lucebox_cli.engines._lib import open_lib
print("carried library:", open_lib(Path(sys.argv[1])).build_info()["commit"])
PY
  echo "using the carried $lib" | tee -a "$S"
else
  echo "== build" | tee -a "$S"
  make build PROFILE="$PROFILE" PY=python3 -j"$(nproc)" >> "$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
fi

if [ -z "${SKIP_TESTS:-}" ]; then  # SKIP_TESTS=1: benches only (when only bench code changed)
  echo "== gpu tests" | tee -a "$S"
  # the whole gpu suite took ~420 s of tests at e625fd6 (1,025 tests: 866 ran in 300 s): 450 by default
  timeout "${TEST_TIMEOUT:-450}" python3 -m pytest -m gpu ${TESTS:-tests/gpu} -q -p no:cacheprovider -rfE ${PYTEST_ARGS:-} \
    > "$OUT/gpu_tests.log" 2>&1
  rc=$?
  echo "pytest rc=$rc$([ $rc -eq 124 ] && echo " (timed out: raise TEST_TIMEOUT; the log shows how far it got)")" | tee -a "$S"
  grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | tail -30 | tee -a "$S"
fi

BENCHES=${BENCHES:-speed quant gdn 27b}
if [[ " $BENCHES " == *" speed "* ]]; then
echo "== bench speed (0.8B, random weights)" | tee -a "$S"
MODEL=/tmp/random-qwen3.5-0.8b
python3 scripts/make_random_08b.py "$MODEL" --no-gguf >> "$OUT/setup.log" 2>&1 || echo "model write failed" | tee -a "$S"
timeout 150 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' \
  bench speed "$MODEL" -p "${PP:-520}" -n "${TG:-128}" -r "${REPS:-5}" --json > "$OUT/bench.json" 2>> "$OUT/setup.log"
echo "bench rc=$?" | tee -a "$S"
python3 -c 'import json,sys; from lucebox_cli.bench.report import render; print(render(json.load(open(sys.argv[1])), "md"))' \
  "$OUT/bench.json" > "$OUT/bench.md" 2>> "$OUT/setup.log" && cat "$OUT/bench.md" | tee -a "$S"
gemm_line='import json,sys; i=(json.load(open(sys.argv[1])) or [{}])[0].get("engine_info") or {}; print("prefill gemm:", i.get("prefill_gemm"), "| attn:", i.get("prefill_attn"), "| cublas:", i.get("cublas"), "|", i.get("prefill_gemm_note") or "")'
python3 -c "$gemm_line" "$OUT/bench.json" 2>> "$OUT/setup.log" | tee -a "$S"
for ab in ${AB_ENV_SPEED:-}; do  # pp only, once per assignment (e.g. LUCEBOX_DN_SCAN=split2), commas set several
  echo "== bench speed pp${PP:-520}, $ab" | tee -a "$S"
  env ${ab//,/ } timeout 120 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' \
    bench speed "$MODEL" -p "${PP:-520}" -n 0 -r "${REPS:-5}" --json > "$OUT/bench_pp_ab.json" 2>> "$OUT/setup.log"
  python3 -c 'import json,sys; from lucebox_cli.bench.report import render; print(render(json.load(open(sys.argv[1])), "md"))' \
    "$OUT/bench_pp_ab.json" 2>> "$OUT/setup.log" | grep -E "pp[0-9]" | tee -a "$S"
done
for g in ${AB_PREFILL:-}; do  # pp only, once per GEMM path
  echo "== bench speed pp${PP:-520}, LUCEBOX_PREFILL_GEMM=$g" | tee -a "$S"
  LUCEBOX_PREFILL_GEMM="$g" timeout 120 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' \
    bench speed "$MODEL" -p "${PP:-520}" -n 0 -r "${REPS:-5}" --json > "$OUT/bench_pp_$g.json" 2>> "$OUT/setup.log"
  echo "bench rc=$?" | tee -a "$S"
  python3 -c 'import json,sys; from lucebox_cli.bench.report import render; print(render(json.load(open(sys.argv[1])), "md"))' \
    "$OUT/bench_pp_$g.json" 2>> "$OUT/setup.log" | grep -E "pp[0-9]" | tee -a "$S"
  python3 -c "$gemm_line" "$OUT/bench_pp_$g.json" 2>> "$OUT/setup.log" | tee -a "$S"
done

fi

if [[ " $BENCHES " == *" ring "* ]]; then  # 0.8B megakernel: tg128 per weight-ring depth (scripts/ab_mk_ring.py)
echo "== 0.8B megakernel weight-ring A/B" | tee -a "$S"
timeout 150 python3 scripts/ab_mk_ring.py ${RINGS:+--rings "$RINGS"} --json "$OUT/ab_mk_ring.json" > "$OUT/ab_mk_ring.log" 2>&1
echo "ring A/B rc=$?" | tee -a "$S"
grep -E "^ring|Error|error" "$OUT/ab_mk_ring.log" | tail -12 | tee -a "$S"
fi

if [[ " $BENCHES " == *" quant "* ]]; then
echo "== 27B quantized GEMV bandwidth" | tee -a "$S"
timeout 90 python3 tests/gpu/test_quant_gemv.py --bench > "$OUT/quant_gemv.log" 2>&1
tail -22 "$OUT/quant_gemv.log" | tee -a "$S"
for ab in ${AB_ENV:-}; do  # the n = 1 K-quant rows again under each A/B assignment (see device_27b.sh)
  echo "== GEMV rows, $ab" | tee -a "$S"
  env ${ab//,/ } timeout 60 python3 tests/gpu/test_quant_gemv.py --gemv-bench > "$OUT/quant_gemv_$(echo "$ab" | tr -c 'A-Za-z0-9_\n' '_').log" 2>&1
  tail -24 "$OUT/quant_gemv_$(echo "$ab" | tr -c 'A-Za-z0-9_\n' '_').log" | tee -a "$S"
done

fi

if [[ " $BENCHES " == *" gdn "* ]]; then
echo "== 27B DeltaNet / attention op timings" | tee -a "$S"
timeout 90 python3 scripts/bench_gdn_attn.py --json "$OUT/gdn_attn.json" > "$OUT/gdn_attn.log" 2>&1
tail -14 "$OUT/gdn_attn.log" | tee -a "$S"
fi

if [[ " $BENCHES " == *" 27b "* ]]; then
echo "== full random 27B (scripts/device_27b.sh)" | tee -a "$S"
mkdir -p "$OUT/27b"
AB_ENV="${AB_ENV_27B-${AB_ENV:-}}" OUT="$OUT/27b" SKIP_WHEELS=1 bash scripts/device_27b.sh > "$OUT/27b/stdout.txt" 2>&1
grep -E "pp520|tg128|verify23|rc=|^== |^   |PDL" "$OUT/27b/summary.txt" | tee -a "$S"
fi

if [[ " $BENCHES " == *" ncu "* ]]; then  # hardware counters of the next levers' kernels (scripts/ncu_kernels.sh; NCU_CASES)
echo "== ncu (scripts/ncu_kernels.sh)" | tee -a "$S"
OUT="$OUT" bash scripts/ncu_kernels.sh 2>&1 | tee -a "$S"
fi

# at most 8 files come back: everything but the summary and the table goes into one archive
( cd "$OUT" && tar czf /tmp/results.tgz --exclude=./summary.txt --exclude=./bench.md . && mv /tmp/results.tgz . \
  && find . -mindepth 1 -depth ! -path ./results.tgz ! -path ./summary.txt ! -path ./bench.md -delete )
