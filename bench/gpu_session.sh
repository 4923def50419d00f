#!/usr/bin/env bash
# The GPU checks in one go, on a machine with CUDA and a torch that sees it:
#   bash bench/gpu_session.sh [OUTDIR]
# the gpu-marked tests, the transfer bench against the copy ceiling, the profiler trace of the
# default run, `radixscope run --device cuda`, then the rest of the suite (no UI: it needs
# streamlit and a browser). Logs and results land in OUTDIR (default $OUT, else /tmp/gpu-out).
# Python packages the machine lacks can come as wheels in .whl/ (installed into the running
# Python's environment, so that the tests' subprocesses see them too), fetched where pip works:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
#     opentelemetry-api opentelemetry-sdk opentelemetry-semantic-conventions pyzmq msgspec redis
#   (and the OTLP / Prometheus exporters with their protobuf packages for their tests)
source bench/gpu_setup.sh "$@"

# the notebook tests need a Jupyter kernel (the dev extras), which such a machine may lack
IGNORE="--ignore=tests/engine/test_zoo.py --ignore=tests/telemetry/test_postmortem_notebook.py"
$PY -c "import nbclient, ipykernel" 2>/dev/null && IGNORE=""

step gpu tests
timeout 150 $PY -m pytest -v -p no:cacheprovider -m gpu -rs $IGNORE \
    tests/cache tests/telemetry tests/engine > "$OUTDIR/gpu_tests.log" 2>&1
grep -E "passed|failed|PASSED|FAILED|ERROR" "$OUTDIR/gpu_tests.log" | tail -40

step transfer bench
# BASELINE: another revision's cache/transfer_engine.py, run on the same cases
timeout 120 $PY bench/bench_gpu.py --rows ${BASELINE:+--baseline "$BASELINE"} \
    --json "$OUTDIR/bench_gpu.json" 2>&1 \
    | tee "$OUTDIR/bench_gpu.log"

step profiler trace: the default run, then at a real model shape
timeout 100 $PY bench/gpu_trace.py --out /tmp/gpu-trace 2>&1 | tee "$OUTDIR/trace.log"
cp /tmp/gpu-trace/trace.json.gz "$OUTDIR/" 2>/dev/null
timeout 120 $PY bench/gpu_trace.py --out /tmp/gpu-trace-8b --model 8b --requests 60 2>&1 \
    | tee "$OUTDIR/trace_8b.log"
cp /tmp/gpu-trace-8b/trace.json.gz "$OUTDIR/trace_8b.json.gz" 2>/dev/null

step radixscope run
timeout 60 "$BIN/radixscope" run --store /tmp/gpu-run.db --no-progress 2>&1 \
    | tee "$OUTDIR/run.log"

step suite
# what is left of BUDGET seconds (default 520) for the whole script
left=$(( ${BUDGET:-520} - SECONDS )); [ "$left" -lt 30 ] && left=30
timeout "$left" $PY -m pytest -q -p no:cacheprovider -n 12 -W ignore::UserWarning $IGNORE \
    --ignore=tests/ui --maxfail=30 tests > "$OUTDIR/suite.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" "$OUTDIR/suite.log" | tail -40
step done
