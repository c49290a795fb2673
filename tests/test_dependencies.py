"""Every third-party package the product imports when a module loads is a declared dependency, so
`pip install .` gives a `draftwise` whose every command starts (optional extras are imported inside
the functions that need them)."""
from __future__ import annotations

import ast
import re
import sys

from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
ROOT = Path(__file__).resolve().parents[1]


def module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:  # module level only: not inside functions, classes or `if TYPE_CHECKING`
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower().replace("_", "-") for d in project["dependencies"]}


def test_module_level_imports_are_declared_dependencies():
    dists = packages_distributions()
    ours = {"decoding", "lsp_server"}
    missing = {}
    for path in sorted([*ROOT.glob("decoding/**/*.py"), *ROOT.glob("lsp_server/**/*.py")]):
        for name in module_level_imports(path) - ours - set(sys.stdlib_module_names) - {"__future__"}:
            wanted = {d.lower().replace("_", "-") for d in dists.get(name, [name])}
            if not wanted & declared():
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert not missing, f"imported when a module loads but not in [project] dependencies: {missing}"
