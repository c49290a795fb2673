"""What a file imports, and which workspace files those imports name.

The definitions worth showing are those of names the code at the cursor can reach: in Python and
JavaScript a name from another file is reachable only through an import, so an import says which
file defines it (`from .segment import Segment`: segment.py, not the other files that happen to
define a `Segment`); a name neither imported nor defined in the file is a builtin, a parameter or a
local, and another file's top-level definition of the same word is noise. C and C++ include headers
whole: an `#include` says which headers to prefer, not which names are reachable.
"""
from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

from decoding.repository.index import family

_NAME = r"[A-Za-z_$][\w$]*"
# Python: `from M import a, b as c` (parenthesised over several lines, or continued with backslashes)
_PY_FROM = re.compile(r"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|(?:[^\n\\]|\\\n)*)", re.M)
_PY_IMPORT = re.compile(r"^[ \t]*import[ \t]+((?:[^\n\\#]|\\\n)+)", re.M)
# JavaScript / TypeScript: ES imports (default, named, namespace) and CommonJS require
_JS_IMPORT = re.compile(r"\bimport\s+(?:type\s+)?([^'\";]*?)\s+from\s*['\"]([^'\"]+)['\"]", re.S)
_JS_REQUIRE = re.compile(rf"\b(?:const|let|var)\s+(\{{[^}}]*\}}|{_NAME})\s*=\s*require\s*\(\s*['\"]([^'\"]+)['\"]\s*\)")
_C_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*[<\"]([^>\"]+)[>\"]", re.M)


@dataclass
class Imports:
    """A file's imports. names: imported name -> module as written; modules: a module's local name ->
    the module (`import a.b as m`, `import * as m from './m'`); star: modules whose every name is
    imported; headers: C/C++ includes."""

    language: str
    names: dict[str, str] = field(default_factory=dict)
    modules: dict[str, str] = field(default_factory=dict)
    star: list[str] = field(default_factory=list)
    headers: list[str] = field(default_factory=list)

    @property
    def strict(self) -> bool:
        """Whether a name not imported (nor defined in the file) cannot come from another file."""
        return family(self.language) == "python" or (
            family(self.language) == "javascript" and bool(self.names or self.modules or self.star))


def parse_imports(text: str, language: str) -> Imports:
    out = Imports(language)
    fam = family(language)
    if fam == "python":
        for m in _PY_FROM.finditer(text):
            module, names = m.group(1), m.group(2).strip("()").replace("\\\n", " ")
            for part in names.split(","):
                part = part.split("#")[0].strip()
                if part == "*":
                    out.star.append(module)
                elif part:
                    words = part.split()
                    out.names[words[-1]] = module  # `a as b` is b
        for m in _PY_IMPORT.finditer(text):
            for part in m.group(1).replace("\\\n", " ").split(","):
                words = part.split()
                if not words:
                    continue
                if len(words) == 3 and words[1] == "as":
                    out.modules[words[2]] = words[0]
                else:  # `import a.b` binds a; a.b.name is reached through it
                    out.modules.setdefault(words[0].split(".")[0], words[0])
    elif fam == "javascript":
        for clause, module in _JS_IMPORT.findall(text):
            _js_clause(out, clause, module)
        for clause, module in _JS_REQUIRE.findall(text):
            if clause.startswith("{"):
                for part in clause.strip("{}").split(","):
                    local = part.split(":")[-1].strip()
                    if re.fullmatch(_NAME, local):
                        out.names[local] = module
            else:
                out.modules[clause] = module
    elif fam == "c":
        out.headers = _C_INCLUDE.findall(text)
    return out


def without_imports(text: str, language: str) -> str:
    """`text` with its import statements blanked out (what the code uses, not what it imports)."""
    patterns = {"python": (_PY_FROM, _PY_IMPORT), "javascript": (_JS_IMPORT, _JS_REQUIRE),
                "c": (_C_INCLUDE,)}.get(family(language), ())
    for pattern in patterns:
        text = pattern.sub(" ", text)
    return text


def _js_clause(out: Imports, clause: str, module: str) -> None:
    braces = re.search(r"\{([^}]*)\}", clause)
    if braces:
        for part in braces.group(1).split(","):
            words = part.replace("type ", " ").split()
            if words and re.fullmatch(_NAME, words[-1]):
                out.names[words[-1]] = module
        clause = clause[:braces.start()] + clause[braces.end():]
    star = re.search(rf"\*\s+as\s+({_NAME})", clause)
    if star:
        out.modules[star.group(1)] = module
        clause = clause[:star.start()] + clause[star.end():]
    default = clause.strip(" ,\n")
    if re.fullmatch(_NAME, default):
        out.names[default] = module


def _stem_parts(path: str) -> list[str]:
    """A workspace path as module parts: pkg/sub/mod.py -> [pkg, sub, mod]; pkg/__init__.py -> [pkg]."""
    parts = path.split("/")
    stem = parts[-1].rsplit(".", 1)[0]
    if stem in ("__init__", "index", "mod"):
        return parts[:-1]
    return parts[:-1] + [stem]


def module_match(module: str, path: str, current: str, language: str, roots: tuple[str, ...] = ()) -> int:
    """How well a workspace file `path` is the module an import in `current` names: the number of
    trailing module parts that agree (0: not that module). Relative imports are resolved against
    `current`; an absolute one is compared from its end, with the workspace folder's own name in
    front of `path` (roots): a workspace that is the folder `uvicorn` has `uvicorn._types` as
    `_types.py`, and `http` as `__init__.py`."""
    fam = family(language)
    relative = module.startswith(".")
    if fam == "python":
        dots = len(module) - len(module.lstrip("."))
        parts = [p for p in module.lstrip(".").split(".") if p]
        if dots:
            base = current.split("/")[:-1]
            parts = base[:len(base) - (dots - 1)] + parts
        have = _stem_parts(path)
    elif fam == "javascript":
        if relative:
            joined = posixpath.normpath(posixpath.join(posixpath.dirname(current), module))
            parts = [p for p in joined.split("/") if p and p != "."]
        else:
            parts = [p for p in module.split("/") if p]
        if parts:
            parts[-1] = re.sub(r"\.(m?[jt]sx?|cjs|cts|mts)$", "", parts[-1])
            if parts[-1] == "index":
                parts = parts[:-1]
        have = _stem_parts(path)
    else:  # a header: its path as written
        parts, have = module.split("/"), path.split("/")
    if relative or not roots:
        return _tail_match(parts, have)
    return max(_tail_match(parts, [root, *have]) for root in roots)


def _tail_match(want: list[str], have: list[str]) -> int:
    n = 0  # 0 unless the module's own name (its last part) is the file's
    while n < len(want) and n < len(have) and want[-1 - n] == have[-1 - n]:
        n += 1
    return n
