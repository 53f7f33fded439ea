#!/usr/bin/env bash
# Hardware counters (Nsight Compute) of the kernels the perf notes name as the next levers, on the device machine:
#   NCU_CASES="q6_qkv q6_down q4_gateup q4t_n23 q6t_n23 prep" OUT=... bash scripts/ncu_kernels.sh
# Each case profiles one cold launch (ncu flushes the caches between its replays) with the full section set and
# writes <case>.txt (the details page: speed of light, occupancy, warp states, memory chart) and <case>_sass.csv
# (per-instruction samples: where the warps stall) under $OUT/ncu/. --clock-control none: the clocks are left alone
# (METHOD.md). Needs the library built or carried (see device_check.sh) and PYTHONPATH set as it sets it.
set -u -o pipefail
OUT=${OUT:-/tmp/lucebox_out}
D="$OUT/ncu"
mkdir -p "$D"
NCU=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
[ -n "$NCU" ] || { echo "ncu not found"; exit 1; }
GEMV="tests/gpu/test_quant_gemv.py --bench-one"

# case name -> kernel-name regex, launches to skip, command
profile() {
  local name=$1 kre=$2 skip=$3; shift 3
  timeout "${NCU_TIMEOUT:-120}" "$NCU" --clock-control none --set full --import-source no -k "regex:$kre" \
    --launch-skip "$skip" -c 1 -f -o "$D/$name" "$@" > "$D/$name.log" 2>&1
  echo "ncu $name rc=$?"
  "$NCU" -i "$D/$name.ncu-rep" --page details > "$D/$name.txt" 2>&1
  "$NCU" -i "$D/$name.ncu-rep" --page source --print-source sass --csv > "$D/${name}_sass.csv" 2>&1
  grep -E "^  [a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Issue Slots Busy|Warp Cycles Per Issued|No Eligible|One or More" \
    "$D/$name.txt" | head -16
}

for c in ${NCU_CASES:-q6_qkv q6_down q4_gateup q4t_n23 q6t_n23 prep state output}; do
  case $c in
    q6_qkv)    profile "$c" "gemv|qmm" 1 python3 $GEMV Q6_K_T 10240 5120 2 ;;
    q6_down)   profile "$c" "gemv|qmm" 1 python3 $GEMV Q6_K_T 5120 17408 2 ;;
    q4_gateup) profile "$c" "gemv|qmm" 1 python3 $GEMV Q4_K_T 34816 5120 2 ;;
    q4_ssmout) profile "$c" "gemv|qmm" 1 python3 $GEMV Q4_K_T 5120 6144 2 ;;
    q4t_n23)   profile "$c" "smalln|qmm" 1 python3 $GEMV Q4_K_T 34816 5120 2 23 ;;
    q6t_n23)   profile "$c" "smalln|qmm" 1 python3 $GEMV Q6_K_T 5120 17408 2 23 ;;
    prep)      profile "$c" "prep_kernel" 0 python3 scripts/bench_prefill.py -p 520 -r 1 --no-ops ;;
    state)     profile "$c" "tc_state" 0 python3 scripts/bench_prefill.py -p 520 -r 1 --no-ops ;;
    output)    profile "$c" "tc_output" 0 python3 scripts/bench_prefill.py -p 520 -r 1 --no-ops ;;
    *) echo "unknown ncu case $c" ;;
  esac
done
