#!/usr/bin/env bash
# A/B of the 0.8B megakernel's grid-barrier variants (cuda/megakernel/mk_common.cuh grid_barrier, switch
# LUCEBOX_MK_BARRIER=0..3, read once per process), on the device machine:
#   command: VARIANTS="0 1 2 3" bash scripts/device_mk_barrier.sh
#   carry:   [".whl", "build/h200-sm90/liblucebox.so", ".cache/prof7/h200-sm90/liblucebox.so"]
# The second library is an MK_PROFILE build (make build PROFILE=h200-sm90 LUCEBOX_BUILD_DIR=.cache/prof7
# EXTRA_FLAGS=-DMK_PROFILE); without it only the tg rows run. Per variant: `lucebox bench speed` pp520/tg128 on the
# random-weight 0.8B (REPS repetitions after a warm-up), then the all-block timeline (scripts/mk_profile_blocks.py).
# Results: $OUT/summary.txt and one log per run.
set -u -o pipefail
OUT=${OUT:-/tmp/lucebox_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 LUCEBOX_GIT_COMMIT=${LUCEBOX_GIT_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  > "$OUT/setup.log" 2>&1 || echo "wheel install failed (see setup.log)"
export PYTHONPATH=/tmp/site:$PWD
S="$OUT/summary.txt"
{ echo "commit $LUCEBOX_GIT_COMMIT"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader; } | tee "$S"
MODEL=/tmp/random-qwen3.5-0.8b
python3 scripts/make_random_08b.py "$MODEL" --no-gguf >> "$OUT/setup.log" 2>&1 || echo "model write failed" | tee -a "$S"
bench() { timeout 150 python3 -c 'import sys; from lucebox_cli.cli.app import main; main(sys.argv[1:])' bench speed "$@"; }
for v in ${VARIANTS:-0 1 2 3}; do
  echo "== barrier $v" | tee -a "$S"
  if [ -z "${SKIP_TESTS:-}" ]; then  # the megakernel's own gpu tests under this variant
    LUCEBOX_MK_BARRIER=$v timeout 200 python3 -m pytest -m gpu tests/gpu/test_megakernel.py -q -p no:cacheprovider \
      -k "logits_match or greedy or stream_equals or recurrent_state" > "$OUT/tests_$v.log" 2>&1
    tail -1 "$OUT/tests_$v.log" | tee -a "$S"
  fi
  LUCEBOX_MK_BARRIER=$v bench "$MODEL" -p 520 -n "${TG:-128}" -r "${REPS:-3}" > "$OUT/tg_$v.md" 2>> "$OUT/setup.log"
  grep -E "tg[0-9]|pp[0-9]" "$OUT/tg_$v.md" | tee -a "$S"
done
if [ -f .cache/prof7/h200-sm90/liblucebox.so ]; then
  for v in ${PROF_VARIANTS:-${VARIANTS:-0 1 2 3}}; do
    echo "== barrier $v timeline (MK_PROFILE build)" | tee -a "$S"
    LUCEBOX_BUILD_DIR=.cache/prof7 LUCEBOX_MK_BARRIER=$v bench "$MODEL" -p 520 -n 8 -r 1 > "$OUT/prof_$v.txt" 2>> "$OUT/setup.log"
    python3 scripts/mk_profile_blocks.py "$OUT/prof_$v.txt" 2>&1 | tee -a "$S" | tail -25
  done
fi
tar czf "$OUT/logs.tgz" -C "$OUT" --exclude logs.tgz . 2>/dev/null
