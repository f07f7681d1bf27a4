"""The zoo target's greedy completions of the first HumanEval prompts, as a reader sees them.

Writes every completion (cut at HumanEval's stop sequences) to benchmarks/humaneval-samples.md, and copies into
docs/zoo.md (between <!-- humaneval-sample:begin/end --> markers) the first `--show` completions that end on their
own, i.e. reach a stop sequence within the token budget: a mechanical rule, so the docs show no hand-picked text.
Usage: python scripts/humaneval_sample.py [--prompts 12] [--show 2] [--max-new-tokens 128]
"""
import argparse
import re
from pathlib import Path

import draftverify
from draftverify.bench.prompts import load_prompts, truncate_at_stops

ROOT = Path(__file__).resolve().parents[1]
ap = argparse.ArgumentParser()
ap.add_argument("--prompts", type=int, default=12)
ap.add_argument("--show", type=int, default=2)
ap.add_argument("--max-new-tokens", type=int, default=128)
args = ap.parse_args()

pipe = draftverify.load(zoo="code")  # the zoo's default method: exact, so this is the target's greedy text
samples = []
for prompt in load_prompts("humaneval")[: args.prompts]:
    result = pipe.generate(prompt.text, max_new_tokens=args.max_new_tokens)
    completion = result.text  # the new text only
    body = truncate_at_stops(completion, prompt.stops)
    samples.append((prompt, body.rstrip(), len(body) < len(completion)))
    print(prompt.id, "ends on its own" if samples[-1][2] else "runs to the token limit", flush=True)


def block(prompt, body: str) -> str:
    return f"```python\n{prompt.text}{body}\n```"


command = f"python scripts/humaneval_sample.py --prompts {args.prompts} --show {args.show} --max-new-tokens {args.max_new_tokens}"
(ROOT / "benchmarks" / "humaneval-samples.md").write_text(
    f"# The zoo target's greedy HumanEval completions\n\n`{command}` (method `{pipe.method}`, exact: the target's own "
    f"greedy text), cut at HumanEval's stop sequences.\n\n"
    + "\n\n".join(f"## {p.id} ({'ends on its own' if ended else 'runs to the token limit'})\n\n{block(p, b)}"
                  for p, b, ended in samples) + "\n")
shown = [block(p, b) for p, b, ended in samples if ended][: args.show]
readme = (ROOT / "docs" / "zoo.md").read_text()
pattern = re.compile(r"(<!-- humaneval-sample:begin -->\n).*?(<!-- humaneval-sample:end -->)", re.S)
readme = pattern.sub(lambda m: m.group(1) + "\n\n".join(shown) + "\n" + m.group(2), readme)
(ROOT / "docs" / "zoo.md").write_text(readme)
print(f"{sum(e for _, _, e in samples)} of {len(samples)} end on their own; docs/zoo.md shows {len(shown)}")
