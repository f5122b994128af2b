#!/usr/bin/env bash
# The one prepared device check for the torch stub (issue 5): calibrate Llama-3.1-8B shapes on the
# GPU, swap-copy vs pinned-copy GB/s, and a short Azure conv replay with measured timing vs the
# calibrated cost model. Needs only python3 with torch + numpy (no polars/duckdb there).
#
#   bench/gpu_calibrate.sh [OUT_DIR] [gpu_checks.py options]      # e.g. --gpu h200 --requests 300
#   bench/gpu_calibrate.sh /tmp/cpu-smoke --device cpu --quick     # the CPU smoke run (tested)
#
# OUT_DIR defaults to $OUT (the device tool's output folder) or bench/results/gpu. The trace is
# ../shared/traces/AzureLLMInferenceTrace_conv.csv, or shared/traces/..., or --trace PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/results/gpu}"
if [[ $# -gt 0 && "$1" != --* ]]; then out="$1"; shift; fi
PY="${PYTHON:-python3}"
[[ -x .venv/bin/python && -z "${PYTHON:-}" ]] && PY=.venv/bin/python
"$PY" -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" >&2
exec "$PY" bench/gpu_checks.py --out "$out" "$@"
