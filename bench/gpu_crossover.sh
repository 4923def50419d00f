#!/usr/bin/env bash
# Where the staged path and a DMA a run cross (TransferEngine.staged_below): single-slot pages
# scattered, the bytes a slot swept from 64 B to 64 KiB (finer from 16 KiB on), with 2 rows
# (1 layer) and with 64 rows (32 layers) a slot; `bench/bench_gpu.py` times both paths on
# each, wall clock included. About 2 minutes on an H200; its results: bench/RESULTS.md,
# "Third GPU session".
#   bash bench/gpu_crossover.sh [OUTDIR]
source bench/gpu_setup.sh "$@"
sweep() {  # layers heads head_dims...
    local layers=$1 heads=$2; shift 2
    for d in "$@"; do
        echo "# layers $layers heads $heads head_dim $d: $((layers * 2 * heads * d * 2)) B a slot"
        timeout 60 $PY bench/bench_gpu.py --tokens 2048 --layers "$layers" --heads "$heads" \
            --head-dim "$d" --pages 1 --reps 3 --tiny-tokens 0 2>&1 | grep -E "fragmented|Error"
    done
}
step "crossover, 2 rows a slot"
sweep 1 2 8 32 128 512 2048 3072 4096 6144 8192 | tee "$OUTDIR/crossover_2rows.log"
step "crossover, 64 rows a slot"
sweep 32 1 2 8 32 128 192 256 384 512 | tee "$OUTDIR/crossover_64rows.log"
step done
