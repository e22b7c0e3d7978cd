#!/usr/bin/env bash
# The quality-latency sweep of the GPE model: wait-k over chunk sizes, the decoding-time ablations,
# and the Whisper baselines; then recipes/RESULTS.md and recipes/quality_latency.png.
# Resumable: rerun after an interruption and finished points are skipped.
#   recipes/eval/run.sh [sweep.py options: --model M --manifest F --out DIR --quick --baselines auto|none|a,b --threads N]
# Relative paths are taken from where it is run (sweep.py resolves them; its defaults are in the repository).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export HF_HUB_OFFLINE=1
SWEEP_COMMAND="recipes/eval/run.sh"  # recorded at the top of RESULTS.md
if [ $# -gt 0 ]; then SWEEP_COMMAND+="$(printf ' %q' "$@")"; fi
export SWEEP_COMMAND
exec "$root/.venv/bin/python" "$root/recipes/eval/sweep.py" "$@"
