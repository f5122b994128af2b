#!/usr/bin/env bash
# The one prepared device check for the torch stub (issue #35): calibrate Llama-3.1-8B shapes on
# the GPU (swap and offload copies against pinned copies), a short Azure conv replay with measured
# steps against the calibrated cost model and the shipped profile of that GPU, and an offloading
# replay with integrity checks. Needs only python3 with torch + numpy (no polars/duckdb there).
#
#   bench/gpu_calibrate.sh --prepare                               # here: the trace slice to carry
#   bench/gpu_calibrate.sh [OUT_DIR] [gpu_checks.py options]      # there; e.g. --budget-s 300
#   bench/gpu_calibrate.sh /tmp/cpu-smoke --device cpu --quick     # the CPU smoke run (tested)
#
# On the device machine ../shared does not travel: `--prepare` copies the first 1,000 requests of
# ../shared/traces/AzureLLMInferenceTrace_conv.csv to .gpu/ (git-ignored), and the device call
# carries it:  run(command="bash bench/gpu_calibrate.sh", carry=[".gpu"], timeout_s=420)
# OUT_DIR defaults to $OUT (the device tool's output folder) or bench/results/gpu/<gpu>.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == --prepare ]]; then
  src=../shared/traces/AzureLLMInferenceTrace_conv.csv
  [[ -f "$src" ]] || { echo "gpu_calibrate.sh --prepare: $src not found" >&2; exit 1; }
  mkdir -p .gpu
  head -n 1001 "$src" > .gpu/AzureLLMInferenceTrace_conv.csv
  echo "wrote .gpu/AzureLLMInferenceTrace_conv.csv (1,000 requests); carry .gpu" >&2
  exit 0
fi
out=()
[[ -n "${OUT:-}" ]] && out=(--out "$OUT")
if [[ $# -gt 0 && "$1" != --* ]]; then out=(--out "$1"); shift; fi
PY="${PYTHON:-python3}"
[[ -x .venv/bin/python && -z "${PYTHON:-}" ]] && PY=.venv/bin/python
"$PY" -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" >&2
exec "$PY" bench/gpu_checks.py "${out[@]}" "$@"
