"""Load the benchmark's models once: target, draft, aligned draft, tokenizer; and the declared drafter options with
the zoo's files (n-gram table, heads, adapter, ...) filled in."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer, PreTrainedModel

from ..api import draft_tokenizer_for, load_model, zoo_paths
from ..backends.hf.cached_lm import context_limit
from ..errors import DraftVerifyError
from ..options import all_fields, fill_from_zoo
from ..options.checks import methods_reading
from ..options.declare import declaration
from ..zoo import zoo_folder
from .config import BenchConfig


@dataclass
class BenchModels:
    target: PreTrainedModel
    tokenizer: object
    draft: PreTrainedModel | None = None
    aligned_draft: PreTrainedModel | None = None
    # a draft's own tokenizer when its vocabulary is not the target's (api.draft_tokenizer_for): our `model` rows
    # then re-tokenize its text (cross_tokenizer) and hf_assisted runs Hugging Face's universal assisted generation
    draft_tokenizer: object | None = None
    aligned_draft_tokenizer: object | None = None
    options: dict[str, Any] = field(default_factory=dict)  # declared drafter options, the zoo's files filled in
    paths: dict[str, str | None] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def eos_token_id(self) -> int | None:
        eos = self.tokenizer.eos_token_id
        return eos if eos is not None else self.target.config.eos_token_id

    @property
    def pad_token_id(self) -> int | None:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else self.eos_token_id

    @property
    def context_limit(self) -> int | None:
        """Fewest positions any of the models attends to (prompt + new tokens must fit)."""
        limits = [context_limit(m.config) for m in (self.target, self.draft, self.aligned_draft) if m is not None]
        limits = [x for x in limits if x is not None]
        return min(limits) if limits else None

    def describe(self) -> dict:
        out = {}
        for role in ("target", "draft", "aligned_draft"):
            model = getattr(self, role)
            if model is None:
                continue
            cfg = model.config
            out[role] = {
                "path": self.paths.get(role),
                "architecture": type(model).__name__,
                "parameters": sum(p.numel() for p in model.parameters()),
                "layers": getattr(cfg, "num_hidden_layers", getattr(cfg, "n_layer", None)),
                "hidden_size": getattr(cfg, "hidden_size", getattr(cfg, "n_embd", None)),
                "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            }
            own = getattr(self, f"{role}_tokenizer", None) if role != "target" else None
            if role != "target":
                out[role]["tokenizer"] = f"its own (vocabulary {len(own)})" if own is not None else "the target's"
        for name, (_, f) in all_fields().items():  # the declared files given or found: {"ngram": {"path": ...}}
            opt = declaration(f)
            if opt is not None and opt.zoo is not None and self.options.get(name) is not None:
                out[opt.flag.lstrip("-")] = {"path": str(self.options[name])}
        return out


def resolve_paths(config: BenchConfig) -> dict[str, Path | None]:
    """The models' paths: explicit ones win; --zoo fills the rest. A missing zoo draft is None (its runners are
    skipped)."""
    chosen: dict[str, Path | None] = {
        "target": Path(config.target) if config.target else None,
        "draft": Path(config.draft) if config.draft else None,
        "aligned_draft": Path(config.aligned_draft) if config.aligned_draft else None,
    }
    if config.zoo is not None:
        paths = zoo_paths(config.zoo)
        zoo = {
            "target": Path(paths["target"]),
            "draft": Path(paths["draft"]),
            "aligned_draft": Path(paths["draft_aligned"]),
        }
        for role, path in zoo.items():
            if chosen[role] is None:
                chosen[role] = path if path.exists() or role == "target" else None
    for role in ("draft", "aligned_draft"):  # an explicit path that is not there is a mistake (files: config.validate)
        explicit = getattr(config, role)
        if explicit and not Path(explicit).exists():
            option = "--" + role.replace("_", "-")
            raise DraftVerifyError(f"{option} {explicit}: no such file or directory")
    return chosen


def method_options(config: BenchConfig) -> tuple[dict[str, Any], list[str]]:
    """The config's declared drafter options with the zoo entry's files filled in, and a note for each declared
    file still missing (the methods that need it are skipped)."""
    values = dict(config.options)
    if config.zoo is not None:
        values = fill_from_zoo(values, zoo_folder(config.zoo))
    notes = []
    for name, (_, f) in all_fields().items():
        opt = declaration(f)
        if opt is not None and opt.zoo is not None and values.get(name) is None:
            notes.append(
                f"no {opt.what} (pass {opt.flag} or a zoo that has one): skipped {', '.join(methods_reading(name))}"
            )
    return values, notes


def load_models(config: BenchConfig) -> BenchModels:
    paths = resolve_paths(config)
    target = load_model(paths["target"], config.dtype, role="target", device=config.device)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(paths["target"]))
    except (OSError, ValueError) as err:
        raise DraftVerifyError(f"could not load a tokenizer from {str(paths['target'])!r}: {err}") from err
    models = BenchModels(target=target, tokenizer=tokenizer, paths={k: str(v) if v else None for k, v in paths.items()})
    if paths["draft"] is not None:
        models.draft = load_model(paths["draft"], config.dtype, role="draft", device=config.device)
        models.draft_tokenizer = draft_tokenizer_for(paths["draft"], models.draft, tokenizer, target)
    if paths["aligned_draft"] is not None:
        models.aligned_draft = load_model(
            paths["aligned_draft"], config.dtype, role="aligned draft", device=config.device
        )
        models.aligned_draft_tokenizer = draft_tokenizer_for(
            paths["aligned_draft"], models.aligned_draft, tokenizer, target
        )
    for role, families in (("draft", "hf_assisted, model, bild"), ("aligned_draft", "model_aligned")):
        if paths[role] is None:
            option = "--" + role.replace("_", "-")
            models.notes.append(
                f"no {role.replace('_', ' ')} (pass {option} or a zoo that has one): skipped {families}"
            )
    models.options, notes = method_options(config)
    models.notes += notes
    return models
