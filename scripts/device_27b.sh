#!/usr/bin/env bash
# Device run: the first full-size 27B (issue 7, items 4-6). Writes the random-weight Qwen3.5-27B Q4_K_M
# (scripts/make_random_27b.py, ~16.6 GB, real shapes and llama.cpp's per-tensor mix), then
#   lucebox bench speed FILE --engine cuda -p 520 -n 128 -d 4096 --verify-n 23 -r 3 --json
#   (rows pp520, tg128, tg128@d4096, verify23 in AR-step units) and
#   lucebox run FILE --engine cuda --spec none --max-tokens 16   (it generates).
# The library is built on the dev box and carried, so no device time goes into nvcc:
#   make build PROFILE=h200-sm90 LUCEBOX_BUILD_DIR=.cache/<you>-build
#   run: command: LUCEBOX_GIT_COMMIT=<sha> LUCEBOX_BUILD_DIR=.cache/<you>-build bash scripts/device_27b.sh
#        carry: [".whl", ".cache/<you>-build/h200-sm90/liblucebox.so"]
# The file goes to /dev/shm when it has room (RAM, no disk write, and the engine's memory map reads it
# from there), else /tmp. Every stage has its own timeout so one slow stage still leaves the logs; the
# whole run was planned for < 7 minutes (write ~1 min, two loads of ~20 s, benches ~1 min).
# Results under $OUT: summary.txt, make.log, bench27.json, bench27.log, run27.json, run27.log.
set -u -o pipefail
OUT=${OUT:-/tmp/lb_27b_out}
PROFILE=${PROFILE:-h200-sm90}
mkdir -p "$OUT"
S="$OUT/summary.txt"
export PYTHONUNBUFFERED=1 LUCEBOX_GIT_COMMIT=${LUCEBOX_GIT_COMMIT:-unknown}
export LUCEBOX_BUILD_DIR=${LUCEBOX_BUILD_DIR:-build}
if [ -z "${SKIP_WHEELS:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/make.log" 2>&1 || echo "wheel install failed (see make.log)" | tee -a "$S"
fi
export PYTHONPATH=/tmp/site:$PWD
LB=(python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])')
{ echo "commit $LUCEBOX_GIT_COMMIT, library $LUCEBOX_BUILD_DIR/$PROFILE"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
  echo "cpus $(nproc), $(free -g | awk '/Mem:/ {print $2 " GB RAM, " $7 " GB available"}')"
  df -h /dev/shm /tmp | tail -2; } 2>&1 | tee -a "$S"
[ -f "$LUCEBOX_BUILD_DIR/$PROFILE/liblucebox.so" ] || { echo "no $LUCEBOX_BUILD_DIR/$PROFILE/liblucebox.so carried" | tee -a "$S"; exit 1; }

DIR=/tmp
shm_free_gb=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
[ "${shm_free_gb:-0}" -ge 24 ] && DIR=/dev/shm
F=$DIR/random-qwen3.5-27b-Q4_K_M.gguf

echo "== write $F" | tee -a "$S"
t0=$SECONDS
# MAKE_ARGS (e.g. "--layers 4 --hidden 256 --ffn 512") only for a dry run of this script on a small file
timeout "${MAKE_TIMEOUT:-120}" python3 scripts/make_random_27b.py "$F" ${MAKE_ARGS:-} >> "$OUT/make.log" 2>&1
rc=$?
echo "make rc=$rc in $((SECONDS - t0)) s" | tee -a "$S"
tail -c 300 "$OUT/make.log" | tr '\r' '\n' | tail -1 | tee -a "$S"
[ $rc -eq 0 ] || exit 1

echo "== bench speed (pp520, tg128, tg128@d4096, verify23)" | tee -a "$S"
t0=$SECONDS
timeout "${BENCH_TIMEOUT:-220}" "${LB[@]}" bench speed "$F" --engine cuda -p 520 -n 128 -d 4096 --verify-n 23 -r 3 \
  --json > "$OUT/bench27.json" 2> "$OUT/bench27.log"
echo "bench rc=$? in $((SECONDS - t0)) s" | tee -a "$S"
python3 - "$OUT/bench27.json" <<'PY' 2>> "$OUT/bench27.log" | tee -a "$S"
import json, sys
rows = json.load(open(sys.argv[1]))
print("engine info", rows[0].get("engine_info"), "gpu", rows[0].get("gpu"), "commit", rows[0].get("commit"))
for r in rows:
    extra = ""
    if r.get("verify_ms"):
        extra = " | verify %.2f ms = %.2f AR steps (AR step %.2f ms)" % (r["verify_ms"], r["verify_in_steps"],
                                                                        r["ar_step_ms"])
    bw = " %.0f GB/s (%.1f%% of measured)" % (r["gbps"], r["pct_bw_measured"] or 0) if r.get("gbps") else ""
    print("%14s %9.2f ± %.2f tok/s%s%s  tok/J %s" % (r["test"], r["tok_s"], r["sd"], bw, extra, r.get("tok_per_j")))
PY
grep -E "^(error|hint)|Error|Traceback" "$OUT/bench27.log" | head -6 | tee -a "$S"

if [ -z "${SKIP_PROFILE:-}" ]; then  # kernel timeline of one step and one verify (torch.profiler; SKIP_PROFILE=1 skips)
  echo "== kernel timeline (scripts/profile_27b_step.py)" | tee -a "$S"
  timeout "${PROFILE_TIMEOUT:-90}" python3 scripts/profile_27b_step.py "$F" --prefill-selects "${PREFILL_SELECTS:-0}" --json "$OUT/profile27.json" \
    > "$OUT/profile27.log" 2>&1
  echo "profile rc=$?" | tee -a "$S"
  grep -E "^== |^   " "$OUT/profile27.log" | head -200 | tee -a "$S"
fi

# AB_ENV="VAR=a VAR=b ...": the same bench (no depth row) once per assignment, for A/B runs of a runtime knob
# (an assignment may set several knobs at once: "A=0,B=0")
# (e.g. LUCEBOX_GEMV_PREFETCH=0, LUCEBOX_PDL=1); AB_PDL=1 is AB_ENV=LUCEBOX_PDL=1.
AB_ENV=${AB_ENV:-${AB_PDL:+LUCEBOX_PDL=1}}
for ab in ${AB_ENV:-}; do
  tag=$(echo "$ab" | tr -c 'A-Za-z0-9_\n' '_')
  echo "== bench speed, $ab (A/B)" | tee -a "$S"
  env ${ab//,/ } timeout "${BENCH_TIMEOUT:-220}" "${LB[@]}" bench speed "$F" --engine cuda -p 520 -n 128 --verify-n 23 -r 3 \
    --json > "$OUT/bench27_$tag.json" 2> "$OUT/bench27_$tag.log"
  echo "bench ($ab) rc=$?" | tee -a "$S"
  python3 - "$OUT/bench27_$tag.json" "$ab" <<'PY' 2>> "$OUT/bench27_$tag.log" | tee -a "$S"
import json, sys
for r in json.load(open(sys.argv[1])):
    extra = " | verify %.2f ms = %.2f AR steps" % (r["verify_ms"], r["verify_in_steps"]) if r.get("verify_ms") else ""
    print("%14s %9.2f ± %.2f tok/s (%s)%s" % (r["test"], r["tok_s"], r["sd"], sys.argv[2], extra))
PY
done

echo "== lucebox run --spec none --max-tokens 16" | tee -a "$S"
t0=$SECONDS
timeout "${RUN_TIMEOUT:-50}" "${LB[@]}" run "$F" --engine cuda --spec none --max-tokens 16 \
  --prompt "The capital of France is" --json > "$OUT/run27.json" 2> "$OUT/run27.log"
echo "run rc=$? in $((SECONDS - t0)) s" | tee -a "$S"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: v for k, v in d.items() if k != "text"})' \
  "$OUT/run27.json" 2>> "$OUT/run27.log" | tee -a "$S"
grep -E "^(error|hint)|Error|Traceback" "$OUT/run27.log" | head -6 | tee -a "$S"
# KEEP_MODEL=1: leave the 16.6 GB file for a later command of the same device call (it prints where)
if [ -n "${KEEP_MODEL:-}" ]; then echo "kept $F" | tee -a "$S"; else rm -f "$F"; fi
