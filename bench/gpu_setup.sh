# Sourced by bench/gpu_session.sh and bench/gpu_staged_check.sh (from the repository root):
# OUTDIR (the script's first argument, else $OUT, else /tmp/gpu-out), PY, BIN, `step`; the
# wheels in .whl/ and this checkout installed; the GPU, torch and the cache's kernels printed.
set -u
OUTDIR=${1:-${OUT:-/tmp/gpu-out}}
mkdir -p "$OUTDIR"
export PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}
step() { echo; echo "== $* ($(date +%T))"; }

step setup
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
fi
$PY -m pip install -q --no-index --no-deps --no-build-isolation -e . 2>&1 | tail -3
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
$PY -c "import torch, radixscope.cache.native as n; print('torch', torch.__version__, \
torch.version.cuda, torch.cuda.get_device_name(), '| cache kernels:', n.KERNELS)"
BIN=$(dirname "$($PY -c 'import sys; print(sys.executable)')")
