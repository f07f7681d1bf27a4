"""The GGUF precision of the target (the bench's --dtype), side by side: llama.cpp's plain and prompt-lookup
decoding and our best llama.cpp row on the same GGUF at float32, float16 and bfloat16, in one process.

Why it matters: the llama.cpp aims of the backend issue are ratios over llama.cpp's own decoding on the same GGUF,
and the bench measures them at float32. A lower precision halves the weights a one-token step reads, which is
what plain decoding waits on, but does much less for a verify forward over several tokens, whose extra tokens are
compute (the cost columns: a forward over 8 tokens against one). So every row gets faster at 16 bits, the peers
more than ours, and the float32 ratios are the best of the three. On a CPU with AVX512-BF16 (this one) bfloat16 is
the fastest for every row; the zoo's weights are stored in float16, so its float16 GGUF is their exact conversion.

Rows are the bench's own runners (bench/llamacpp.py, bench/lineup.py) over the bench's token ids; each round is
the bench's measurement (bench/run.py) for each precision in turn, the order rotated per round. Ratios are per
round, medians over rounds. Usage: python scripts/llamacpp_precision_ab.py [--prompts 8] [--rounds 3]
Writes benchmarks/llamacpp-precision.md (and prints it)."""
from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from draftverify import DraftVerifyError
from draftverify.backends.gguf import gguf_for, llama_cpp_dir
from draftverify.backends.llamacpp import GGUF_TYPES, LlamaCppLM
from draftverify.bench.config import BenchConfig
from draftverify.bench.environment import machine, now
from draftverify.bench.lineup import build_runners
from draftverify.bench.models import load_models
from draftverify.bench.prompts import load_prompts
from draftverify.bench.run import measure, select_prompts, tokens_per_second
from draftverify.bench.runners import install_hooks
from ab_options import ab_parser, write_report

DTYPES = ("float32", "float16", "bfloat16")
OURS = "llamacpp:model_aligned[conf=0.9]"
PLAIN, LOOKUP = "llamacpp", "llamacpp_prompt_lookup[default]"
COST_WIDTHS = (1, 8)


def forward_ms(gguf: Path, prompt: list[int], width: int, reps: int = 9) -> float:
    """Median ms of one verify forward over `width` tokens after `prompt`, on our backend's target context."""
    lm = LlamaCppLM(gguf, threads=2)
    lm.start(torch.tensor([prompt]))
    tokens = torch.tensor([prompt[-width:]])
    times = []
    for _ in range(reps):
        started = time.perf_counter()
        lm.forward(tokens)
        times.append(time.perf_counter() - started)
        lm.rollback(lm.committed)
    return 1000 * statistics.median(times[1:])


def near_tie(gguf: Path, prompt: list[int], ours: list[int], plain: list[int]) -> str:
    """Where our row's text first leaves llama.cpp's plain text: the top two tokens and their logit margin on our
    backend as our loop feeds it (the prompt but its last token in one decode, the rest one token per decode) and as
    llama-cpp-python feeds it (the whole prompt in one decode, then one token per decode)."""
    k = next(j for j in range(min(len(ours), len(plain)) + 1) if j == min(len(ours), len(plain)) or ours[j] != plain[j])
    if k == min(len(ours), len(plain)):
        return f"the texts end at different lengths ({len(ours)} and {len(plain)} tokens)"
    lm = LlamaCppLM(gguf, threads=2)
    lm.start(torch.tensor([prompt + ours[:k]]))
    split = lm.forward(torch.tensor([[(prompt + ours[:k])[-1]]])).logits[0, -1]
    lm.start(torch.tensor([prompt + [0]]))  # prefills the whole prompt in one decode (the last id is not fed)
    whole = lm.prefilled.logits[0, -1]
    for token in ours[:k]:
        whole = lm.forward(torch.tensor([[token]])).logits[0, -1]
        lm.commit(1)
    show = lambda v: ", ".join(f"{int(i)} ({float(x):.4f})" for x, i in zip(*v.topk(2)))  # noqa: E731
    margin = lambda v: float(v.topk(2).values[0] - v.topk(2).values[1])  # noqa: E731
    return (f"new token {k}: ours {ours[k]}, llama.cpp plain {plain[k]}; top two on our backend as our loop feeds "
            f"it {show(split)}, margin {margin(split):.4f}; with the whole prompt in one decode, as llama-cpp-python "
            f"feeds it, {show(whole)}, margin {margin(whole):.4f}")


def main() -> None:
    ap = ab_parser()
    args = ap.parse_args()
    torch.set_num_threads(2)
    setups = {}
    try:
        for dtype in DTYPES:
            config = BenchConfig(zoo="code", backends=("llamacpp",), dtype=dtype,
                                 runners=("llamacpp", "llamacpp_prompt_lookup", "model_aligned"), gammas=("conf=0.9",),
                                 temperatures=(0.0,), threads=2, num_prompts=args.prompts, max_new_tokens=128,
                                 progress=False, plots=False).resolved()
            models = load_models(config)
            hooks = install_hooks(models)
            runners, _ = build_runners(config, models, hooks)
            chosen, _ = select_prompts(load_prompts(config.prompts, config.data_dir), models, config)
            gguf = gguf_for(models.paths["target"], GGUF_TYPES[dtype], llama_cpp_dir())
            rows = [r for r in runners if r.name in (OURS, PLAIN, LOOKUP)]
            setups[dtype] = (config, models, hooks, rows, chosen, gguf)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    speeds = {d: [] for d in DTYPES}
    same = {d: 0 for d in DTYPES}
    differing = {d: {} for d in DTYPES}  # prompt index -> (ours, plain) new ids, the last round that differed
    for r in range(args.rounds):
        for dtype in DTYPES[r % len(DTYPES):] + DTYPES[: r % len(DTYPES)]:
            config, models, hooks, rows, chosen, _ = setups[dtype]
            records = measure(rows, config if r == 0 else replace(config, warmup_tokens=0), chosen, models.tokenizer)
            texts = {(rec["runner"], rec["prompt_index"]): rec["new_ids"] for rec in records}
            same[dtype] += sum(texts[OURS, i] == texts[PLAIN, i] for i in range(len(chosen)))
            differing[dtype].update({i: (texts[OURS, i], texts[PLAIN, i]) for i in range(len(chosen))
                                     if texts[OURS, i] != texts[PLAIN, i]})
            speeds[dtype].append(tokens_per_second(records))
            print(f"round {r + 1}, {dtype}: " + ", ".join(f"{n} {v:.1f}" for n, v in speeds[dtype][-1].items()),
                  flush=True)
    lines, flips = [], []
    for dtype in DTYPES:
        _, models, hooks, _, chosen, gguf = setups[dtype]
        hooks.remove()
        prompt = chosen[0][1][0].tolist()
        for i, (ours, plain) in sorted(differing[dtype].items()):
            flips.append(f"- {dtype}, prompt {i}: " + near_tie(gguf, chosen[i][1][0].tolist(), ours, plain))
        ms = {w: forward_ms(gguf, prompt, w) for w in COST_WIDTHS}
        med = lambda f: statistics.median(f(x) for x in speeds[dtype])  # noqa: E731
        lines.append(
            f"| {dtype} | `{gguf.name.rsplit('-', 1)[-1].removesuffix('.gguf')}` | {ms[1]:.2f} | {ms[8]:.2f} | "
            f"{ms[8] / ms[1]:.2f}x | {med(lambda x: x[PLAIN]):.1f} | {med(lambda x: x[LOOKUP]):.1f} | "
            f"{med(lambda x: x[OURS]):.1f} | {med(lambda x: x[OURS] / x[PLAIN]):.2f}x | "
            f"{med(lambda x: x[OURS] / x[LOOKUP]):.2f}x | {same[dtype]}/{args.rounds * len(chosen)} |")
    m = machine()
    text = "\n".join([
        "# llama.cpp rows at three GGUF precisions", "",
        f"`python scripts/llamacpp_precision_ab.py --prompts {args.prompts} --rounds {args.rounds}`; {now()}; "
        f"{m['cpu_model']} ({m['cores']} cores), 2 threads; the zoo target converted at each precision, the aligned "
        f"draft at its own GGUF type (q8_0), HumanEval prompts 0..{args.prompts - 1} x 128 tokens, greedy; "
        f"{args.rounds} rounds of the bench's measurement per precision in one process (tok/s and ratios: medians "
        f"over rounds). Ours: `{OURS}`. Forward ms: our backend's target, one verify forward over 1 and over 8 "
        "tokens after the first prompt (median of 8). = plain: prompts whose text equals llama.cpp's plain greedy "
        "text on the same GGUF, over all rounds.", "",
        "| dtype | GGUF | 1-token ms | 8-token ms | 8 / 1 | plain tok/s | prompt lookup tok/s | ours tok/s | "
        "ours / plain | ours / prompt lookup | = plain |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|", *lines, "",
        "Where our text differs from llama.cpp's plain text:" if flips else
        "Our text equals llama.cpp's plain text on every prompt at every precision.", *flips, ""])
    write_report("llamacpp-precision.md", text)


if __name__ == "__main__":
    main()
