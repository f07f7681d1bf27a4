"""Where the draft model is wrong, and whether a cheap second opinion can tell: the draft's greedy token at every
position of llama.cpp's greedy output, teacher-forced, split by its max q and by whether a second predictor
proposes the same token there.

Why: gamma `conf` ends a draft at the first token whose max q is at most T, unless prompt lookup proposes the
same token (ModelDrafter.lookup_confirms). A stop rule can only be as good as the signals it reads: if the tokens
it stops at are right about as often as a coin, no rule over these signals drafts much further, and only a draft
that is wrong less often (a better draft model) shortens the verify forwards' count. The second opinions are the
ones the zoo already ships and costs nothing or little to ask: prompt lookup's first token (what staged drafting
reads), the zoo's n-gram table's most frequent next token, and the unaligned zoo draft's greedy token.

Every model runs on llama.cpp as the bench runs it (the f32 target GGUF; the drafts at q8_0). Positions: the first
128 generated tokens of each prompt; a token is **right** when it equals the target's greedy token there.

Usage: python scripts/draft_second_opinions.py [--prompts 32] [--first 0]
Writes benchmarks/draft-second-opinions.md (--first 0) or draft-second-opinions-from-N.md (and prints it)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import torch

from draftverify import DraftVerifyError, load
from draftverify.backends import DEFAULT_DRAFT_GGUF
from draftverify.backends.llamacpp import LlamaCppLM, open_gguf
from draftverify.drafters.ngram import NgramTable
from draftverify.drafters.prompt_lookup import find_continuation
from ab_options import ab_parser, humaneval_texts, report_name, run_line, write_report

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "zoo" / "code"
NEW_TOKENS = 128
OPINIONS = ("prompt lookup", "n-gram table", "unaligned draft")
THRESHOLD = 0.9  # the bench's conf=0.9 for the aligned draft


def greedy_along(lm: LlamaCppLM, sequence: list[int], start: int) -> tuple[list[int], list[float]]:
    """The model's greedy token and its max q at each position start..end of `sequence`, teacher-forced."""
    lm.start(torch.tensor([sequence[:start]]))
    logits = lm.forward(torch.tensor([sequence[start - 1 : -1]])).logits[0]  # [n, V]
    q = torch.softmax(logits, dim=-1)
    top, token = q.max(dim=-1)
    return token.tolist(), top.tolist()


def main() -> None:
    ap = ab_parser(rounds=None, prompts=32, first=True)
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompts = humaneval_texts(ap, args)
    try:
        pipe = load(zoo="code", draft=ZOO / "draft-aligned", method="model", backend="llamacpp",
                    gamma=f"conf={THRESHOLD:g}", threads=2)
        unaligned = LlamaCppLM(open_gguf(ZOO / "draft", role="draft", outtype=DEFAULT_DRAFT_GGUF)[0], role="draft",
                               threads=2)
    except DraftVerifyError as err:
        ap.exit(2, f"error: {err}\n")
    aligned = pipe.drafter.lm
    ngram = NgramTable.load(ZOO / "ngram.safetensors")
    # bucket -> [positions, draft right]; (bucket, opinion) -> [positions, draft right, opinion right]
    buckets: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    split: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    total = 0
    for text in prompts:
        output = pipe.generate(text, max_new_tokens=NEW_TOKENS).output
        sequence = output.sequences[0].tolist()
        start = len(sequence) - output.new_tokens.shape[1]
        drafted, tops = greedy_along(aligned, sequence, start)
        others, _ = greedy_along(unaligned, sequence, start)
        for i, t in enumerate(range(start, len(sequence))):
            target, token, context = sequence[t], drafted[i], sequence[:t]
            looked = find_continuation(context, *pipe.drafter.lookup_ngrams, 1)  # what staged drafting looks up
            counts_tokens, counts = ngram.next_counts(context)
            opinions = {"prompt lookup": looked[0] if looked else None,
                        "n-gram table": int(counts_tokens[counts.argmax()]),
                        "unaligned draft": others[i]}
            bucket = f"max q > {THRESHOLD:g}" if tops[i] > THRESHOLD else f"max q <= {THRESHOLD:g}"
            right = token == target
            total += 1
            for name in (bucket, "all"):
                buckets[name][0] += 1
                buckets[name][1] += right
            for name, opinion in opinions.items():
                verdict = "none" if opinion is None else "agrees" if opinion == token else "disagrees"
                cell = split[bucket, name, verdict]
                cell[0] += 1
                cell[1] += right
                cell[2] += opinion == target
    last = args.first + len(prompts) - 1
    longest, shortest = pipe.drafter.lookup_ngrams

    def share(n: int) -> str:
        return f"{100 * n / total:.1f}%"

    rows = [f"| {name} | {share(n)} | {right / n:.3f} |" for name, (n, right) in sorted(buckets.items()) if n]
    detail = []
    for bucket in sorted(b for b in buckets if b != "all"):
        for name in OPINIONS:
            for verdict in ("agrees", "disagrees", "none"):
                n, right, other = split[bucket, name, verdict]
                if n:
                    detail.append(f"| {bucket} | {name} | {verdict} | {share(n)} | {right / n:.3f} | "
                                  f"{'-' if verdict == 'none' else f'{other / n:.3f}'} |")
    text = "\n".join([
        "# Where the draft is wrong, and what a second opinion says", "",
        f"{run_line('draft_second_opinions.py', args)}, 2 threads; HumanEval prompts {args.first}..{last}, the "
        f"first {NEW_TOKENS} tokens of llama.cpp's greedy output on the f32 target GGUF ({total} positions). At "
        f"each position, teacher-forced: the aligned draft's greedy token and max q (`draft-aligned`, "
        f"{DEFAULT_DRAFT_GGUF} GGUF; "
        f"the bench's threshold {THRESHOLD:g}), prompt lookup's first token (max / min n-gram {longest} / "
        f"{shortest}, as staged drafting looks up), the zoo n-gram table's most frequent next token, and the "
        f"unaligned zoo draft's greedy token ({DEFAULT_DRAFT_GGUF} GGUF). **right**: equal to the target's greedy "
        "token.", "",
        "| draft token | positions | draft right |", "|---|---:|---:|", *rows, "",
        "By second opinion (**opinion right**: the second opinion's own token equals the target's):", "",
        "| draft token | second opinion | it | positions | draft right | opinion right |",
        "|---|---|---|---:|---:|---:|", *detail, ""])
    write_report(report_name("draft-second-opinions", args), text)


if __name__ == "__main__":
    main()
