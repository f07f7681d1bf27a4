#!/usr/bin/env bash
# After scripts/train_code_zoo.sh: the pieces that need the finished target, then the benchmark.
#   1. BiLD prediction alignment of the draft on the target's greedy outputs -> zoo/code/draft-aligned/
#   2. the n-gram table from the corpus                                      -> zoo/code/ngram.safetensors
#   3. the benchmark against Hugging Face and the loop's own share of the time (run with nothing else on the
#      machine)                                                            -> benchmarks/speed/, benchmarks/cost/
#   4. the tables of README.md and docs/ refreshed from benchmarks/
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
DV="$PY -m draftverify.cli"
THREADS=${THREADS:-2}

$DV train align --target zoo/code/target --draft zoo/code/draft --out zoo/code/draft-aligned --work-dir runs/align \
  --num-prompts "${ALIGN_PROMPTS:-400}" --eval-prompts "${ALIGN_EVAL_PROMPTS:-48}" --new-tokens 128 \
  --max-steps "${ALIGN_STEPS:-40}" --warmup-steps 5 --lr 5e-4 --batch-size 16 --threads "$THREADS" --bf16
$DV train ngram --out zoo/code/ngram.safetensors --cache-dir runs/token-cache
$DV bench speed --zoo code --num-prompts "${BENCH_PROMPTS:-12}" --max-new-tokens 128 --temperature 0,1.0 \
  --gamma "${BENCH_GAMMAS:-2,3,4,6,auto}" --bild-fb 0.3,0.5,0.7 --bild-rb 1,2,4 --threads "$THREADS"
$DV bench overhead --threads 1
$DV docs tables
