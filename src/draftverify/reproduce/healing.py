"""`draftverify reproduce healing`, token healing on HumanEval: chrF of the completions against the canonical
solutions, for the prompts trimmed of their final newline (what `draftverify bench speed` feeds every runner) and as
published (ending in "\\n", as users write them), with healing off and on. Greedy, our loop without drafting
(`autoregressive`); each method listed with --methods runs the published prompts too and is compared token for token
with `autoregressive` under the same healing setting (healed vs healed: a lossless method must equal it).

    draftverify reproduce healing --zoo code --num-prompts 8 --max-new-tokens 128 --threads 2

Writes <out>/<name>.json (every completion) and <name>.md (the table). chrF as in `draftverify bench speed`'s
"chrF ref" column: the completion, relative to the prompt as given and cut at HumanEval's stop sequences,
against the canonical solution (sacrebleu's corpus chrF).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from time import perf_counter

from ..bench import environment
from ..bench.folders import METHODS
from ..bench.prompts import load_prompts, truncate_at_stops
from ..bench.quality import chrf
from ..bench.report import write_result
from ..errors import DraftVerifyError
from ..markdown import command_block, markdown_table

FORMS = ("trimmed", "published")  # the prompt set 'humaneval' and 'humaneval:published'
BASELINE = "autoregressive"


@dataclass
class HealingRow:
    form: str  # trimmed | published
    heal: bool
    runner: str  # the method
    prompts: int
    healed_prompts: int  # prompts whose last token healing backed up over (0 with healing off)
    first_token_changed: int | None  # healed prompts whose first new token is not the removed one (None: off)
    new_tokens: int
    seconds: float
    chrf_reference: float | None
    equal_to_baseline: int | None  # prompts whose tokens equal `autoregressive`'s at this form and healing
    tokens_per_second: float = 0.0
    texts: list[str] = field(default_factory=list)
    new_ids: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tokens_per_second = self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def _chosen(pipe, num_prompts: int, max_new_tokens: int, data_dir) -> list[tuple]:
    """The first num_prompts HumanEval prompts (both forms) whose published form fits the context."""
    limit = pipe.target.max_positions
    trimmed = load_prompts("humaneval", data_dir)
    published = load_prompts("humaneval:published", data_dir)
    chosen = []
    for t, p in zip(trimmed, published):
        if len(chosen) == num_prompts:
            break
        if limit is None or pipe.encode(p.text).shape[1] + max_new_tokens <= limit:
            chosen.append((t, p))
    return chosen


def _run(pipe, runner: str, form: str, heal: bool, prompts: list, max_new_tokens: int, echo=None) -> HealingRow:
    texts, new_ids, tokens, healed, changed = [], [], 0, 0, 0
    seconds = 0.0
    for i, prompt in enumerate(prompts):
        if echo is not None:
            echo(f"{runner} {form} heal={'on' if heal else 'off'}: prompt {i + 1}/{len(prompts)}")
        started = perf_counter()
        result = pipe.generate(prompt.text, max_new_tokens=max_new_tokens, heal=heal)
        seconds += perf_counter() - started
        texts.append(result.text)
        new_ids.append(result.output.new_tokens[0].tolist())
        tokens += result.stats.new_tokens
        ids = pipe.encode(prompt.text)[0].tolist()
        if heal and pipe.heal_ids(ids) is not None:
            healed += 1
            changed += new_ids[-1][:1] != ids[-1:]  # a longer extension replaced the removed token
    score = chrf([truncate_at_stops(t, p.stops) for t, p in zip(texts, prompts)], [p.reference for p in prompts])
    return HealingRow(
        form=form,
        heal=heal,
        runner=runner,
        prompts=len(prompts),
        healed_prompts=healed,
        first_token_changed=changed if heal else None,
        new_tokens=tokens,
        seconds=seconds,
        chrf_reference=score,
        equal_to_baseline=None,
        texts=texts,
        new_ids=new_ids,
    )


def run_healing(
    zoo: str | None = "code",
    target: str | None = None,
    draft: str | None = None,
    methods: tuple[str, ...] = (),
    num_prompts: int = 8,
    max_new_tokens: int = 128,
    data_dir: str | Path | None = None,
    threads: int | None = None,
    out: str | Path = METHODS,
    name: str = "healing-humaneval",
    command: str | None = None,
    echo=None,
) -> dict:
    """Run the table (see the module) and write <out>/<name>.json and .md; returns the result dict."""
    import torch

    from ..api import load
    from ..methods import resolve_method

    if num_prompts < 1 or max_new_tokens < 1:
        raise DraftVerifyError("--num-prompts and --max-new-tokens must be >= 1")
    if zoo is None and target is None:
        raise DraftVerifyError("no model: give --zoo NAME or --target PATH")
    for method in methods:
        resolve_method(method)  # a typo fails before any model is loaded
    if threads is not None:
        torch.set_num_threads(threads)
    base = load(zoo=zoo, target=target, method=BASELINE)
    if base.target.is_encoder_decoder:
        raise DraftVerifyError("token healing continues a prompt: reproduce healing needs a decoder-only target")
    pipes = {BASELINE: base}
    for method in methods:
        if method != BASELINE:
            pipes[method] = load(zoo=zoo, target=target, draft=draft, method=method)
    chosen = _chosen(base, num_prompts, max_new_tokens, data_dir)
    if not chosen:
        raise DraftVerifyError(f"no HumanEval prompt fits the context with {max_new_tokens} new tokens")
    by_form = {"trimmed": [t for t, _ in chosen], "published": [p for _, p in chosen]}
    rows: list[HealingRow] = []
    for form in FORMS:
        for heal in (False, True):
            rows.append(_run(base, BASELINE, form, heal, by_form[form], max_new_tokens, echo))
    for method, pipe in pipes.items():
        if method == BASELINE:
            continue
        for heal in (False, True):
            rows.append(_run(pipe, method, "published", heal, by_form["published"], max_new_tokens, echo))
    reference = {(r.form, r.heal): r for r in rows if r.runner == BASELINE}
    for row in rows:
        if row.runner != BASELINE:
            same = reference[(row.form, row.heal)]
            row.equal_to_baseline = sum(a == b for a, b in zip(row.new_ids, same.new_ids))
    result = {
        **environment.header(name, command),
        "config": {
            "zoo": zoo,
            "target": str(target) if target else None,
            "draft": str(draft) if draft else None,
            "methods": list(methods),
            "num_prompts": num_prompts,
            "max_new_tokens": max_new_tokens,
            "threads": torch.get_num_threads(),
        },
        "prompts": [p.id for _, p in chosen],
        "rows": [asdict(r) for r in rows],
    }
    return write_result(result, out, name, render_markdown)


def _f(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


SHARES = ("healed_prompts", "first_token_changed", "equal_to_baseline")  # counts shown out of the row's prompts


def table(rows: list[dict]) -> str:
    """The markdown table (also what docs/usage.md copies)."""
    columns = ("prompt form", "healing", "runner", "prompts healed", "first token changed", "chrF ref")
    columns += ("= autoregressive (same form, healing)", "new tokens")
    cells = []
    for r in rows:
        share = {k: "-" if r[k] is None else f"{r[k]}/{r['prompts']}" for k in SHARES}
        cells.append(
            (r["form"], "on" if r["heal"] else "off", f"`{r['runner']}`", share["healed_prompts"])
            + (share["first_token_changed"], _f(r["chrf_reference"]), share["equal_to_baseline"], r["new_tokens"])
        )
    return "\n".join(markdown_table(columns, cells, "lllrrrlr"))


def render_markdown(result: dict) -> str:
    cfg, machine, versions = result["config"], result["machine"], result["versions"]
    load_avg = machine.get("load_average") or [0.0]
    return "\n".join(
        [
            "# Token healing: HumanEval, prompts trimmed vs as published",
            "",
            f"{len(result['prompts'])} prompts ({result['prompts'][0]} ...), up to {cfg['max_new_tokens']} new tokens, "
            f"greedy. {result['date']}; {machine['cpu_model']} ({machine['usable_cores']} cores, torch threads "
            f"{cfg['threads']}, load average {load_avg[0]:.1f}); python {versions['python']}, torch "
            f"{versions['torch']}, transformers {versions['transformers']}, draftverify {versions['draftverify']}, "
            f"commit {(versions.get('git_commit') or 'unknown')[:12]}.",
            "",
            *command_block("Reproduce (from the repository root):", result["reproduce"]),
            "",
            "How to read: **trimmed** prompts end where HumanEval's docstring ends (their final newline removed: what "
            "`draftverify bench speed` feeds every runner, so HF generate and llama.cpp, which do not heal, stay "
            'comparable); **published** prompts end in a bare "\\n", a state the byte-level BPE (which merges "\\n" '
            "with the next line's indentation) never produces in training text. **healing on**: the prompt is backed "
            "up over its last token and the first new token must start with that token's text (healing.py); the "
            "completion is scored relative to the prompt as given. **prompts healed**: prompts whose last token had "
            "longer extensions (else healing is a no-op). **first token changed**: healed prompts whose first new "
            "token is a longer extension, not the removed token itself (healing changed the tokenization at the "
            "boundary). **chrF ref**: corpus chrF of the completions (cut at HumanEval's stop sequences) against the "
            "canonical solutions, as the main bench's column of that name. **= autoregressive**: prompts whose tokens "
            "equal `autoregressive`'s under the same prompt form and healing (a lossless method must match on all: "
            "healed vs healed). Healing costs one prompt token less and one masked logit row; the JSON holds each "
            "row's seconds (on a shared machine: not a speed claim).",
            "",
            table(result["rows"]),
            "",
        ]
    )
