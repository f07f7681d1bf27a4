#!/usr/bin/env bash
# Every measurement the README quotes, in one go, on an otherwise idle machine (nothing else may run: the runs
# compete for the same cores). Rerun it after any change to decoding, drafting, verification or the zoo, then
# `python scripts/update_readme.py` copies the tables into README.md.
#   scripts/run_benchmarks.sh            (about 30-40 minutes on 2 CPU cores)
set -euo pipefail
cd "$(dirname "$0")/.."
if python -c "import llama_cpp" 2>/dev/null && [ -z "${DRAFTVERIFY_LLAMA_CPP:-}" ]; then
    eval "$(scripts/fetch_llama_cpp_converter.sh)"   # llama.cpp rows need its converter
fi
common=(--zoo code --num-prompts 8 --max-new-tokens 128 --threads 2 --out benchmarks)
runners=hf_generate,ours_autoregressive,hf_assisted,hf_prompt_lookup,llamacpp,llamacpp_prompt_lookup,model,model_aligned,lookup_model,model_tree,prompt_lookup,prompt_lookup_tree,ngram,early_exit,bpd,bpd_ngram,bpd_neural,bpd_pbest,bild,specdec++
# 1. every method, eager float32 (the exact default), greedy and T=1; then the blockwise family (and BiTA) greedy
#    beside the target alone and the zoo's default method
draftverify bench "${common[@]}" --temperature 0,1.0 --gamma 4,auto --early-exit-layers 2 --bild-fb 0.5 --bild-rb 2 \
    --runners "$runners"
draftverify bench "${common[@]}" --temperature 0 --gamma 4,auto --name bench-humaneval-blockwise --bita-masks 1 \
    --runners hf_generate,ours_autoregressive,lookup_model,model,bpd,bpd_ngram,bpd_neural,bpd_pbest,bita,bita_chain
# 2. the compiled path (preallocated cache + torch.compile per verify width), greedy
if draftverify bench --help | grep -q -- "--compile"; then
    draftverify bench "${common[@]}" --temperature 0 --gamma 4 --compile --name bench-humaneval-compiled \
        --runners hf_generate,ours_autoregressive,llamacpp,llamacpp_prompt_lookup,lookup_model,model_tree,prompt_lookup
    # the same at bfloat16, llama.cpp converted to bf16 GGUF: one precision on both sides (not exact: see 3.)
    draftverify bench "${common[@]}" --temperature 0 --gamma 4 --compile --dtype bfloat16 \
        --name bench-humaneval-compiled-bf16 --runners hf_generate,ours_autoregressive,llamacpp,lookup_model
fi
# 2b. where a one-token forward's time goes: PyTorch's matrix-vector floor against llama.cpp's time per token
python scripts/gemv_floor.py --threads 2 --rounds 40
# 3. the cost of scoring n tokens, eager: float32 with the engine's few-row layout and with torch's stock one,
#    bfloat16; greedy equality rates (the compiled modes: add compiled-float32,compiled-bfloat16, ~2 min per width);
#    then BiTA's decoding modes with estimated speedups from that curve
draftverify bench --cost-curve --zoo code --threads 2 --num-prompts 8 --cost-sizes 1,2,3,4,6,8,12,16,24,32,48,64 \
    --cost-modes eager-float32,eager-float32-gemm,eager-bfloat16 --out benchmarks
draftverify bita-report --prompts 6 --new-tokens 48 --tables modes --threads 1 --cost benchmarks/cost-code.json \
    --out benchmarks/bita-humaneval
# 4. a user's first call: fresh processes, ratio to --method autoregressive
python scripts/cold_start.py --runs 3 --threads 2
# 5. batch throughput: HF generate (batched) vs our loop without drafting and our best methods, B = 1, 2, 4, 8
draftverify bench-batch --zoo code --methods 'lookup_model,lookup_model[auto],prompt_lookup' --batch-sizes 1,2,4,8 \
    --num-prompts 8 --max-new-tokens 64 --threads 2 --out benchmarks
# 6. the server under load: 8 concurrent streaming clients, 1,000 requests (loopback only), RSS sampled every 100
python scripts/load_test.py --spawn "--zoo code --max-batch 8 --threads 2" --clients 8 --requests 1000 \
    --duration 900 --max-tokens 16 --rss-every 100 --rss-warm 200 --out benchmarks/load-test.json
# 7. translation (Multi30k test_2016_flickr): SpecDec over k, SpecDec++ over beta x tau, BiLD's threshold sweep with
#    the small model before and after prediction alignment, speculative sampling on the same pair, HF baselines
draftverify bench-translate --zoo translate --data-dir ../shared/data --num-prompts 200 -n 64 --ks 2,4,6,8 \
    --betas 3,5 --taus 1,3 --plus-k 8 --gammas 3 --bild-fb 0.2,0.4,0.6,0.8 --bild-rb 2,5 --bild-gamma 10 \
    --aligned-draft zoo/translate/draft-aligned --threads 2 --out benchmarks --name translate-specdec
