#!/bin/bash
# On the GPU machine: Nsight Compute counters for the attention stages, one launch each, while
# `sparseattn bench sparse` runs (len_kv 4096, independent lists: the third launch of each
# kernel). Prints time, tensor-pipe activity, L2 hit rate, instruction count and the stall
# reasons above 0.05 per issued instruction; full reports go to $OUT/ncu-KERNEL.txt.
#   bash scripts/device-ncu.sh [KERNEL_REGEX...]   (default: the kernels of stages 14, 15, 16)
# SA_NCU_BENCH="WORDS" runs `sparseattn bench WORDS` instead (for example "selectors --len-kv
# 16384 --selectors nvfp4/i1 --no-pipeline --reps 3" with the regexes amax_kernel quant_kernel);
# SA_NCU_SKIP sets --launch-skip (default 2). The metrics add DRAM and L2 throughput and the
# achieved occupancy, for kernels bound by memory or latency.
# Clocks are left alone (--clock-control none), as the device notes ask.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device-logs}
source scripts/device-pack.sh # more than 8 files in $OUT: packed on exit
mkdir -p "$out"
kernels=("$@")
[ ${#kernels[@]} -eq 0 ] && kernels=(dense_persistent block_sparse gqa_pairs)
# A build-gpu that exists (say, the GPU suite's, with tests) is used as it is configured.
if [ ! -f build-gpu/build.ninja ]; then
    meson setup build-gpu -Dcuda=enabled -Dtests=disabled >"$out/ncu-setup.log" 2>&1 ||
        { echo "meson setup failed"; tail -20 "$out/ncu-setup.log"; exit 1; }
fi
ninja -C build-gpu >"$out/ncu-build.log" 2>&1 || { grep -E "error" "$out/ncu-build.log" | head; exit 1; }
metrics="gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
metrics+=",sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active"
metrics+=",sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"
metrics+=",dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__throughput.avg.pct_of_peak_sustained_elapsed"
metrics+=",sm__warps_active.avg.pct_of_peak_sustained_active"
metrics+=",regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio"
read -r -a bench <<<"${SA_NCU_BENCH:-sparse --reps 3 --warmup 1}"
status=0
for k in "${kernels[@]}"; do
    timeout 150 ncu --clock-control none -k "regex:$k" --launch-skip "${SA_NCU_SKIP:-2}" -c 1 \
        --metrics "$metrics" build-gpu/tools/sparseattn bench "${bench[@]}" >"$out/ncu-$k.txt" 2>&1 ||
        status=1
    echo "== $k"
    grep -E "^\s+(gpu__time|sm__pipe|sm__inst|sm__warps|lts__t|dram__|smsp__issue_active|smsp__inst)" "$out/ncu-$k.txt"
    grep -E "issue_stalled" "$out/ncu-$k.txt" | awk '{ if ($NF + 0 > 0.05) print }'
done
exit $status
