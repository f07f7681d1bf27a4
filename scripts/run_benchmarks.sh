#!/usr/bin/env bash
# Every benchmark file the docs quote that the shipped zoo alone produces, in one go, each with the command its
# file records, on an otherwise idle machine (nothing else may run: the runs compete for the same cores). Rerun it
# after any change to decoding, drafting, verification or the zoo, then `draftverify docs tables` copies
# the tables into README.md and docs/. Each command writes to its own folder of benchmarks/ (speed/, cost/, methods/, batch/,
# serving/, translation/, draft-policy/, llamacpp/); benchmarks/README.md lists every file and what made it.
#   scripts/run_benchmarks.sh            (about 3 hours on 2 CPU cores, the parts' own run times added up; part 8
#                                         needs the llamacpp extra)
# Not here: the tables of models trained for an ablation or a comparison (bita-humaneval-ablation / -prompts,
# translate-bild-aligned / -control, translate-counts: the training recipes in the docs and in scripts/train_*.sh
# make those models, and each file records its command), the zoo's held-out losses (scripts/zoo_cards.py held-out,
# when the zoo's models change), and the one-off probes whose question is answered (benchmarks/README.md names the
# commit whose scripts made them).
set -euo pipefail
cd "$(dirname "$0")/.."
llamacpp=0
if python -c "import llama_cpp" 2>/dev/null; then
    llamacpp=1
    if [ -z "${DRAFTVERIFY_LLAMA_CPP:-}" ]; then
        eval "$(scripts/fetch_llama_cpp_converter.sh)"   # llama.cpp rows need its converter
    fi
fi
common=(--zoo code --num-prompts 8 --max-new-tokens 128 --threads 2)
runners=hf_generate,ours_autoregressive,hf_assisted,hf_prompt_lookup,llamacpp,llamacpp_prompt_lookup,model,model_aligned,lookup_model,model_tree,prompt_lookup,prompt_lookup_tree,ngram,early_exit,bpd,bpd_ngram,bpd_neural,bpd_pbest,bild,specdec++
# 1. every method, eager float32 (the exact default), greedy and T=1; the blockwise family (and BiTA) greedy beside
#    the target alone and the zoo's default method; a draft with its own tokenizer; token healing; sample outputs
draftverify bench speed "${common[@]}" --temperature 0,1.0 --gamma 4,auto --early-exit-layers 2 --bild-fb 0.5 --bild-rb 2 \
    --runners "$runners" --no-progress
draftverify bench speed "${common[@]}" --temperature 0 --gamma 4,auto --name bench-humaneval-blockwise --bita-masks 1 \
    --runners hf_generate,ours_autoregressive,lookup_model,model,bpd,bpd_ngram,bpd_neural,bpd_pbest,bita,bita_chain \
    --no-progress
draftverify bench speed --target zoo/code/target --draft zoo/code/draft-othertok --runners model,hf_assisted --num-prompts 8 \
    --max-new-tokens 128 --temperature 0 --gamma 4,auto,conf --threads 2 --name bench-humaneval-othertok \
    --no-progress
draftverify reproduce healing --zoo code --methods lookup_model --num-prompts 8 --max-new-tokens 128 --threads 2 \
    --name healing-humaneval
draftverify bench samples --num-prompts 12 --max-new-tokens 128
# 2. the compiled path (preallocated cache + torch.compile per verify width), greedy
draftverify bench speed "${common[@]}" --temperature 0 --gamma 4 --compile --name bench-humaneval-compiled \
    --runners hf_generate,ours_autoregressive,llamacpp,llamacpp_prompt_lookup,lookup_model,model_tree,prompt_lookup \
    --no-progress
# 3. the cost of scoring n tokens, eager: float32 with the engine's few-row layout and with torch's stock one,
#    bfloat16; greedy equality rates; then BiTA's decoding modes with estimated speedups from that curve
draftverify bench speed --cost-curve --zoo code --threads 2 --num-prompts 8 --cost-sizes 1,2,3,4,6,8,12,16,24,32,48,64 \
    --cost-modes eager-float32,eager-float32-gemm,eager-bfloat16 --no-progress
draftverify reproduce bita --prompts 6 --new-tokens 48 --tables modes --threads 1 --cost benchmarks/cost/cost-code.json
draftverify reproduce blockwise --prompts 12 --tune 3 --new-tokens 48 --threads 1
# 4. a user's first call (fresh processes, ratio to --method autoregressive); the loop's own share of the time
draftverify bench cold-start --runs 3 --threads 2
draftverify bench overhead --threads 1 --max-new-tokens 128
# 5. batch throughput: HF generate (batched) against our loop without drafting and our methods, B = 1, 2, 4, 8
draftverify bench batch --zoo code --methods 'lookup_model,lookup_model[auto],model_tree,prompt_lookup_tree,bpd,bpd_neural,bita,specdec' \
    --batch-sizes 1,2,4,8 --num-prompts 8 --max-new-tokens 64 --threads 2
# 6. the server under load: 8 concurrent streaming clients (loopback only), RSS sampled every 100 requests; then
#    greedy and seeded sampling mixed, every answer checked against the same request sent alone
draftverify bench serve --spawn "--zoo code --max-batch 8 --threads 2" --clients 8 --requests 1000 \
    --duration 900 --max-tokens 16 --rss-every 100 --rss-warm 200 --out benchmarks/serving/load-test.json
draftverify bench serve --spawn "--zoo code --max-batch 8 --threads 2" --clients 8 --requests 400 \
    --duration 600 --max-tokens 16 --mixed --out benchmarks/serving/load-test-mixed.json
# 7. translation (Multi30k test_2016_flickr): SpecDec over k, SpecDec++ over beta x tau, BiLD's threshold sweep with
#    the small model before and after prediction alignment, speculative sampling on the same pair, HF baselines
draftverify reproduce specdec --zoo translate --data-dir ../shared/data --num-prompts 200 -n 64 --ks 2,4,6,8 \
    --betas 3,5 --taus 1,3 --plus-k 8 --gammas 3 --bild-fb 0.2,0.4,0.6,0.8 --bild-rb 2,5 --bild-gamma 10 \
    --aligned-draft zoo/translate/draft-aligned --threads 2 --name translate-specdec
# 8. the llama.cpp backend: our methods beside llama.cpp's own decoders in one run, then the same head to head over
#    rounds, the cost curve, and the side-by-side choices of public options (the draft's GGUF type, staged drafting,
#    lookup's agreement as confidence); the held-out (--first 100) runs are the ones the choices were made on
if [ "$llamacpp" = 1 ]; then
    draftverify bench speed --zoo code --backend hf,llamacpp --temperature 0 --threads 2 --num-prompts 8 --max-new-tokens 128 \
        --gamma 4,auto,conf,conf=0.9 \
        --runners llamacpp,llamacpp_prompt_lookup,llamacpp_draft,hf_assisted,model,model_aligned,prompt_lookup,lookup_model,model_tree,prompt_lookup_tree \
        --name bench-humaneval-llamacpp --no-progress
    draftverify bench rounds --num-prompts 8 --rounds 5
    # llama.cpp's own engine (needs its tools: scripts/build_llama_cpp_tools.sh): each side's best row per prompt
    # set and target file, ours on llama.cpp's library built for Python (build_llama_cpp_lib.sh); the same on the
    # quantized files with ours on the library without llamafile's kernels and flash attention off on both sides
    # (every chain of ours exact); both loops at the sizes users run with synthetic acceptance
    native=(bench native --prompts humaneval,spec_bench:coding,spec_bench:math_reasoning --num-prompts 6
        --max-new-tokens 96)
    lib="$(scripts/build_llama_cpp_lib.sh | sed -n 's/^export LLAMA_CPP_LIB_PATH=//p')"
    LLAMA_CPP_LIB_PATH="$lib" draftverify "${native[@]}" --target-gguf f32,q8_0,q4_k_m --rounds 5 --name bench-native \
        --fresh
    invariant="$(scripts/build_llama_cpp_invariant_lib.sh | sed -n 's/^export LLAMA_CPP_LIB_PATH=//p')"
    LLAMA_CPP_LIB_PATH="$invariant" draftverify "${native[@]}" --target-gguf q8_0,q4_k_m --no-flash-attn \
        --name bench-native-exact --fresh
    # the loop's own cost beside a bare ctypes loop and llama-server (its static and its default build), on
    # llama-cpp-python's own library and on the one build_llama_cpp_lib.sh builds
    draftverify bench overhead --backend llamacpp --rounds 3 --name loop-overhead-llamacpp-f32
    draftverify bench overhead --backend llamacpp --target-gguf q8_0 --rounds 3 --name loop-overhead-llamacpp-q8_0
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench overhead --backend llamacpp --rounds 3 \
        --name loop-overhead-llamacpp-f32-built
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench overhead --backend llamacpp --target-gguf q8_0 --rounds 3 \
        --name loop-overhead-llamacpp-q8_0-built
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench overhead --backend llamacpp --target-gguf q8_0 --gamma conf \
        --methods autoregressive,suffix,earn,model --rounds 3 --name loop-overhead-llamacpp-q8_0-conf-built
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench synthetic --shapes qwen2.5-0.5b,llama-3.2-1b \
        --target-gguf q8_0,q4_k_m --alpha 0.6,0.8,0.9 --gamma 2,4,auto --native-n-max 2,4 --num-prompts 3 \
        --max-new-tokens 48 --name bench-synthetic
    draftverify bench speed --cost-curve --zoo code --threads 2 --num-prompts 8 --cost-sizes 1,2,3,4,5,6,8,12,16,24,32,48,64 \
        --cost-modes eager-float32,llamacpp-float32 --name cost-code-llamacpp
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench speed --cost-curve --zoo code --threads 2 --num-prompts 8 \
        --cost-sizes 1,2,3,4,5,6,8,9,12,16,17,24,32 --cost-modes llamacpp-float32,llamacpp-q8_0,llamacpp-q4_k_m \
        --name cost-code-llamacpp-quantized
    # earn's draft model staged (lookup_tokens 5, as model) against unstaged: one pass, the suffix cache remembers
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench ab --set backend=llamacpp --set method=earn \
        --set draft=zoo/code/draft-aligned --set gamma=conf=0.9 --vary lookup_tokens=0,5 --prompts spec_bench:math_reasoning --num-prompts 12 --rounds 1 \
        --max-new-tokens 96 --threads 2 --name earn-staged-ab-llamacpp-f32-math
    LLAMA_CPP_LIB_PATH="$lib" draftverify bench ab --set backend=llamacpp --set method=earn --set target_gguf=q8_0 \
        --set gamma=conf --vary lookup_tokens=0,5 --prompts humaneval --num-prompts 12 --rounds 1 --max-new-tokens 96 \
        --threads 2 --no-check-text --name earn-staged-ab-llamacpp-q8_0
    ab=(bench ab --threads 2 --num-prompts 8)
    aligned=zoo/code/draft-aligned
    for method in model lookup_model; do
        draftverify "${ab[@]}" --rounds 3 --set backend=llamacpp --set method="$method" --set gamma=conf \
            --vary draft_gguf=q8_0,f32 --out benchmarks/llamacpp --name "llamacpp-draft-gguf-$method"
    done
    draftverify "${ab[@]}" --rounds 3 --set gamma=conf --set lookup_confirms=false --vary lookup_tokens=0,3,5,10 \
        --name staged-draft-ab-hf
    draftverify "${ab[@]}" --rounds 3 --set backend=llamacpp --set draft="$aligned" --set gamma=conf=0.8 \
        --set lookup_confirms=false --vary lookup_tokens=0,3,5,10 --name staged-draft-ab-llamacpp
    for first in 0 100; do
        held=(--rounds 5) suffix=""
        if [ "$first" = 100 ]; then held=(--rounds 2 --num-prompts 32 --first 100) suffix="-from-100"; fi
        draftverify "${ab[@]}" "${held[@]}" --set backend=llamacpp --set draft="$aligned" \
            --vary gamma=conf=0.8,conf=0.9,conf=0.95 --vary lookup_confirms=false,true \
            --name "lookup-agreement-ab-llamacpp-aligned$suffix"
        draftverify "${ab[@]}" "${held[@]}" --set backend=llamacpp --set gamma=conf --vary lookup_confirms=false,true \
            --name "lookup-agreement-ab-llamacpp$suffix"
        draftverify "${ab[@]}" "${held[@]}" --set gamma=conf --vary lookup_confirms=false,true \
            --name "lookup-agreement-ab-hf$suffix"
    done
else
    echo "llama-cpp-python is not installed: part 8 (the llama.cpp backend) skipped" >&2
fi
