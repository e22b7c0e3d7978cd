#!/usr/bin/env bash
# The Spanish speech -> English text recipe, stage by stage. Every stage is seeded and resumable:
# rerun the script (or one stage) after an interruption and it continues.
#   recipes/st/run.sh [first_stage] [last_stage]
#   stage 0: parallel text (Bible: WEB English + Reina-Valera 1909 Spanish, aligned by verse) -> data/st-main/text/
#   stage 1: Spanish speech (espeak-ng es / es-419), augmented, manifests with translations   -> data/st-main/
#            and 6 h more, mostly of other pairs and newly drawn voices (seed 5), for stage 2c   -> data/st-c/
#            and 20 h more, pairs and voices drawn again (seed 6), for stage 2d                   -> data/st-gpu/
#            and a development set of other held-out pairs (dev.jsonl), held-out voices            -> data/st-dev/
#            and a wider test set: 0.5 h of held-out pairs, the first 53 those of data/st-main       -> data/st-wide/
#   stage 2: train projector + LoRA from the English model's weights (GPE wait-k mask)        -> runs/smollm2-whisper-base-es-en/
#            then 2b: 600 steps more on frames with the encoder's right context (640 ms)     -> runs/smollm2-whisper-base-es-en-b/
#            then 2c: 300 steps more from 2b over the new pairs of data/st-c                 -> runs/smollm2-whisper-base-es-en-c/
#            then 2d, only where a CUDA GPU is: from the mean of 2b and 2c (exported, and kept in runs/*-bc/),
#            1500 steps of 32 over data/st-gpu in bfloat16 (about 8 min on one H200)            -> runs/smollm2-whisper-base-es-en-gpu/
#   stage 3: export 0.9 x stage 2d's weights + 0.1 x its start into the model (the translate default; the weight
#            was chosen on data/st-dev); where stage 2d did not run, the mean of stages 2b's and 2c's
#                                                                                             -> models/smollm2-whisper-base-es-en/
#   stage 4: evaluate on held-out pairs spoken by held-out voices (BLEU, chrF, latency), 53 and 258 of them, and
#            compare streaming with offline and Whisper there (speechstream compare: intervals, p)
#                                                                                             -> runs/eval-smollm2-whisper-base-es-en/
#   stage 5: the quick quality-latency sweep on them: wait-k over chunks, the ablations and the Whisper baselines
#            translating the same audio (recipes/eval/sweep.py --quick)                        -> recipes/st/RESULTS.md
# HOURS (default 8.0), HELDOUT_HOURS (default 0.1) and WORKERS (default 2) size stage 1. Stages 0 and 1 are one script (prepare_st.py); stage 0
# stops it after the text and the plan (--text-only), stage 1 runs it through (the text and plan are kept).
{  # bash reads the whole script before it runs: editing this file during a run (hours) cannot change that run
set -euo pipefail
cd "$(dirname "$0")/../.."
first=${1:-0}; last=${2:-5}
if [ $# -gt 2 ] || ! [[ "$first" =~ ^[0-9]+$ && "$last" =~ ^[0-9]+$ ]] \
    || [ "$first" -gt "$last" ] || [ "$last" -gt 5 ]; then
  echo "usage: $0 [first_stage] [last_stage] (stages 0-5, first <= last)" >&2
  exit 2
fi
SS=.venv/bin/speechstream
PY=.venv/bin/python
MODEL=smollm2-whisper-base-es-en
RUN=runs/$MODEL
DATA=data/st-main
HOURS=${HOURS:-8.0}
HELDOUT_HOURS=${HELDOUT_HOURS:-0.1}
WORKERS=${WORKERS:-2}
export HF_HUB_OFFLINE=1

if [ "$first" -le 0 ] && [ "$last" -ge 0 ]; then
  $PY recipes/st/prepare_st.py --out $DATA --hours "$HOURS" --heldout-hours "$HELDOUT_HOURS" --seed 0 --workers "$WORKERS" --text-only
fi
if [ "$first" -le 1 ] && [ "$last" -ge 1 ]; then
  $PY recipes/st/prepare_st.py --out $DATA --hours "$HOURS" --heldout-hours "$HELDOUT_HOURS" --seed 0 --workers "$WORKERS"
  $PY recipes/st/prepare_st.py --out data/st-c --hours 6 --heldout-hours 0.01 --seed 5 --workers "$WORKERS"
  $PY recipes/st/prepare_st.py --out data/st-gpu --hours 20 --heldout-hours 0.01 --seed 6 --workers "$WORKERS"
  # a development set apart from both held-out manifests (held-out pairs neither speaks), for choosing weights
  $PY recipes/st/prepare_st.py --out data/st-dev --hours 0.01 --heldout-hours "$HELDOUT_HOURS" --dev-hours 0.1 --seed 0 \
    --workers "$WORKERS"
  # a wider test set (258 pairs; its first 53 are data/st-main's held-out clips, the same audio): a tighter BLEU
  $PY recipes/st/prepare_st.py --out data/st-wide --hours 0.01 --heldout-hours 0.5 --seed 0 --workers "$WORKERS"
fi
if [ "$first" -le 2 ] && [ "$last" -ge 2 ]; then
  $SS fetch whisper-base smollm2-135m-instruct
  $SS train recipes/st/$MODEL.yaml
  $SS train recipes/st/$MODEL-b.yaml
  $SS train recipes/st/$MODEL-c.yaml
  # the mean of 2b and 2c (the model shipped until 2026-12-04, sha256 80a257b36ceb...) is stage 2d's start
  $PY recipes/asr/export.py "$RUN-c" models/$MODEL --average-with "$RUN-b/trainable.safetensors"
  mkdir -p "$RUN-bc" && cp models/$MODEL/trainable.safetensors "$RUN-bc/trainable.safetensors"
  if $PY -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    ACCELERATE_MIXED_PRECISION=bf16 $SS train recipes/st/$MODEL-gpu.yaml
  else
    echo "run.sh: stage 2d needs a CUDA GPU (bfloat16, batch 32): skipped; stage 3 ships the mean of 2b and 2c" >&2
  fi
fi
if [ "$first" -le 3 ] && [ "$last" -ge 3 ]; then
  if [ -f "$RUN-gpu/trainable.safetensors" ]; then
    $PY recipes/asr/export.py "$RUN-gpu" models/$MODEL --average-with "$RUN-bc/trainable.safetensors" --run-weight 0.9
  else
    $PY recipes/asr/export.py "$RUN-c" models/$MODEL --average-with "$RUN-b/trainable.safetensors"
  fi
fi
if [ "$first" -le 4 ] && [ "$last" -ge 4 ]; then
  out=runs/eval-$MODEL
  translate() { $SS eval "$1" --task translate --source-lang es --target-lang en "${@:2}"; }
  translate $DATA/heldout.jsonl --model $MODEL --chunk-ms 640 --k 2 --out $out/heldout-640ms
  translate $DATA/heldout.jsonl --model $MODEL --chunk-ms 30000 --k 1 --out $out/heldout-offline
  translate data/st-wide/heldout.jsonl --model $MODEL --chunk-ms 640 --k 2 --out $out/wide-640ms
  translate data/st-wide/heldout.jsonl --model $MODEL --chunk-ms 30000 --k 1 --out $out/wide-offline
  translate data/st-wide/heldout.jsonl --baseline whisper-offline --out $out/wide-whisper-offline
  # streaming against offline and Whisper: intervals and paired-bootstrap p (speechstream compare)
  $SS compare $out/heldout-640ms $out/heldout-offline | tee $out/compare-heldout.txt
  $SS compare $out/wide-640ms $out/wide-offline $out/wide-whisper-offline | tee $out/compare-wide.txt
fi
if [ "$first" -le 5 ] && [ "$last" -ge 5 ]; then
  recipes/eval/run.sh --model $MODEL --manifest $DATA/heldout.jsonl --out runs/sweep-st --quick --report-dir recipes/st \
    --threads 2
fi
exit
}
