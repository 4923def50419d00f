#!/usr/bin/env bash
# The staged copy path and the model's pinned uploads on a GPU, in one short go (about 4-6
# minutes on an H100 / H200):
#   bash bench/gpu_staged_check.sh [OUTDIR]
# 1. the gpu-marked transfer tests (tests/cache/test_gpu.py: both paths, the CUDA fuzzer on
#    each; tests/cache/test_gpu_staged.py: transfers in flight at once on fragmented pools,
#    every component set, the match contract, the uploads' ring) and their CPU counterparts;
# 2. bench/bench_gpu.py: memcpy2d and staged rows for every case, and the tiny-frag case (the
#    default preset's 256 B a token, page 1, scattered), against the copy ceiling;
# 3. `radixscope run --device cuda` (the default preset; content verified bit for bit) and the
#    same run on the CPU, for the insert / load_back / transfer latencies side by side.
# Logs and results land in OUTDIR (default $OUT, else /tmp/gpu-out). Wheels a machine lacks:
# see bench/gpu_session.sh.
source bench/gpu_setup.sh "$@"

step gpu tests
timeout 300 $PY -m pytest -v -p no:cacheprovider -rs --durations=8 \
    tests/cache/test_gpu.py tests/cache/test_gpu_staged.py tests/cache/test_staged.py \
    tests/engine/test_uploads.py > "$OUTDIR/gpu_staged_tests.log" 2>&1
echo "pytest rc=$?"
grep -E "FAILED|ERROR|passed|failed|skipped" "$OUTDIR/gpu_staged_tests.log" | tail -40

step transfer bench
timeout 150 $PY bench/bench_gpu.py --reps 3 --json "$OUTDIR/bench_gpu_staged.json" 2>&1 \
    | tee "$OUTDIR/bench_gpu_staged.log"

step radixscope run, cuda then cpu
timeout 60 "$BIN/radixscope" run --device cuda --store /tmp/gpu-staged-run.db --no-progress \
    2>&1 | tee "$OUTDIR/run_cuda.log"
timeout 30 "$BIN/radixscope" run --device cpu --no-store --no-progress 2>&1 \
    | tee "$OUTDIR/run_cpu.log" | grep -E "insert|load_back|transfer|content"
step done
