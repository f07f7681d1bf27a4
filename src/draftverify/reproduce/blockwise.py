"""`draftverify reproduce blockwise`: the paper's analyses of blockwise drafts on our zoo, as counts (no wall clock).

For each prompt (greedy, the zoo target with trained heads) it runs, through the one decoding loop:
plain BPD; the oracle path through the top-k lattice for several k (Figure 6: the best draft in hindsight,
which knows the target's greedy text); n-gram rescoring (p = 1) for several weights alpha; p-best drafts with and
without the n-gram (Figure 7 / Table 4); local rescoring by the zoo's draft model for several alpha (Algorithm 2).
It records every draft, so it also reports consecutive repetition in drafts before and after 2-gram rescoring
(Table 3), each head's mean entropy with h_max (Figure 3), and, step by step along the plain BPD run, whether the
neural-rescored draft would have kept more, as many or fewer tokens than the plain one (wins / ties / losses, with
the share of wins that removed a repetition and of losses that introduced one: Table 5).

alpha is tuned on the first `tune` prompts (by block efficiency) and every table is reported on the others.
Block efficiency = tokens emitted per target call (accepted drafts + the target's own token).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..backends.hf.cached_lm import CachedLM
from ..drafters.blockwise import BlockwiseDrafter, BlockwiseHeads
from ..drafters.blockwise_lattice import BlockwiseNgramDrafter
from ..drafters.blockwise_neural import BlockwiseNeuralDrafter, rescore_locally
from ..drafters.lattice import SausageLattice
from ..drafters.ngram import NgramTable
from ..loop import generate
from ..markdown import markdown_table
from ..methods import MethodOptions, build_verifier
from ..types import DecodingState, Draft, SamplingParams

ALPHAS = (0.25, 0.5, 1.0)  # n-gram weights tried for p = 1 (tuned on the tune slice)
PBEST_ALPHAS = (0.0, 0.5)  # p-best: 0-gram (heads only) and the n-gram at 0.5
NEURAL_ALPHAS = (0.25, 0.5, 1.0, 2.0)  # draft-model weights tried for local rescoring (tuned on the tune slice)
ORACLE_KS = (1, 2, 4, 8, 16)
PBESTS = (2, 4, 8)


class OracleDrafter(BlockwiseDrafter):
    """Drafts the lattice path that spells the target's known greedy text for as long as the top-k allows
    (then each head's top-1): the oracle top-k draft. Analysis only: it reads the answer."""

    def __init__(self, heads: BlockwiseHeads, k: int, truth: list[int]):
        super().__init__(heads)
        self.k = k
        self.truth = truth  # prompt + the target's greedy continuation

    def propose(self, state: DecodingState, gamma: int) -> Draft:
        if self._hidden is None:
            return super().propose(state, gamma)
        lattice = SausageLattice.top_k(self.head_logits()[0, :gamma], self.k)
        position = state.tokens.shape[1]  # the draft's first token continues the committed text
        wanted = self.truth[position : position + lattice.depth]
        matched = lattice.oracle_length(wanted)
        path = wanted[:matched] + lattice.tokens[matched:, 0].tolist()
        return Draft(tokens=torch.tensor([path[: lattice.depth]], device=state.tokens.device))


@dataclass
class Recorded:
    """Every draft a drafter proposed, and (for plain BPD) each head's entropy at each step."""

    drafts: list[list[int]] = field(default_factory=list)
    entropies: list[list[float]] = field(default_factory=list)  # per step: heads 1..h (nats)
    steps: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # per step: (position, heads' logits [n, V])
    step_entropies: list[list[float]] = field(default_factory=list)  # per entry of steps: heads 1..h (nats)


def recording(drafter: BlockwiseDrafter, log: Recorded, entropies: bool = False) -> BlockwiseDrafter:
    """Wrap drafter.propose on this instance so each chain draft (and the heads' entropies) lands in log."""
    propose = drafter.propose

    def wrapped(state: DecodingState, gamma: int) -> Draft:
        draft = propose(state, gamma)
        entropy = None
        if entropies and drafter._hidden is not None:
            logits = torch.cat([drafter.lm_head(drafter._hidden)[:, None], drafter.head_logits()], dim=1)[0]
            logp = logits.float().log_softmax(-1)  # [h, V]
            entropy = (-(logp.exp() * logp).sum(-1)).tolist()
            log.entropies.append(entropy)
        if draft.tree is None and draft.length:
            log.drafts.append(draft.tokens[0].tolist())
            if entropy is not None:
                log.steps.append((state.tokens.shape[1], drafter.head_logits()[0, : draft.length]))
                log.step_entropies.append(entropy)
        return draft

    drafter.propose = wrapped
    return drafter


def repetition(drafts: list[list[int]]) -> dict:
    """Paper Table 3: % of neighbouring draft tokens that are identical, and the mean longest run of one token."""
    pairs = same = 0
    runs = []
    for d in drafts:
        pairs += max(len(d) - 1, 0)
        same += sum(a == b for a, b in zip(d, d[1:]))
        best = run = 1
        for a, b in zip(d, d[1:]):
            run = run + 1 if a == b else 1
            best = max(best, run)
        runs.append(best)
    return {
        "consecutive_pct": 100 * same / pairs if pairs else 0.0,
        "mean_max_run": sum(runs) / len(runs) if runs else 0.0,
        "drafts": len(drafts),
    }


def accepted(draft: list[int], truth: list[int], position: int) -> int:
    """Greedy acceptance of a draft continuing truth[:position]: its longest prefix that the target would say."""
    wanted = truth[position : position + len(draft)]
    return next((i for i, (a, b) in enumerate(zip(draft, wanted)) if a != b), min(len(draft), len(wanted)))


def has_repeat(draft: list[int]) -> bool:
    return any(a == b for a, b in zip(draft, draft[1:]))


def neural_duel(
    steps: list[tuple[int, torch.Tensor]], drafts: list[list[int]], truth: list[int], rescorer, k: int, alpha: float
) -> dict:
    """Table 5 along one plain BPD run: at each step the neural-rescored draft (same heads' logits, same
    committed text truth[:position]) against the plain draft, by how many tokens each would keep."""
    tally = {"win": 0, "tie": 0, "loss": 0, "repair": 0, "regress": 0}
    with torch.no_grad():
        for (position, z), plain in zip(steps, drafts):
            context = truth[:position]
            chosen: list[int] = []

            def next_logits(last: torch.Tensor | None) -> torch.Tensor:
                chosen.extend([] if last is None else last[0].tolist())
                return rescorer(input_ids=torch.tensor([context + chosen])).logits[:, -1]  # [1, V]

            rescored = rescore_locally(z[None], k, alpha, next_logits)[0].tolist()
            gain = accepted(rescored, truth, position) - accepted(plain, truth, position)
            outcome = "win" if gain > 0 else "loss" if gain < 0 else "tie"
            tally[outcome] += 1
            if outcome == "win" and has_repeat(plain) and not has_repeat(rescored):
                tally["repair"] += 1
            if outcome == "loss" and has_repeat(rescored) and not has_repeat(plain):
                tally["regress"] += 1
    return tally


def entropy_bins(entropies: list[float], kept: list[int], bins: int = 4) -> list[dict]:
    """Figure 3's relation: steps sorted by head 2's entropy into equal-count bins; per bin its entropy range and the
    mean number of draft tokens the target kept."""
    order = sorted(range(len(entropies)), key=entropies.__getitem__)
    rows = []
    for b in range(bins):
        chosen = order[b * len(order) // bins : (b + 1) * len(order) // bins]
        if chosen:
            rows.append(
                {
                    "low": entropies[chosen[0]],
                    "high": entropies[chosen[-1]],
                    "steps": len(chosen),
                    "mean_kept": sum(kept[i] for i in chosen) / len(chosen),
                }
            )
    return rows


def bigram_view(table: NgramTable) -> NgramTable:
    """The table's order-2 part (unigram + bigram levels): the paper's 2-gram rescorer for Table 3."""
    return NgramTable(2, table.vocab_size, {k: table.levels[k] for k in (0, 1)})


def run_report(
    target,
    heads: BlockwiseHeads,
    table: NgramTable,
    rescorer,
    prompts: list[torch.Tensor],
    new_tokens: int,
    tune: int,
    k: int,
    log=print,
) -> dict:
    exact = build_verifier("exact", SamplingParams(), MethodOptions())
    num_drafts = heads.config.num_heads - 1
    per_prompt: dict[str, list[dict]] = {}

    def run(name: str, drafter, ids):
        t0 = time.perf_counter()
        out = generate(target, drafter, exact, ids, max_new_tokens=new_tokens, gamma=num_drafts)
        per_prompt.setdefault(name, []).append(
            {"new_tokens": out.stats.new_tokens, "calls": out.stats.target_calls, "seconds": time.perf_counter() - t0}
        )
        return out

    logs: dict[str, Recorded] = {"bpd": Recorded(), "ngram2": Recorded(), "ngram3": Recorded()}
    bigram = bigram_view(table)
    duels: dict[float, list[dict]] = {alpha: [] for alpha in NEURAL_ALPHAS}
    head2: list[float] = []
    kept: list[int] = []
    for i, ids in enumerate(prompts):
        plain_log = Recorded()
        plain = run("bpd", recording(BlockwiseDrafter(heads), plain_log, entropies=True), ids)
        truth = plain.sequences[0].tolist()
        for alpha in NEURAL_ALPHAS:
            run(f"neural a={alpha}", BlockwiseNeuralDrafter(heads, CachedLM(rescorer, role="draft"), k, alpha), ids)
            duels[alpha].append(neural_duel(plain_log.steps, plain_log.drafts, truth, rescorer, k, alpha))
        logs["bpd"].drafts += plain_log.drafts
        logs["bpd"].entropies += plain_log.entropies
        if i >= tune:  # the report slice: head 2's entropy at each step against the draft tokens the target kept
            head2.extend(e[1] for e in plain_log.step_entropies)
            kept.extend(accepted(d, truth, pos) for (pos, _), d in zip(plain_log.steps, plain_log.drafts))
        for kk in ORACLE_KS:
            run(f"oracle k={kk}", OracleDrafter(heads, kk, truth), ids)
        for alpha in ALPHAS:
            drafter = BlockwiseNgramDrafter(heads, table, k, alpha, 1)
            run(f"ngram3 a={alpha}", recording(drafter, logs["ngram3"]) if alpha == 0.5 else drafter, ids)
        run("ngram2 a=0.5", recording(BlockwiseNgramDrafter(heads, bigram, k, 0.5, 1), logs["ngram2"]), ids)
        for p in PBESTS:
            for alpha in PBEST_ALPHAS:
                name = f"pbest p={p} " + ("0-gram" if alpha == 0 else f"a={alpha}")
                run(name, BlockwiseNgramDrafter(heads, table, k, alpha, p), ids)
        log(f"prompt {i + 1}/{len(prompts)}: bpd {plain.stats.tokens_per_call:.2f} tokens/call")

    def efficiency(name: str, rows: slice) -> float:
        chosen = per_prompt[name][rows]
        return sum(r["new_tokens"] for r in chosen) / max(sum(r["calls"] for r in chosen), 1)

    tune_rows, report_rows = slice(0, tune), slice(tune, None)
    best_alpha = max(ALPHAS, key=lambda a: efficiency(f"ngram3 a={a}", tune_rows))
    neural_alpha = max(NEURAL_ALPHAS, key=lambda a: efficiency(f"neural a={a}", tune_rows))
    duel = {key: sum(d[key] for d in duels[neural_alpha][report_rows]) for key in duels[neural_alpha][0]}
    table_rows = {name: efficiency(name, report_rows) for name in per_prompt}
    entropy = torch.tensor(logs["bpd"].entropies).mean(dim=0).tolist() if logs["bpd"].entropies else []
    h_max = next((i + 1 for i in range(len(entropy) - 1) if entropy[i] > entropy[i + 1]), len(entropy))
    return {
        "prompts": len(prompts),
        "tune_prompts": tune,
        "report_prompts": len(prompts) - tune,
        "new_tokens": new_tokens,
        "num_heads": heads.config.num_heads,
        "lattice_k": k,
        "ngram_order": table.order,
        "block_efficiency": table_rows,
        "tuned_alpha": best_alpha,
        "tuned_neural_alpha": neural_alpha,
        "neural_vs_plain": duel,
        "repetition": {
            "bpd": repetition(logs["bpd"].drafts),
            "ngram2 a=0.5": repetition(logs["ngram2"].drafts),
            "ngram3 a=0.5": repetition(logs["ngram3"].drafts),
        },
        "head_entropy_nats": entropy,
        "h_max": h_max,
        "per_prompt": per_prompt,
        "kept_by_head2_entropy": entropy_bins(head2, kept),
    }


def markdown(result: dict, command: str) -> str:
    be = result["block_efficiency"]
    base = be["bpd"]
    lines = [
        "# Blockwise parallel decoding on the code zoo: block efficiency, oracle, rescoring",
        "",
        f"`{command}`",
        "",
        f"{result['num_heads']} heads (head 1 = the target), greedy, {result['new_tokens']} new tokens per prompt; top-"
        f"{result['lattice_k']} lattice; n-gram: the zoo's order-{result['ngram_order']} table (stupid-backoff "
        f"scores). alpha tuned on the first {result['tune_prompts']} prompts, figures on the other "
        f"{result['report_prompts']}. Block efficiency = tokens per target call (a count; no wall clock was measured "
        "for this report).",
        "",
        "## Block efficiency (Table 4, Figure 6)",
        *markdown_table(
            ("drafts", "tokens per target call", "vs bpd"),
            [(name, f"{value:.3f}", f"{100 * (value / base - 1):+.1f}%") for name, value in be.items()],
        ),
    ]
    duel = result["neural_vs_plain"]
    steps = max(duel["win"] + duel["tie"] + duel["loss"], 1)
    lines += [
        "",
        f"alpha of n-gram rescoring (p = 1) tuned on the tune prompts: {result['tuned_alpha']} (p-best runs use "
        f"0 and 0.5); alpha of neural rescoring (the zoo's draft model): {result['tuned_neural_alpha']}",
        "",
        f"## Neural-rescored vs plain drafts, step by step (Table 5; alpha {result['tuned_neural_alpha']})",
        "At each step of the plain BPD run, both drafts continue the same text; a win keeps more tokens.",
        "",
        *markdown_table(
            ("steps", "ties", "wins", "losses")
            + ("% repair (wins that removed a repetition)", "% regress (losses that added one)"),
            [
                (
                    steps,
                    *(f"{100 * duel[k] / steps:.1f}%" for k in ("tie", "win", "loss")),
                    f"{100 * duel['repair'] / max(duel['win'], 1):.1f}%",
                    f"{100 * duel['regress'] / max(duel['loss'], 1):.1f}%",
                )
            ],
        ),
        "",
        "## Consecutive repetition in drafts (Table 3)",
        *markdown_table(
            ("drafts", "% consecutive identical", "mean max run", "drafts"),
            [
                (name, f"{rep['consecutive_pct']:.1f}", f"{rep['mean_max_run']:.2f}", rep["drafts"])
                for name, rep in result["repetition"].items()
            ],
        ),
        "",
        "## Mean entropy per head (Figure 3), nats",
        *markdown_table(("head", "entropy"), [(i + 1, f"{h:.3f}") for i, h in enumerate(result["head_entropy_nats"])]),
    ]
    lines += [
        "",
        f"h_max (entropy rises monotonically up to this head): {result['h_max']}",
        "",
        "## Draft tokens kept by head 2's entropy (Figure 3: confident heads draft better)",
        "Plain BPD steps of the report prompts in four equal-count bins of head 2's entropy.",
        "",
    ]
    lines += markdown_table(
        ("head 2 entropy (nats)", "steps", "mean draft tokens kept"),
        [
            (f"{b['low']:.2f} - {b['high']:.2f}", b["steps"], f"{b['mean_kept']:.2f}")
            for b in result["kept_by_head2_entropy"]
        ],
    )
    if result.get("plot"):
        lines += ["", f"![oracle and rescoring]({Path(result['plot']).name})"]
    return "\n".join(lines + [""])


def plot_report(result: dict, path: Path) -> Path:
    """Figure 6 (oracle block efficiency against k, with plain BPD and each rescoring variant) and Figure 3 (mean
    entropy per head) side by side."""
    from ..bench.plots import pyplot, save_figure

    plt = pyplot()
    be = result["block_efficiency"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    ks = [int(name.split("=")[1]) for name in be if name.startswith("oracle k=")]
    left.plot(ks, [be[f"oracle k={k}"] for k in ks], "o-", color="black", label="oracle top-k")
    best = {
        "plain bpd": be["bpd"],
        "best n-gram (p=1)": max(v for n, v in be.items() if n.startswith("ngram")),
        "best neural": max(v for n, v in be.items() if n.startswith("neural")),
        "best p-best": max(v for n, v in be.items() if n.startswith("pbest")),
    }
    for (label, value), style in zip(best.items(), ("-", "--", "-.", ":")):
        left.axhline(value, linestyle=style, color="gray", label=f"{label} {value:.3f}")
    left.set_xscale("log", base=2)
    left.set_xlabel("k (candidates per head)")
    left.set_ylabel("block efficiency (tokens per target call)")
    left.set_title("Oracle top-k vs rescored drafts")
    left.legend(fontsize=8)
    entropy = result["head_entropy_nats"]
    right.bar(range(1, len(entropy) + 1), entropy, color="#1f77b4")
    right.set_xlabel("head (1 = the target)")
    right.set_ylabel("mean entropy (nats)")
    right.set_title(f"Per-head entropy (h_max = {result['h_max']})")
    return save_figure(fig, path)


def main(
    target_dir: str,
    heads_dir: str,
    ngram_path: str,
    draft_dir: str,
    tokenizer_dir: str,
    num_prompts: int,
    tune: int,
    new_tokens: int,
    k: int,
    out: str,
    command: str,
) -> dict:
    from transformers import AutoTokenizer

    from ..api import load_model
    from ..bench.prompts import load_prompts

    target = load_model(target_dir, "float32")
    heads = BlockwiseHeads.load(heads_dir)
    table = NgramTable.load(ngram_path)
    rescorer = load_model(draft_dir, "float32")
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = [tok(p.text, return_tensors="pt").input_ids for p in load_prompts("humaneval")[:num_prompts]]
    result = run_report(target, heads, table, rescorer, prompts, new_tokens, tune, k)
    result["command"] = command
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = str(plot_report(result, Path(out + ".png")))
    Path(out + ".json").write_text(json.dumps(result, indent=1) + "\n")
    Path(out + ".md").write_text(markdown(result, command))
    return result
