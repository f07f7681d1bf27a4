#!/usr/bin/env bash
# Rebuild the project's code model pair from scratch (CPU only, ~2 h on 2 cores):
#   1. corpus manifest (stdlib *.py, split by file) + byte-level BPE tokenizer -> zoo/code/{manifest.json,tokenizer/}
#   2. target model (~30M params, 100 min budget)                              -> zoo/code/target/
#   3. draft model  (~3.8M params, 25 min budget)                              -> zoo/code/draft/
# Checkpoints, token caches and logs go to runs/ (git-ignored).  Re-running the script resumes
# an interrupted training run from the last runs/code-*/checkpoint-<step>/.
#
# Env knobs: PYTHON (interpreter), THREADS (torch threads per job, default 2),
#            TARGET_MINUTES (100), DRAFT_MINUTES (25), FORCE_TOKENIZER=1 (rebuild tokenizer/manifest).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
THREADS=${THREADS:-2}
TARGET_MINUTES=${TARGET_MINUTES:-100}
DRAFT_MINUTES=${DRAFT_MINUTES:-25}
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
TRAIN="$PY -m draftverify.cli train"

echo "[$(date -u +%FT%TZ)] train_code_zoo: start (pid $$)"

if [[ ! -f zoo/code/tokenizer/tokenizer.json || "${FORCE_TOKENIZER:-0}" == 1 ]]; then
  $TRAIN tokenizer --out zoo/code/tokenizer --manifest zoo/code/manifest.json --vocab-size 8192
fi

echo "[$(date -u +%FT%TZ)] target training"
$TRAIN lm --preset target --tokenizer zoo/code/tokenizer --manifest zoo/code/manifest.json \
  --out runs/code-target --export zoo/code/target --cache-dir runs/token-cache \
  --threads "$THREADS" --max-minutes "$TARGET_MINUTES" --seq-len 512 --batch-size 8 \
  --lr 8e-4 --warmup-steps 100 --bf16 --eval-minutes 10 --checkpoint-minutes 10 --log-every 10

echo "[$(date -u +%FT%TZ)] draft training"
$TRAIN lm --preset draft --tokenizer zoo/code/tokenizer --manifest zoo/code/manifest.json \
  --out runs/code-draft --export zoo/code/draft --cache-dir runs/token-cache \
  --threads "$THREADS" --max-minutes "$DRAFT_MINUTES" --seq-len 512 --batch-size 8 \
  --lr 2e-3 --warmup-steps 100 --bf16 --eval-minutes 4 --checkpoint-minutes 5 --log-every 20

echo "[$(date -u +%FT%TZ)] train_code_zoo: done"
