"""`draftverify bench samples`: the target's greedy completions of the first HumanEval prompts, as a reader sees
them, cut at HumanEval's stop sequences; each marked by whether it ends on its own (reaches a stop sequence within
the token budget), a mechanical rule, so whoever quotes a sample need not pick one by hand."""

from __future__ import annotations

from pathlib import Path

from .folders import METHODS


def block(prompt_text: str, body: str) -> str:
    return f"```python\n{prompt_text}{body}\n```"


def run_samples(
    num_prompts: int = 12,
    max_new_tokens: int = 128,
    zoo: str | None = "code",
    target: str | None = None,
    out: str | Path = METHODS,
    name: str = "humaneval-samples",
    command: str = "",
    data_dir: str | Path | None = None,
) -> dict:
    from ..api import load
    from .prompts import load_prompts, truncate_at_stops

    pipe = load(target=target, zoo=None if target else zoo, method="autoregressive")  # the target's greedy text
    samples = []
    for prompt in load_prompts("humaneval", data_dir)[:num_prompts]:
        completion = pipe.generate(prompt.text, max_new_tokens=max_new_tokens).text  # the new text only
        body = truncate_at_stops(completion, prompt.stops)
        samples.append(
            {
                "id": prompt.id,
                "prompt": prompt.text,
                "completion": body.rstrip(),
                "ends_on_its_own": len(body) < len(completion),
            }
        )
    text = (
        f"# The target's greedy HumanEval completions\n\n`{command}` (the target alone, greedy: the text every "
        "exact method gives), cut at HumanEval's stop sequences.\n\n"
        + "\n\n".join(
            f"## {s['id']} ({'ends on its own' if s['ends_on_its_own'] else 'runs to the token limit'})"
            f"\n\n{block(s['prompt'], s['completion'])}"
            for s in samples
        )
        + "\n"
    )
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.md").write_text(text)
    return {"samples": samples, "files": {"markdown": str(folder / f"{name}.md")}}
