#!/usr/bin/env bash
# The quality-latency sweep of the GPE model: wait-k over chunk sizes, the decoding-time ablations,
# and the Whisper baselines; then recipes/RESULTS.md and recipes/quality_latency.png.
# Resumable: rerun after an interruption and finished points are skipped.
#   recipes/eval/run.sh [sweep.py options: --model M --manifest F --out DIR --quick --baselines auto|none|a,b --threads N]
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1
SWEEP_COMMAND="recipes/eval/run.sh"  # recorded at the top of RESULTS.md
if [ $# -gt 0 ]; then SWEEP_COMMAND+="$(printf ' %q' "$@")"; fi
export SWEEP_COMMAND
exec .venv/bin/python recipes/eval/sweep.py "$@"
