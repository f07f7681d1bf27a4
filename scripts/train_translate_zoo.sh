#!/usr/bin/env bash
# The translation zoo (zoo/translate/), as it was built: one CPU thread per job, every step resumable (rerun it).
# DATA is the project's shared Multi30k copy (research terms: see ../shared/data/README.md and the model cards).
set -euo pipefail
DATA=${DATA:-../shared/data/multi30k_en_de}
export OMP_NUM_THREADS=1

# 1. joint byte-level BPE over both languages (8000 tokens; sources end with eos)
draftverify train translate-tokenizer --data "$DATA" --out zoo/translate/tokenizer
# 2. the target (MarianMTModel d256, 3+3 layers) and BiLD's small model (d192, 2+1 layers); the target's run was
#    stopped (SIGTERM) and resumed twice with the flags below, as its card's command lines record
draftverify train seq2seq --data "$DATA" --tokenizer zoo/translate/tokenizer --out runs/translate/target \
    --export zoo/translate/target --preset target --max-minutes 60 --warmup-steps 200 --threads 1 --eval-minutes 10
draftverify train seq2seq --data "$DATA" --tokenizer zoo/translate/tokenizer --out runs/translate/small \
    --export zoo/translate/draft --preset small --max-minutes 25 --warmup-steps 150 --threads 1 --eval-minutes 10
# 3. sequence-level distillation: the target's greedy translations (SpecDec trains its drafter on them)
draftverify train distill --model zoo/translate/target --data "$DATA" --split val --out runs/translate/distill/val.de --threads 1
draftverify train distill --model zoo/translate/target --data "$DATA" --split train --out runs/translate/distill/train.de --threads 1
# 4. SpecDec's NAT drafter on the frozen target
draftverify train nat --target zoo/translate/target --train-targets runs/translate/distill/train.de \
    --val-targets runs/translate/distill/val.de --data "$DATA" --out runs/translate/nat --export zoo/translate/nat \
    --block-size 8 --layers 2 --max-minutes 45 --eval-minutes 15 --warmup-steps 100 --lr 5e-4 --threads 1
# 5. BiLD prediction alignment (BiLD 3.5.1): the small model fine-tuned on the target's greedy translations, then
#    BiLD before / after in counts (the aligned model is copied to zoo/translate/draft-aligned only if it needs fewer
#    large-model calls at equal BLEU)
draftverify train seq2seq --data "$DATA" --tokenizer zoo/translate/tokenizer --out runs/translate/align \
    --export runs/translate/align/export --init-from zoo/translate/draft --train-targets runs/translate/distill/train.de \
    --preset small --max-steps 300 --max-minutes 15 --lr 5e-4 --warmup-steps 50 --threads 1 --eval-minutes 100
draftverify reproduce specdec --zoo translate --data-dir "$(dirname "$DATA")" --aligned-draft runs/translate/align/export \
    --num-prompts 100 -n 64 --ks "" --betas "" --gammas 3 --bild-fb 0.2,0.4,0.6,0.8 --bild-rb 2,5 --bild-gamma 10 \
    --threads 1 --counts-only --out benchmarks --name translate-bild-aligned
# 6. the cards, from the training reports (--rescore measures BLEU / chrF again: greedy val + test, beam-5 test)
python scripts/zoo_cards.py translate --data "$DATA" --rescore
