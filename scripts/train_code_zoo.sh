#!/usr/bin/env bash
# The code zoo on the CPU, in three stages (the shipped zoo was trained on a GPU: scripts/gpu_zoo.py):
#   scripts/train_code_zoo.sh pair      (default; ~2 h on 2 cores) the code model pair from scratch:
#     1. corpus manifest (stdlib *.py, split by file) + byte-level BPE tokenizer -> zoo/code/{manifest.json,tokenizer/}
#     2. target model (~30M params, 100 min budget)                              -> zoo/code/target/
#     3. draft model  (~3.8M params, 25 min budget)                              -> zoo/code/draft/
#   scripts/train_code_zoo.sh finish    after `pair`: the pieces that need the finished target, then the benchmark:
#     1. BiLD prediction alignment of the draft on the target's greedy outputs -> zoo/code/draft-aligned/
#     2. the n-gram table from the corpus                                      -> zoo/code/ngram.safetensors
#     3. the benchmark against Hugging Face and the loop's own share of the time (run with nothing else on the
#        machine)                                                            -> benchmarks/speed/, benchmarks/cost/
#     4. the tables of README.md and docs/ refreshed from benchmarks/
#   scripts/train_code_zoo.sh othertok  a draft for the target with ANOTHER tokenizer (issue #22, cross-tokenizer
#                                       speculative decoding), 10 min at 1 thread -> zoo/code/draft-othertok/:
#     1. byte-level BPE with 2048 tokens (the zoo's has 8192) on the CPython stdlib .py files of this interpreter
#        (3.11.7, the first source of the zoo's corpus), manifest split by file
#                                                                      -> runs/othertok/{manifest.json,tokenizer/}
#     2. the `draft` preset (2 layers, hidden 256; ~2.2M params at this vocab)
# Checkpoints, token caches and logs go to runs/ (git-ignored). Re-running a stage resumes an interrupted training
# run from its last runs/*/checkpoint-<step>/.
#
# Env knobs: PYTHON (interpreter), THREADS (torch threads per job: 2; othertok: 1);
#   pair: TARGET_MINUTES (100), DRAFT_MINUTES (25), FORCE_TOKENIZER=1 (rebuild tokenizer/manifest);
#   finish: ALIGN_PROMPTS (400), ALIGN_EVAL_PROMPTS (48), ALIGN_STEPS (40), BENCH_PROMPTS (12), BENCH_GAMMAS;
#   othertok: MINUTES (10), VOCAB (2048).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
DV="$PY -m draftverify.cli"
TRAIN="$DV train"

pair() {
  local threads=${THREADS:-2}
  echo "[$(date -u +%FT%TZ)] train_code_zoo pair: start (pid $$)"
  if [[ ! -f zoo/code/tokenizer/tokenizer.json || "${FORCE_TOKENIZER:-0}" == 1 ]]; then
    $TRAIN tokenizer --out zoo/code/tokenizer --manifest zoo/code/manifest.json --vocab-size 8192
  fi
  echo "[$(date -u +%FT%TZ)] target training"
  $TRAIN lm --preset target --tokenizer zoo/code/tokenizer --manifest zoo/code/manifest.json \
    --out runs/code-target --export zoo/code/target --cache-dir runs/token-cache \
    --threads "$threads" --max-minutes "${TARGET_MINUTES:-100}" --seq-len 512 --batch-size 8 \
    --lr 8e-4 --warmup-steps 100 --bf16 --eval-minutes 10 --checkpoint-minutes 10 --log-every 10
  echo "[$(date -u +%FT%TZ)] draft training"
  $TRAIN lm --preset draft --tokenizer zoo/code/tokenizer --manifest zoo/code/manifest.json \
    --out runs/code-draft --export zoo/code/draft --cache-dir runs/token-cache \
    --threads "$threads" --max-minutes "${DRAFT_MINUTES:-25}" --seq-len 512 --batch-size 8 \
    --lr 2e-3 --warmup-steps 100 --bf16 --eval-minutes 4 --checkpoint-minutes 5 --log-every 20
  echo "[$(date -u +%FT%TZ)] train_code_zoo pair: done"
}

finish() {
  local threads=${THREADS:-2}
  $TRAIN align --target zoo/code/target --draft zoo/code/draft --out zoo/code/draft-aligned --work-dir runs/align \
    --num-prompts "${ALIGN_PROMPTS:-400}" --eval-prompts "${ALIGN_EVAL_PROMPTS:-48}" --new-tokens 128 \
    --max-steps "${ALIGN_STEPS:-40}" --warmup-steps 5 --lr 5e-4 --batch-size 16 --threads "$threads" --bf16
  $TRAIN ngram --out zoo/code/ngram.safetensors --cache-dir runs/token-cache
  $DV bench speed --zoo code --num-prompts "${BENCH_PROMPTS:-12}" --max-new-tokens 128 --temperature 0,1.0 \
    --gamma "${BENCH_GAMMAS:-2,3,4,6,auto}" --bild-fb 0.3,0.5,0.7 --bild-rb 1,2,4 --threads "$threads"
  $DV bench overhead --threads 1
  $DV docs tables
}

othertok() {
  if [[ ! -f runs/othertok/tokenizer/tokenizer.json ]]; then
    $TRAIN tokenizer --out runs/othertok/tokenizer --manifest runs/othertok/manifest.json --vocab-size "${VOCAB:-2048}"
  fi
  $TRAIN lm --preset draft --tokenizer runs/othertok/tokenizer --manifest runs/othertok/manifest.json \
    --out runs/othertok/lm --export zoo/code/draft-othertok --cache-dir runs/othertok/token-cache \
    --threads "${THREADS:-1}" --max-minutes "${MINUTES:-10}" --seq-len 512 --batch-size 8 \
    --lr 2e-3 --warmup-steps 100 --bf16 --eval-minutes 3 --checkpoint-minutes 2 --log-every 20 --no-progress
  # the card `train lm` wrote, plus how the tokenizer was made and what the model is for
  cp runs/othertok/tokenizer/training_info.json zoo/code/draft-othertok/tokenizer_training_info.json
  cat >> zoo/code/draft-othertok/README.md <<'CARD'

## Why this model

The code zoo's target (`zoo/code/target`, vocabulary 8192) with a draft of *another* tokenizer: `--method model`
(or `cross_tokenizer`) re-tokenizes the draft's text into target tokens (draftverify's cross-tokenizer drafter,
universal assisted generation), and the output stays exactly the target's. Its tokenizer is a byte-level BPE with
2048 tokens trained on the same standard-library files (`tokenizer_training_info.json`):

```
python -m draftverify.cli train tokenizer --out runs/othertok/tokenizer --manifest runs/othertok/manifest.json --vocab-size 2048
```

Both steps are `scripts/train_code_zoo.sh othertok` (resumable from the last `runs/othertok/lm/checkpoint-<step>/`).

```bash
draftverify generate --target zoo/code/target --draft zoo/code/draft-othertok --prompt "def fibonacci(n):"
```
CARD
}

case "${1:-pair}" in
  pair | finish | othertok) "${1:-pair}" ;;
  *) echo "usage: scripts/train_code_zoo.sh [pair|finish|othertok]" >&2; exit 2 ;;
esac
