#!/usr/bin/env bash
# A draft for the code zoo's target with ANOTHER tokenizer (issue #22, cross-tokenizer speculative decoding):
#   1. byte-level BPE with 2048 tokens (the zoo's has 8192) on the CPython stdlib .py files of this interpreter
#      (3.11.7, the first source of the zoo's corpus), manifest split by file  -> runs/othertok/{manifest.json,tokenizer/}
#   2. the `draft` preset (2 layers, hidden 256; ~2.2M params at this vocab), 10 min at 1 thread -> zoo/code/draft-othertok/
# Checkpoints, token cache and logs go to runs/ (git-ignored); re-running resumes from the last runs/othertok/lm/checkpoint-<step>/.
#
# Env knobs: PYTHON (interpreter), THREADS (1), MINUTES (10), VOCAB (2048).
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false
TRAIN="$PY -m draftverify.cli train"

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

Both steps are `scripts/train_othertok_draft.sh` (resumable from the last `runs/othertok/lm/checkpoint-<step>/`).

```bash
draftverify generate --target zoo/code/target --draft zoo/code/draft-othertok --prompt "def fibonacci(n):"
```
CARD
