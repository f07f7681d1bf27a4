"""`llamacpp_native[...]` row specs (llamacpp_native.py runs them): parsed and checked with the bench's other
options, before any model loads, so this module imports nothing heavy.

`llamacpp_native[plain]`, `llamacpp_native[draft-simple,n_max=16,p_min=0.75,draft=aligned]`,
`llamacpp_native[ngram-mod]`, `llamacpp_native[ngram-mod,draft-simple]`: llama.cpp's `--spec-type` list and
draft-simple's settings; a bare `llamacpp_native` stands for DEFAULT_SPECS, `llamacpp_native[sweep]` for
SWEEP_SPECS (what a user tuning llama.cpp on a prompt set would try).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftVerifyError

FAMILY = "llamacpp_native"
# llama.cpp's --spec-type names these rows may chain (draft-simple reads a draft GGUF, draft-eagle3 the EAGLE-3
# head exported to GGUF; the rest are model-free)
DRAFT_TYPE = "draft-simple"
EAGLE3_TYPE = "draft-eagle3"
SPEC_TYPES = (DRAFT_TYPE, EAGLE3_TYPE, "ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
DRAFT_ROLES = {"draft": "draft", "aligned": "aligned_draft"}  # draft=... -> the bench model it reads
DEFAULT_SPECS = (
    f"{FAMILY}[plain]",
    f"{FAMILY}[{DRAFT_TYPE}]",
    f"{FAMILY}[ngram-mod]",
    f"{FAMILY}[ngram-map-k]",
    f"{FAMILY}[ngram-mod,{DRAFT_TYPE}]",
)
SWEEP = f"{FAMILY}[sweep]"
# llama.cpp's settings swept per prompt set (bench native): draft-simple's n_max (3 is llama.cpp's default) and
# p_min (0, its default, drafts n_max tokens every step; 0.75 stops at the draft's first unconfident token) with
# the zoo draft and its aligned twin, the model-free n-gram drafters at their defaults, and their chains
SWEEP_SPECS = (
    f"{FAMILY}[plain]",
    *(
        f"{FAMILY}[{DRAFT_TYPE},n_max={n},p_min={p},draft={d}]"
        for d in DRAFT_ROLES
        for n in (3, 8, 16)
        for p in (0, 0.75)
    ),
    f"{FAMILY}[ngram-simple]",
    f"{FAMILY}[ngram-map-k]",
    f"{FAMILY}[ngram-mod]",
    *(f"{FAMILY}[ngram-mod,{DRAFT_TYPE},n_max=16,p_min=0.75,draft={d}]" for d in DRAFT_ROLES),
    f"{FAMILY}[ngram-map-k,{DRAFT_TYPE},n_max=16,p_min=0.75,draft=aligned]",
)


@dataclass(frozen=True)
class NativeSpec:
    """One native row: llama.cpp's --spec-type list (empty: plain decoding) and the draft-simple settings given
    (None: llama.cpp's own default)."""

    types: tuple[str, ...] = ()
    n_max: int | None = None
    p_min: float | None = None
    draft: str = "draft"  # which bench draft model draft-simple reads: "draft" or "aligned"

    @property
    def needs_draft(self) -> bool:
        return DRAFT_TYPE in self.types or self.eagle3

    @property
    def eagle3(self) -> bool:
        """The draft is the EAGLE-3 head (its GGUF), not a draft model."""
        return EAGLE3_TYPE in self.types

    @property
    def name(self) -> str:
        """The canonical row name: types in the order given, then the settings."""
        items = list(self.types) or ["plain"]
        if self.n_max is not None:
            items.append(f"n_max={self.n_max}")
        if self.p_min is not None:
            items.append(f"p_min={self.p_min:g}")
        if self.draft != "draft":
            items.append(f"draft={self.draft}")
        return f"{FAMILY}[{','.join(items)}]"

    @property
    def group(self) -> str:
        """The head-to-head family: the spec types alone (a sweep of settings is one family, its best row shown)."""
        return f"{FAMILY}[{','.join(self.types) or 'plain'}]"

    def server_args(self, draft_gguf: Path | None, threads: int) -> list[str]:
        """llama-server's speculative flags for this row (names as in the vendored common/arg.cpp)."""
        if not self.types:
            return []
        args = ["--spec-type", ",".join(self.types)]
        if self.needs_draft:
            if draft_gguf is None:
                raise DraftVerifyError(f"{self.name} needs a draft model")
            args += ["--spec-draft-model", str(draft_gguf)]
            args += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
            if self.n_max is not None:
                args += ["--spec-draft-n-max", str(self.n_max)]
            if self.p_min is not None:
                args += ["--spec-draft-p-min", f"{self.p_min:g}"]
        return args


def is_native(item: str) -> bool:
    return item == FAMILY or item.startswith(FAMILY + "[")


def parse_spec(text: str) -> NativeSpec:
    """`llamacpp_native[ITEM,...]` -> NativeSpec; a one-line DraftVerifyError naming what is wrong."""
    usage = (
        f"write {FAMILY}[plain] or {FAMILY}[TYPE,...,n_max=N,p_min=P,draft=draft|aligned] with TYPE in "
        f"{', '.join(SPEC_TYPES)}"
    )
    if not (text.startswith(FAMILY + "[") and text.endswith("]")):
        raise DraftVerifyError(f"--runners: {text!r} is not a {FAMILY} row; {usage}")
    items = [part.strip() for part in text[len(FAMILY) + 1 : -1].split(",")]
    if not items or any(not part for part in items):
        raise DraftVerifyError(f"--runners: {text!r} has an empty item; {usage}")
    types: list[str] = []
    settings: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if sep:
            if key in settings:
                raise DraftVerifyError(f"--runners: {text!r} sets {key} twice")
            settings[key] = value
        elif item in types:
            raise DraftVerifyError(f"--runners: {text!r} names {item} twice")
        else:
            types.append(item)
    if types == ["plain"] and not settings:
        return NativeSpec()
    unknown = [t for t in types if t not in SPEC_TYPES]
    if unknown or not types:
        raise DraftVerifyError(
            f"--runners: {text!r}: " + (f"unknown type {unknown[0]!r}" if unknown else "no spec type") + f"; {usage}"
        )
    spec = NativeSpec(
        types=tuple(types),
        n_max=_setting(text, settings, "n_max", int),
        p_min=_setting(text, settings, "p_min", float),
        draft=settings.pop("draft", "draft"),
    )
    if settings:
        raise DraftVerifyError(f"--runners: {text!r}: unknown setting {next(iter(settings))!r}; {usage}")
    if spec.draft not in DRAFT_ROLES:
        raise DraftVerifyError(f"--runners: {text!r}: draft must be draft or aligned, got {spec.draft!r}")
    if spec.n_max is not None and spec.n_max < 1:
        raise DraftVerifyError(f"--runners: {text!r}: n_max must be an integer >= 1, got {spec.n_max}")
    if spec.p_min is not None and not 0.0 <= spec.p_min <= 1.0:
        raise DraftVerifyError(f"--runners: {text!r}: p_min must be a number in [0, 1], got {spec.p_min:g}")
    draft_settings = spec.n_max is not None or spec.p_min is not None or spec.draft != "draft"
    if draft_settings and not spec.needs_draft:
        raise DraftVerifyError(
            f"--runners: {text!r}: n_max, p_min and draft are {DRAFT_TYPE}'s and {EAGLE3_TYPE}'s settings; add one"
        )
    if spec.eagle3 and (DRAFT_TYPE in spec.types or spec.draft != "draft"):
        raise DraftVerifyError(
            f"--runners: {text!r}: {EAGLE3_TYPE} drafts with the EAGLE-3 head, not a draft model: drop "
            f"{DRAFT_TYPE} and draft="
        )
    return spec


def _setting(text: str, settings: dict[str, str], key: str, kind: type):
    if key not in settings:
        return None
    value = settings.pop(key)
    try:
        return kind(value)
    except ValueError:
        raise DraftVerifyError(f"--runners: {text!r}: {key} must be {kind.__name__}, got {value!r}") from None


def native_specs(items: tuple[str, ...] | None) -> list[NativeSpec]:
    """The native rows --runners asks for, in order, without repeats (a bare `llamacpp_native`: DEFAULT_SPECS;
    `llamacpp_native[sweep]`: SWEEP_SPECS). They run only when named: each needs the separately built tools."""
    expand = {FAMILY: DEFAULT_SPECS, SWEEP: SWEEP_SPECS}
    specs: list[NativeSpec] = []
    for item in items or ():
        if is_native(item):
            for text in expand.get(item, (item,)):
                spec = parse_spec(text)
                specs += [] if spec in specs else [spec]
    return specs
