"""The package's import graph, every import counted (function-local ones too: they hide a circle,
they do not remove it): no circle, `decoding/` never imports the server or pygls, and `models/`
(what a model is and how it loads) imports no runner (what runs it)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decoding", "lsp_server", "bench")
PRODUCT = ("decoding", "lsp_server")  # `bench` is the measurement package, outside the product


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                # the deepest module of ours it names (`from decoding.runners import x` names decoding.runners)
                while t and t not in modules:
                    t = t.rpartition(".")[0]
                if t and t != name and not name.startswith(t + "."):  # a package's own __init__ aside
                    edges[name].add(t)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    assert cycles(graph()) == []


def test_models_import_no_runner_and_the_engine_no_server():
    edges = graph()
    for name, targets in edges.items():
        if name.startswith("decoding.models"):
            assert not any(t.startswith("decoding.runners") for t in targets), (name, targets)
        if name.startswith("decoding"):
            assert not any(t.startswith("lsp_server") for t in targets), (name, targets)


def external_imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.partition(".")[0])
    return out


def test_the_engine_never_imports_the_lsp_libraries():
    """decoding/ speaks no LSP: the server translates, the engine decodes."""
    for path in (ROOT / "decoding").rglob("*.py"):
        assert not external_imports(path) & {"pygls", "lsprotocol", "pytest_lsp"}, path


def test_no_engine_module_imports_more_than_seven_siblings():
    """A module that needs most of its package is doing the package's job: split it."""
    edges = graph()
    for name, targets in edges.items():
        if name.startswith("decoding"):
            package = name.rpartition(".")[0]
            depth = package.count(".") + 1  # a subpackage's modules count once, as the subpackage
            siblings = {".".join(t.split(".")[:depth + 1]) for t in targets if t.startswith(package + ".")} - {name}
            assert len(siblings) <= 7, (name, sorted(siblings))


def functions_over_fifty_lines(package: str) -> list[str]:
    long = []
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return long


def test_no_function_in_the_product_runs_over_fifty_lines():
    """A longer function does several things and hides which one a change touches; a handler stays
    thin, its logic in short functions. The measurement package is held to a looser standard."""
    assert [f for package in PRODUCT for f in functions_over_fifty_lines(package)] == []


def test_the_product_imports_nothing_from_the_measurement_package():
    """`draftwise bench` and `replay` are reached by name (lsp_server/cli.py's MEASUREMENT_COMMANDS)
    and imported only when run: no module of the product imports `bench`, at any level."""
    edges = graph()
    for name, targets in edges.items():
        if name.startswith(PRODUCT):
            assert not any(t == "bench" or t.startswith("bench.") for t in targets), (name, targets)


def test_serving_and_completing_load_no_measurement_code():
    """Every product module imported, and the `serve` command's parser built: `bench` stays unloaded.
    `draftwise bench --help` then loads it, so the check can see a load when one happens."""
    modules = sorted(m for m in graph() if m.startswith(PRODUCT))
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "from lsp_server.cli import build_parser\nbuild_parser('serve')\n"
            "before = 'bench' in sys.modules\nbuild_parser('bench')\n"
            "print(before, 'bench.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"], out.stderr


def _files(packages: tuple[str, ...]) -> list[Path]:
    return sorted(p for pkg in packages for p in (ROOT / pkg).rglob("*.py"))


def test_no_two_classes_share_a_name():
    """A name says which class it is, wherever a reader meets it (the measurement package included)."""
    seen: dict[str, list[str]] = {}
    for path in _files(PACKAGES):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(module_name(path))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def test_no_two_product_modules_share_a_file_name():
    seen: dict[str, list[str]] = {}
    for path in _files(PRODUCT):
        if path.name not in ("__init__.py", "base.py"):
            seen.setdefault(path.name, []).append(module_name(path))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}
