"""Draft-length stop rules compared on recorded drafts, on the llama.cpp backend's measured costs.

Records, for every position t of llama.cpp's greedy output on the zoo (8 HumanEval prompts x 128 tokens): the zoo
draft's (q8_0 GGUF) greedy draft of `--depth` tokens from the committed text, each token's max q, and how many of
them the target's greedy text accepts. Then replays each rule over the outputs: a step at t drafts L tokens (the
rule's stopping time over the max q's), emits min(accepted, L) + 1 and costs one target call over L + 1 tokens
(this run's llama.cpp cost curve, measured here after a 120-token context) plus L draft forwards and the loop's
work per step (both measured here from `llamacpp:model[conf]` generations). Prefill is left out: it is the same
for every rule. `oracle` drafts exactly the accepted tokens (an upper bound no rule reaches).

Rules: `per-token T` (gamma conf's stop: end at the first token whose max q <= T), `cumulative C` (end when the
product of the max q's so far <= C), both together, and fixed lengths.

--draft picks the zoo's draft (`draft`, or its BiLD-aligned twin `draft-aligned`); --first N starts at HumanEval
prompt N, so a threshold can be chosen on prompts the bench (the first 8) never uses.

Usage: python scripts/draft_stop_rules.py [--draft draft] [--first 0] [--prompts 8] [--depth 32] [--out FILE]
Writes benchmarks/draft-stop-rules.md (or --out; and prints it)."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from draftverify import load
from draftverify.bench.cost import LlamaCppForward, time_widths
from draftverify.bench.environment import machine, now
from draftverify.bench.prompts import default_data_dir, load_humaneval

ROOT = Path(__file__).resolve().parents[1]
NEW_TOKENS = 128
WIDTHS = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 33)


@torch.inference_mode()
def record(pipe, prompts: list[str], depth: int) -> list[list[tuple[list[float], int]]]:
    """Per prompt, per output position: (the draft's max q at each of `depth` tokens, tokens the target accepts)."""
    draft = pipe.drafter.lm
    out = []
    for text in prompts:
        result = pipe.generate(text, max_new_tokens=NEW_TOKENS + depth).output
        sequence = result.sequences[0].tolist()
        start = len(sequence) - result.new_tokens.shape[1]
        steps = []
        for t in range(min(NEW_TOKENS, len(sequence) - start)):
            draft.start(torch.tensor([sequence[: start + t]]))
            pending, confidences, accepted = sequence[start + t - 1], [], None
            for k in range(depth):
                q = torch.softmax(draft.forward(torch.tensor([[pending]])).logits[0, -1], dim=-1)
                confidence, token = q.max(dim=-1)
                confidences.append(float(confidence))
                pending = int(token)
                if accepted is None and (start + t + k >= len(sequence) or pending != sequence[start + t + k]):
                    accepted = k
            steps.append((confidences, depth if accepted is None else accepted))
        out.append(steps)
    return out


def measured_costs(pipe, prompts: list[str]) -> tuple[list[tuple[int, float]], float, float]:
    """This run's target curve [(n, ms)] (made non-decreasing), draft ms per forward and loop ms per step."""
    runner = LlamaCppForward(ROOT / "zoo" / "code" / "target", "float32", threads=2)
    context = pipe.encode(prompts[0])[:, :120]
    points, _ = time_widths(runner, context, WIDTHS, warmup=3, repeats=20)
    curve, top = [], 0.0
    for p in points:
        top = max(top, p.median_ms)
        curve.append((p.n, top))
    draft_s = calls = loop_s = steps = 0.0
    for text in prompts:
        stats = pipe.generate(text, max_new_tokens=NEW_TOKENS).output.stats
        draft_s += stats.time_draft
        calls += stats.draft_calls
        loop_s += stats.time_verify + stats.time_other
        steps += stats.target_calls
    return curve, 1000 * draft_s / calls, 1000 * loop_s / steps


def replay(steps_per_prompt, rule, curve, draft_ms: float, loop_ms: float) -> tuple[float, float]:
    """(modelled tokens/s without the prefill, tokens per target call)."""
    def verify_ms(n: int) -> float:
        for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
            if n <= x1:
                return y0 + (y1 - y0) * (n - x0) / (x1 - x0)
        return curve[-1][1]

    ms = tokens = calls = 0.0
    for steps in steps_per_prompt:
        t = 0
        while t < len(steps):
            confidences, accepted = steps[t]
            length = min(rule(confidences, accepted), len(steps) - t)
            emitted = min(accepted, length) + 1
            ms += verify_ms(length + 1) + length * draft_ms + loop_ms
            tokens += emitted
            calls += 1
            t += emitted
    return 1000 * tokens / ms, tokens / calls


def stop_rule(per_token: float = 0.0, cumulative: float = 0.0):
    def rule(confidences, accepted):
        product = 1.0
        for k, q in enumerate(confidences):
            product *= q
            if q <= per_token or product <= cumulative:
                return k + 1
        return len(confidences)
    return rule


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--depth", type=int, default=32)
    ap.add_argument("--draft", default="draft", choices=("draft", "draft-aligned"))
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "draft-stop-rules.md")
    args = ap.parse_args()
    if args.prompts < 1 or args.depth < 1 or args.first < 0:
        ap.exit(2, "error: --prompts and --depth must be at least 1, --first at least 0\n")
    torch.set_num_threads(2)
    pipe = load(zoo="code", draft=ROOT / "zoo" / "code" / args.draft, method="model", backend="llamacpp",
                gamma="conf", threads=2)
    prompts = [p.text for p in load_humaneval(default_data_dir())[args.first : args.first + args.prompts]]
    pipe.generate(prompts[0], max_new_tokens=32)
    curve, draft_ms, loop_ms = measured_costs(pipe, prompts)
    recorded = record(pipe, prompts, args.depth)
    rules = {f"fixed {g}": (lambda g: lambda c, a: g)(g) for g in (4, 6, 8)}
    rules |= {f"per-token {t:g}": stop_rule(per_token=t) for t in (0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9)}
    rules |= {f"cumulative {c:g}": stop_rule(cumulative=c) for c in (0.05, 0.1, 0.2, 0.3, 0.5)}
    rules |= {f"per-token 0.4 + cumulative {c:g}": stop_rule(0.4, c) for c in (0.02, 0.05, 0.1)}
    rules["oracle (drafts exactly the accepted tokens)"] = lambda c, a: max(a, 0)
    results = {name: replay(recorded, rule, curve, draft_ms, loop_ms) for name, rule in rules.items()}
    best = max((v[0], k) for k, v in results.items() if not k.startswith("oracle"))[1]
    lines = [f"| {name} | {speed:.1f} | {per_call:.2f} | {speed / results['per-token 0.4'][0]:.3f}x |"
             for name, (speed, per_call) in results.items()]
    m = machine()
    text = "\n".join([
        "# Draft-length stop rules on recorded drafts (llama.cpp backend)", "",
        f"`python scripts/draft_stop_rules.py --draft {args.draft} --first {args.first} --prompts {args.prompts} "
        f"--depth {args.depth}" + ("" if args.out == ROOT / "benchmarks" / "draft-stop-rules.md" else
                                   f" --out {args.out.relative_to(ROOT) if args.out.is_absolute() else args.out}")
        + f"`; {now()}; {m['cpu_model']} ({m['cores']} cores), 2 threads; the zoo target (f32 GGUF) and "
        f"`{args.draft}` (q8_0 GGUF); HumanEval prompts {args.first}..{args.first + len(prompts) - 1} x {NEW_TOKENS} "
        f"tokens, greedy. Costs measured in this run: target call "
        f"over n tokens " + ", ".join(f"n={n}: {ms:.2f} ms" for n, ms in curve) + f"; a draft forward "
        f"{draft_ms:.3f} ms and the loop's work {loop_ms:.3f} ms per step (from `llamacpp:model[conf]` generations). "
        "Modelled tokens/s leave out the prefill (the same for every rule). `per-token 0.4` is gamma `conf`'s rule.",
        "", f"Fastest rule here (oracle aside): **{best}**.", "",
        "| rule | modelled tok/s | tokens / call | vs per-token 0.4 |", "|---|---:|---:|---:|", *lines, ""])
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
