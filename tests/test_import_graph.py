"""The package's import graph, every import counted (function-local ones too: they hide a circle,
they do not remove it): no circle, `decoding/` never imports the server or pygls, and `models/`
(what a model is and how it loads) imports no runner (what runs it)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("decoding", "lsp_server")


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


def test_the_engine_and_its_tooling_never_import_the_lsp_libraries():
    """decoding/ (the benchmark included) drives a server, when it must, over its own stdio framing."""
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


def functions_over_fifty_lines(package: str, tooling: str) -> list[str]:
    """The functions of `package` longer than fifty lines, its `tooling` subpackage aside."""
    long = []
    for path in (ROOT / package).rglob("*.py"):
        if tooling in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 50:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    return long


def test_no_function_in_the_engine_runs_over_fifty_lines():
    """Tooling (bench) aside: a longer function does several things and hides which one a change touches."""
    assert functions_over_fifty_lines("decoding", tooling="bench") == []


def test_no_function_in_the_server_runs_over_fifty_lines():
    """As in the engine, the typing replay (tooling) aside: a handler stays thin, its logic in short functions."""
    assert functions_over_fifty_lines("lsp_server", tooling="replay") == []
