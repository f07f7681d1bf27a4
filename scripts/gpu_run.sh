#!/usr/bin/env bash
# One prepared GPU run (issue 35), inside one total deadline, installing nothing:
#   1. self-distil and train on $DEVICE, each within its clock budget, the code zoo's BPD heads, BiTA adapter and NAT
#      drafter (and the EAGLE-3 head when this checkout has `draftverify train eagle3`) for the zoo's target;
#   2. each exported fp16 with its card under $OUT/{heads,bita,nat,eagle3};
#   3. the bench of every method on $DEVICE with those pieces, in two files so a late stop keeps the first
#      ($OUT/bench/<name>-core: BPD, BiTA, SpecDec, the model draft and the peers; $OUT/bench/<name>: every other
#      method), then the cost curve to 64 tokens ($OUT/cost); $OUT/device.txt and the bench files name the GPU.
# A stage starts only when its budget fits in the time left (the later stages' reserved); a stage past its budget is
# stopped (SIGINT, then SIGKILL). Whatever finished stays under $OUT; $OUT/stages.txt says what ran, how long, and
# what was skipped. Logs: $OUT/logs/<stage>.log.
#
# Env: OUT (default runs/gpu-run), DEVICE (cuda), SCALE (full | toy: a few prompts and steps, for the CPU test),
#      TOTAL_SECONDS (full 540, toy 300), TARGET (default zoo/code/target; with another target the bench runs
#      `--target` without the zoo's draft), DATA (the prompts' text, a folder or a jsonl: default this Python's
#      standard library, the part of the zoo's corpus every machine has), DTYPE (the training's frozen target: auto),
#      BENCH_DTYPE (float32: lossless rows must equal HF generate's greedy text token for token, which bfloat16's
#      rounding does not promise; the cost curve times float32 and bfloat16 both), PYTHON, WORK (scratch).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-runs/gpu-run}
DEVICE=${DEVICE:-cuda}
SCALE=${SCALE:-full}
DTYPE=${DTYPE:-auto}
BENCH_DTYPE=${BENCH_DTYPE:-float32}
TARGET=${TARGET:-zoo/code/target}
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
DATA=${DATA:-$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')}
DV=("$PY" -m draftverify.cli)

case "$SCALE" in
  full)
    TOTAL=${TOTAL_SECONDS:-540}
    BUDGET=(heads=95 bita=120 nat=95 eagle3=90 bench_core=80 bench=110 cost=40)
    HEADS=(--num-prompts 800 --eval-prompts 64 --generate-batch 200 --batch-size 2048 --max-minutes 0.5)
    BITA=(--num-train 800 --eval-prompts 32 --gen-batch 64 --batch-size 32 --max-minutes 1.0)
    NAT=(--num-prompts 800 --eval-prompts 64 --generate-batch 200 --batch-size 32 --max-minutes 0.9)
    EAGLE3=(--max-minutes 0.8)
    PROMPT_TOKENS=(--min-prompt-tokens 64 --max-prompt-tokens 64 --new-tokens 64)  # one length: one generate call a batch
    BENCH=(--num-prompts 4 --max-new-tokens 96 --temperature 0 --gamma 4 --warmup-tokens 16 --bild-fb 0.4 --bild-rb 2)
    COST=(--cost-sizes 1,2,3,4,6,8,12,16,24,32,48,64 --cost-modes eager-float32,eager-bfloat16 --cost-repeats 10
      --num-prompts 2 --max-new-tokens 16)
    ;;
  toy)
    TOTAL=${TOTAL_SECONDS:-300}
    BUDGET=(heads=40 bita=40 nat=40 eagle3=40 bench_core=50 bench=60 cost=30)
    HEADS=(--num-prompts 4 --eval-prompts 2 --generate-batch 4 --batch-size 16 --max-steps 2)
    BITA=(--num-train 4 --eval-prompts 2 --gen-batch 4 --batch-size 2 --cuts 2 --max-steps 2)
    NAT=(--num-prompts 4 --eval-prompts 2 --generate-batch 4 --batch-size 2 --cuts 2 --max-steps 2)
    PROMPT_TOKENS=(--min-prompt-tokens 8 --max-prompt-tokens 12 --new-tokens 8)
    EAGLE3=(--num-prompts 4 --eval-prompts 2 --generate-batch 4 --batch-size 2 "${PROMPT_TOKENS[@]}" --max-steps 2)
    BENCH=(--quick --num-prompts 1 --max-new-tokens 8)
    COST=(--quick --cost-sizes 1,2 --cost-modes eager-float32)
    ;;
  *) echo "gpu_run.sh: SCALE must be full or toy, got '$SCALE'" >&2; exit 2 ;;
esac

mkdir -p "$OUT/logs"
WORK=${WORK:-$(mktemp -d)}  # generations, features, checkpoints: not brought back
START=$(date +%s)
: > "$OUT/stages.txt"

budget() { local pair; for pair in "${BUDGET[@]}"; do [[ ${pair%%=*} == "$1" ]] && echo "${pair#*=}"; done; }
left() { echo $((START + TOTAL - $(date +%s))); }
note() { echo "[gpu_run $(($(date +%s) - START))s] $*" | tee -a "$OUT/stages.txt"; }

# stage NAME RESERVE COMMAND...: run COMMAND within NAME's budget if that budget and RESERVE seconds (the later
# stages' share) fit in the time left; else skip it.
stage() {
  local name=$1 reserve=$2 need remaining t0 rc
  shift 2
  need=$(budget "$name")
  remaining=$(left)
  if ((remaining < need + reserve)); then
    note "$name: skipped (${remaining}s left, it needs ${need}s and ${reserve}s stay reserved)"
    return 0
  fi
  t0=$(date +%s)
  timeout --signal=INT --kill-after=20 "$need" "$@" >"$OUT/logs/$name.log" 2>&1
  rc=$?
  note "$name: exit $rc after $(($(date +%s) - t0))s (budget ${need}s)$([[ $rc == 124 ]] && echo ': stopped at its budget')"
}

if [[ $DEVICE == cuda* ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >"$OUT/device.txt"
else
  echo "$DEVICE (no GPU)" >"$OUT/device.txt"
fi
note "device $DEVICE: $(head -n 1 "$OUT/device.txt"); scale $SCALE; ${TOTAL}s in all; target $TARGET; data $DATA"

COMMON=(--target "$TARGET" --data "$DATA" --device "$DEVICE" --dtype "$DTYPE" --no-progress)
TAIL=$(($(budget bench_core) + $(budget cost)))  # reserved while training: the core bench and the cost curve

stage heads "$TAIL" "${DV[@]}" train heads "${COMMON[@]}" "${PROMPT_TOKENS[@]}" "${HEADS[@]}" \
  --out "$OUT/heads" --work-dir "$WORK/heads"
stage bita "$TAIL" "${DV[@]}" train bita "${COMMON[@]}" "${PROMPT_TOKENS[@]}" "${BITA[@]}" \
  --out "$OUT/bita" --work-dir "$WORK/bita"
# the same prompts and work dir as the heads': the NAT drafter reuses their generations
stage nat "$TAIL" "${DV[@]}" train nat "${COMMON[@]}" "${PROMPT_TOKENS[@]}" "${NAT[@]}" \
  --out "$WORK/nat-run" --export "$OUT/nat" --work-dir "$WORK/heads"
if "${DV[@]}" train eagle3 --help >"$WORK/eagle3-help.txt" 2>&1; then
  # the flags the other recipes take, passed where its help lists them (it may name some apart)
  EAGLE_ARGS=()
  set -- "${COMMON[@]}" "${EAGLE3[@]}" --out "$OUT/eagle3" --work-dir "$WORK/eagle3"
  while (($#)); do
    flag=$1 value=()
    shift
    if (($#)) && [[ $1 != --* ]]; then value=("$1"); shift; fi
    if grep -q -- "$flag" "$WORK/eagle3-help.txt"; then EAGLE_ARGS+=("$flag" "${value[@]}"); fi
  done
  stage eagle3 "$TAIL" "${DV[@]}" train eagle3 "${EAGLE_ARGS[@]}"
else
  note "eagle3: skipped (this checkout has no \`draftverify train eagle3\`)"
fi

PIECES=()
for piece in heads bita nat; do
  if compgen -G "$OUT/$piece/*.json" >/dev/null; then PIECES+=("--$piece" "$OUT/$piece"); fi
done
if [[ -d "$OUT/eagle3" ]] && "${DV[@]}" bench speed --help 2>/dev/null | grep -q -- "--eagle3 "; then
  PIECES+=(--eagle3 "$OUT/eagle3")
fi
if [[ $TARGET == zoo/code/target ]]; then MODELS=(--zoo code); else MODELS=(--target "$TARGET"); fi
if [[ $DEVICE == cuda* ]] && command -v nvidia-smi >/dev/null; then  # e.g. bench-NVIDIA-H100-80GB-HBM3
  NAME="bench-$(head -n 1 "$OUT/device.txt" | cut -d, -f1 | tr -c 'A-Za-z0-9\n' '-' | tr -s '-' | sed 's/-$//')"
else
  NAME="bench-$DEVICE"
fi

CORE=bpd,bita,bita_tree,bita_chain,specdec,model,hf_assisted,hf_prompt_lookup,prompt_lookup
REST=$("$PY" -c "from draftverify.bench.runner_families import BASELINES, PEER_FAMILIES, families
print(','.join(f for f in families() if f not in '$CORE'.split(',') + list(BASELINES + PEER_FAMILIES)))")
BENCH_ARGS=("${MODELS[@]}" "${PIECES[@]}" "${BENCH[@]}" --device "$DEVICE" --dtype "$BENCH_DTYPE" --out "$OUT/bench")
stage bench_core "$(budget cost)" "${DV[@]}" bench speed "${BENCH_ARGS[@]}" --runners "$CORE" \
  --name "$NAME-core" --no-progress
stage bench "$(budget cost)" "${DV[@]}" bench speed "${BENCH_ARGS[@]}" --runners "$REST" --name "$NAME" --no-progress
stage cost 0 "${DV[@]}" bench speed --cost-curve "${MODELS[@]}" "${COST[@]}" --device "$DEVICE" --out "$OUT/cost" \
  --name "cost-${NAME#bench-}" --no-progress
note "done: $(cd "$OUT" && find . -name '*.json' -o -name 'README.md' -o -name '*.md' | sort | tr '\n' ' ')"
