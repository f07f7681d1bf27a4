"""Prompt sets: HumanEval (`prompt`, reference `canonical_solution`), Spec-Bench (first turn, by category) and
Multi30k English-German (source sentence, reference translation; not shipped: its terms are research-only)."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftVerifyError

HUMANEVAL_FILE = Path("humaneval") / "HumanEval.jsonl.gz"
SPEC_BENCH_FILE = Path("spec_bench") / "question.jsonl"  # the package ships it gzipped (question.jsonl.gz)
MULTI30K_DIR = Path("multi30k_en_de")  # {split}.{en,de}.gz, as in the project's shared data folder
MULTI30K_TEST = "test_2016_flickr"
PACKAGED_DATA = Path(__file__).resolve().parent / "data"  # both sets with their licences (data/README.md)
# Spec-Bench's "mt_bench" subset is the 80 multi-turn MT-Bench questions, stored under their own 8 categories
MT_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
# HumanEval's stop sequences (openai/human-eval, Codex paper): a completion ends where a new top-level block starts
HUMANEVAL_STOPS = ("\ndef ", "\nclass ", "\nif ", "\nprint(", "\n#")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    reference: str | None = None  # what a good completion looks like (HumanEval canonical_solution), if known
    stops: tuple[str, ...] = ()  # completion is cut at the first of these before scoring against the reference


def default_data_dir() -> Path:
    """$DRAFTVERIFY_DATA, else the copies shipped inside the package (so a fresh clone or install needs nothing)."""
    env = os.environ.get("DRAFTVERIFY_DATA")
    if env:
        return Path(env)
    return PACKAGED_DATA


def _require(path: Path, what: str) -> Path:
    """path, or path + '.gz' (the packaged copies are compressed; upstream's Spec-Bench file is not)."""
    for candidate in (path, path.with_name(path.name + ".gz")):
        if candidate.is_file():
            return candidate
    raise DraftVerifyError(
        f"{what} not found at {path}; pass the folder that holds {path.parent.name}/{path.name} with "
        f"--data-dir DIR (or set $DRAFTVERIFY_DATA)"
    )


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DraftVerifyError(f"{path}:{number} is not valid JSON: {err}") from None
    return rows


def load_humaneval(data_dir: Path, published: bool = False) -> list[Prompt]:
    """HumanEval's prompts, trimmed of their final newlines (default) or as published (ending in "\n")."""
    path = _require(data_dir / HUMANEVAL_FILE, "HumanEval")
    out = []
    for i, row in enumerate(_read_jsonl(path)):
        if "prompt" not in row:
            raise DraftVerifyError(f"{path}: record {i} has no 'prompt' field")
        # trimmed (the default): the prompt's final newline is left to the model. Byte-level BPE merges a newline
        # with the next line's indentation ("\n    "), so a prompt ending in a bare "\n" token is a boundary no
        # training text has, and models then start a new top-level block instead of the function body. Every
        # runner gets the same prompt and the reference body is unchanged; peers (HF generate, llama.cpp) do not
        # heal, so the exactness rows stay comparable. `humaneval:published` keeps the prompts as users write
        # them, for token healing (healing.py, `draftverify reproduce healing`) to handle.
        text = row["prompt"] if published else row["prompt"].rstrip("\n")
        out.append(
            Prompt(
                id=str(row.get("task_id", f"HumanEval/{i}")),
                text=text,
                reference=row.get("canonical_solution"),
                stops=HUMANEVAL_STOPS,
            )
        )
    return out


def load_spec_bench(data_dir: Path, category: str | None) -> list[Prompt]:
    path = _require(data_dir / SPEC_BENCH_FILE, "Spec-Bench")
    rows = _read_jsonl(path)
    available = sorted({str(r.get("category")) for r in rows})
    wanted = None if category is None else set(MT_BENCH_CATEGORIES) if category == "mt_bench" else {category}
    if wanted is not None and not wanted & set(available):
        raise DraftVerifyError(
            f"Spec-Bench has no category {category!r}; choose one of: {', '.join(['mt_bench'] + available)}"
        )
    out = []
    for i, row in enumerate(rows):
        if wanted is not None and row.get("category") not in wanted:
            continue
        turns = row.get("turns") or []
        if not turns or not isinstance(turns[0], str):
            raise DraftVerifyError(f"{path}: record {i} has no first turn")
        reference = row.get("reference")
        reference = (
            reference[0] if isinstance(reference, list) and reference and isinstance(reference[0], str) else None
        )
        out.append(
            Prompt(
                id=f"spec_bench/{row.get('question_id', i)}/{row.get('category')}", text=turns[0], reference=reference
            )
        )
    return out


def load_multi30k(data_dir: Path, split: str = MULTI30K_TEST) -> list[Prompt]:
    """English sources with their German references (line i of each file), e.g. the test_2016_flickr set."""
    sides = []
    for lang in ("en", "de"):
        path = data_dir / MULTI30K_DIR / f"{split}.{lang}.gz"
        if not path.is_file():
            raise DraftVerifyError(
                f"Multi30k {split}.{lang}.gz not found at {path}; pass the folder that holds "
                f"{MULTI30K_DIR}/ with --data-dir DIR (e.g. ../shared/data)"
            )
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            sides.append([line.strip() for line in handle])
    if len(sides[0]) != len(sides[1]):
        raise DraftVerifyError(f"Multi30k {split}: {len(sides[0])} English but {len(sides[1])} German lines")
    return [Prompt(id=f"multi30k/{split}/{i}", text=en, reference=de) for i, (en, de) in enumerate(zip(*sides))]


PROMPT_SETS = ("humaneval", "spec_bench", "multi30k")  # the named sets; any other spec is a file of the user's


def load_prompts(spec: str, data_dir: str | Path | None = None) -> list[Prompt]:
    """spec: 'humaneval' (prompts trimmed of their final newline), 'humaneval:published' (as published),
    'spec_bench' (every category), 'spec_bench:<category>' (or 'spec_bench:mt_bench'), 'multi30k'
    (test_2016_flickr), 'multi30k:<split>', or the path of the user's own prompts (load_prompt_file)."""
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    name, _, category = spec.partition(":")
    if not spec.strip():
        raise DraftVerifyError(f"--prompts is empty; give one of {', '.join(PROMPT_SETS)} or a prompt file")
    if name not in PROMPT_SETS:
        return load_prompt_file(Path(spec))
    if name == "humaneval" and category in ("", "published"):
        return load_humaneval(folder, published=category == "published")
    if name == "spec_bench":
        return load_spec_bench(folder, category or None)
    if name == "multi30k":
        return load_multi30k(folder, category or MULTI30K_TEST)
    raise DraftVerifyError(f"unknown prompt set {spec!r}; use humaneval or humaneval:published")


def load_prompt_file(path: Path) -> list[Prompt]:
    """The user's own prompts: a JSONL file (.jsonl or .jsonl.gz) whose records hold a 'prompt' string (and
    optionally an 'id' and a 'reference'), or a text file with one prompt per non-empty line."""
    if not path.is_file():
        raise DraftVerifyError(
            f"--prompts {path}: not a prompt set ({', '.join(PROMPT_SETS)}) and no such file; give a .jsonl file "
            "whose records have a 'prompt' field, or a text file with one prompt per line"
        )
    if path.name.endswith((".jsonl", ".jsonl.gz")):
        prompts = []
        for i, row in enumerate(_read_jsonl(path)):
            text = row.get("prompt") if isinstance(row, dict) else None
            if not isinstance(text, str) or not text:
                raise DraftVerifyError(f"{path}: record {i} has no non-empty 'prompt' string")
            reference = row.get("reference")
            prompts.append(
                Prompt(
                    id=str(row.get("id", f"{path.stem}/{i}")),
                    text=text,
                    reference=reference if isinstance(reference, str) else None,
                )
            )
    else:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            raise DraftVerifyError(f"{path} is not UTF-8 text: give one prompt per line, or a .jsonl file") from None
        prompts = [Prompt(id=f"{path.stem}/{i}", text=line) for i, line in enumerate(lines) if line.strip()]
    if not prompts:
        raise DraftVerifyError(f"{path} holds no prompt")
    return prompts


def prompt_set_name(spec: str) -> str:
    """The prompt set's name in file names: 'spec_bench-coding', or a prompt file's stem."""
    if spec.partition(":")[0] in PROMPT_SETS:
        return spec.replace(":", "-")
    return Path(spec).name.removesuffix(".gz").rsplit(".", 1)[0] or "prompts"


def truncate_at_stops(text: str, stops: tuple[str, ...]) -> str:
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]
