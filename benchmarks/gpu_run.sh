#!/usr/bin/env bash
# The GPU check and benchmark in one command: the PyTorch and JAX engines'
# exactness tests on the GPU (TF32 off, tests/backend_harness.py), then
# bench_backends.py on the torch backend and on the jax backend, ending
# within 8 minutes.
#
# It needs a Linux machine with a CUDA GPU and python3 with PyTorch and JAX
# (CUDA builds) and NumPy installed; TensorFlow is not needed, and no network:
# the wheels it installs offline (keras, namex, optree, pytest, pluggy,
# iniconfig, pygments) go in .whl/ at the repository root (not tracked),
# fetched beforehand on a machine with network access with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux2014_x86_64 -d .whl keras==3.15.1 namex optree pytest pluggy iniconfig pygments
# (--python-version: the GPU machine's Python).
#
# Run from anywhere: bash benchmarks/gpu_run.sh. Logs, nvidia-smi's line and
# the benchmarks' JSON go to $OUT (default /tmp/bench_backends_out).
# BENCH_ARGS adds flags to both runs (e.g. BENCH_ARGS=--quick for a CPU try).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/bench_backends_out}"
mkdir -p "$OUT"
start=$SECONDS

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl && export PYTHONPATH=/tmp/site \
  || { echo "gpu_run: installing .whl/*.whl failed" | tee "$OUT/install.log"; exit 1; }
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || true; } > "$OUT/nvidia-smi.txt"

# The engines that call PyTorch's kernels and JAX's cuDNN LSTM, on the GPU,
# against the NumPy oracle and the keras.ops scan, gradients included.
for backend in torch jax; do
  KERAS_BACKEND=$backend timeout -k 5 60 python3 -m pytest -q -p no:cacheprovider -x \
    tests/all_backends/test_recurrence_vendor.py tests/all_backends/test_layers.py 2>&1 | tail -15 | tee "$OUT/tests_$backend.log"
done

# Seconds: `timeout` kills a run (10 s after TERM, KILL); --time-budget makes
# the script skip its remaining cases earlier, so that its summary and JSON
# are written. 2 x 65 + 190 + 150 + 2 x 10 + the install stay under 480.
for spec in torch:190:130 jax:150:100; do
  IFS=: read -r backend limit budget <<< "$spec"
  log="$OUT/bench_backends_$backend.log"
  KERAS_BACKEND=$backend PYTHONUNBUFFERED=1 timeout -k 10 "$limit" \
    python3 benchmarks/bench_backends.py --max-seconds 6 --time-budget "$budget" \
    --json "$OUT/bench_backends_$backend.json" ${BENCH_ARGS:-} 2>&1 | tee "$log"
  echo "gpu_run: $backend exited ${PIPESTATUS[0]} at $((SECONDS - start)) s" | tee -a "$log"
done
echo "gpu_run: done in $((SECONDS - start)) s"
