"""The package's import graph (every import, function-level ones included, read with ast): no cycles, and the
library core never imports the applications built on it (cli, bench, reproduce, serve, train)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "draftverify"
APPLICATIONS = {"cli", "bench", "reproduce", "serve", "train"}


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph = {}
    for name, path in mods.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(package[: len(package) - node.level + 1] + [node.module or ""])
                    if node.level
                    else node.module or ""
                )
                base = base.rstrip(".")
                deps.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def area(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_the_graph_sees_relative_and_lazy_imports():
    graph = import_graph()
    assert "draftverify.backends.base" in graph["draftverify.loop"]  # from .backends.base import ...
    assert "draftverify.bench.runner_families" in graph["draftverify.bench.config"]
    assert "draftverify.errors" in graph["draftverify.backends"]  # imported inside a function


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_a_cycle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_core_never_imports_the_applications():
    upward = [
        (m, d)
        for m, deps in import_graph().items()
        for d in deps
        if area(m) not in APPLICATIONS and area(d) in APPLICATIONS
    ]
    assert upward == []


# the library core: what runs a method against any backend (backends/base.py's protocol), whatever the backend
CORE = (
    "loop",
    "engine",
    "types",
    "sampling",
    "verifiers",
    "registry",
    "methods",
    "options",
    "draft_length",
    "tree",
    "theory",
    "backends.base",
    "backends.registry",
)
# the hf backend: the package whose modules hold a Hugging Face model and its cache
HF_BACKEND = "draftverify.backends.hf"


def imported_names(path: Path) -> set[str]:
    """Every module name an import statement in the file names (absolute imports only: the package's own are
    in import_graph)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def core_modules() -> list[str]:
    return [m for m in modules() if any(m == f"draftverify.{c}" or m.startswith(f"draftverify.{c}.") for c in CORE)]


def test_the_core_imports_neither_transformers_nor_the_hf_backend():
    mods, graph = modules(), import_graph()
    assert "draftverify.loop" in core_modules() and "draftverify.verifiers.exact" in core_modules()
    hf = [(m, name) for m in core_modules() for name in imported_names(mods[m]) if name.split(".")[0] == "transformers"]
    assert f"{HF_BACKEND}.cached_lm" in mods  # the package the check below names is where CachedLM lives
    backend = [(m, d) for m in core_modules() for d in graph[m] if d == HF_BACKEND or d.startswith(f"{HF_BACKEND}.")]
    assert hf == [] and backend == []


def test_importing_the_core_loads_no_transformers():
    """The loop and the engine are left out: they import drafters.base, and so the drafters package, whose
    __init__ imports every drafter module, the Hugging Face ones included."""
    import subprocess
    import sys

    names = [f"draftverify.{c}" for c in CORE if c not in ("loop", "engine") and f"draftverify.{c}" in modules()]
    code = f"import sys\nfor name in {names!r}:\n    __import__(name)\nprint('transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
