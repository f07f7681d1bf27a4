"""Copy measured tables from benchmarks/*.md into README.md between <!-- name:begin --> / <!-- name:end --> markers,
so every figure in the README is one a benchmark command printed. Usage: python scripts/update_readme.py"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# marker name -> (benchmark markdown file, heading whose first table is copied; None = first table in the file)
SOURCES = {
    "loop-overhead": ("benchmarks/cost/loop-overhead.md", None),
    "held-out": ("benchmarks/zoo/zoo-held-out.md", None),
    "bench-greedy": ("benchmarks/speed/bench-humaneval.md", "## Temperature 0 (greedy)"),
    "bench-sampling": ("benchmarks/speed/bench-humaneval.md", "## Temperature 1"),
    "bench-bild": ("benchmarks/speed/bench-humaneval.md", "## Lossy methods"),
    "bench-compiled": ("benchmarks/speed/bench-humaneval-compiled.md", "## Temperature 0 (greedy)"),
    "bench-blockwise": ("benchmarks/speed/bench-humaneval-blockwise.md", "## Temperature 0 (greedy)"),
    "gemv-floor": ("benchmarks/cost/gemv-floor.md", None),
    "bench-batch": ("benchmarks/batch/bench-batch.md", None),
    "load-test": ("benchmarks/serving/load-test.md", "## Summary"),
    "load-test-rss": ("benchmarks/serving/load-test.md", "## Resident memory"),
    "load-test-mixed": ("benchmarks/serving/load-test-mixed.md", "## Summary"),
    "load-test-mixed-equal": ("benchmarks/serving/load-test-mixed.md", "Every answered request"),
    "bench-othertok": ("benchmarks/speed/bench-humaneval-othertok.md", "## Temperature 0 (greedy)"),
    "translate-specdec": ("benchmarks/translation/translate-specdec.md", None),
    "translate-step-cost": ("benchmarks/translation/translate-specdec.md", "## What a step costs"),
    "bpd-efficiency": ("benchmarks/methods/bpd-humaneval.md", "## Block efficiency"),
    "bpd-duel": ("benchmarks/methods/bpd-humaneval.md", "## Neural-rescored vs plain"),
    "cold-start": ("benchmarks/speed/cold-start.md", None),
    "cost-curve": ("benchmarks/cost/cost-code.md", "## Milliseconds per forward"),
    "cost-equality": ("benchmarks/cost/cost-code.md", "## Greedy equality"),
    "healing": ("benchmarks/methods/healing-humaneval.md", None),
    "bench-llamacpp": ("benchmarks/speed/bench-humaneval-llamacpp.md", "## Temperature 0 (greedy)"),
    "bench-llamacpp-duels": ("benchmarks/speed/bench-humaneval-llamacpp.md", "## Head to head"),
    "cost-curve-llamacpp": ("benchmarks/cost/cost-code-llamacpp.md", "## Milliseconds per forward"),
    "llamacpp-draft-gguf": ("benchmarks/llamacpp/llamacpp-draft-gguf.md", None),
    "bench-rounds": ("benchmarks/speed/bench-rounds.md", None),
    "llamacpp-flash-attn": ("benchmarks/llamacpp/llamacpp-flash-attn.md", None),
    "staged-draft-ab": ("benchmarks/draft-policy/staged-draft-ab.md", None),
    "lookup-agreement-ab": ("benchmarks/draft-policy/lookup-agreement-ab.md", None),
    "conf-cap-ab": ("benchmarks/draft-policy/conf-cap-ab.md", None),
    "conf-cap-ab-heldout": ("benchmarks/draft-policy/conf-cap-ab-from-100.md", None),
    "llamacpp-precision": ("benchmarks/llamacpp/llamacpp-precision.md", None),
    "llamacpp-time-split": ("benchmarks/cost/llamacpp-time-split.md", None),
    "llamacpp-time-split-widths": ("benchmarks/cost/llamacpp-time-split.md", "## Verify forwards by width"),
    "draft-second-opinions": ("benchmarks/draft-policy/draft-second-opinions-from-100.md", None),
    "draft-second-opinions-split": ("benchmarks/draft-policy/draft-second-opinions-from-100.md", "By second opinion"),
    "lean-draft": ("benchmarks/cost/lean-draft.md", "## Milliseconds per draft forward"),
    "lean-draft-generation": ("benchmarks/cost/lean-draft.md", "## Generation"),
}


def first_table(text: str, heading: str | None) -> str:
    if heading is not None:
        start = text.find(heading)
        if start < 0:
            return ""
        text = text[start:]
    lines, table = text.splitlines(), []
    for line in lines:
        if line.startswith("|"):
            table.append(line)
        elif table:
            break
    return "\n".join(table)


def main() -> None:
    readme = (ROOT / "README.md").read_text()
    for name, (source, heading) in SOURCES.items():
        path = ROOT / source
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        if not pattern.search(readme):
            continue
        if not path.exists():
            print(f"skip {name}: {source} not found", file=sys.stderr)
            continue
        table = first_table(path.read_text(), heading)
        if not table:
            print(f"skip {name}: no table under {heading!r} in {source}", file=sys.stderr)
            continue
        readme = pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), readme)
        print(f"updated {name} from {source}")
    (ROOT / "README.md").write_text(readme)


if __name__ == "__main__":
    main()
