"""What of the repository a request shows the model, within its share of the prompt budget.

1. Definitions, in other files, of the names used near the cursor (nearest use first): what a small
   model cannot guess (a class's fields, a helper's parameters).
2. The windows of other files most similar to the lines above the cursor (Jaccard similarity of
   their identifiers, as Copilot's neighbouring snippets): the project's own idioms.

Sections are laid out by path and line, not by score, and a document keeps its selection while the
cursor stays near where it was made: the repository context sits at the start of the prompt, so any
change to it makes the engine read the whole prompt again; a stable one lets consecutive keystrokes
reuse the KV cache. The selection is made again when the cursor moves away, or the index changed and
the last selection is old.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from decoding.api import ContextFile
from decoding.repository.imports import Imports, module_match, parse_imports, without_imports
from decoding.repository.index import WINDOW_LINES, IndexedFile, WorkspaceIndex, family
from decoding.repository.symbols import identifiers

CHARS_PER_TOKEN = 3.5  # code, Qwen2.5's tokenizer: a conservative estimate keeps sections whole
NEAR_LINES = 30  # names used in this many lines above the cursor count as "near"
MIN_SIMILARITY = 0.1  # over the uncommon words (decoding/repository/index.py)
RESELECT_LINES = 12  # the cursor moved this far from where the selection was made
STALE_S = 30.0  # an index change older selections may ignore for this long
LOOKUP_CHARS = 96 * 1024  # text the repository lookup drafter searches beyond the prompt

_COMMON = {"self", "this", "cls", "None", "True", "False", "null", "true", "false", "return", "def", "class", "if",
           "else", "elif", "for", "while", "in", "is", "not", "and", "or", "import", "from", "as", "const", "let",
           "var", "function", "new", "int", "str", "string", "void", "public", "private", "static", "fn",
           "mut", "pub", "use", "func", "type", "struct", "with", "try", "except", "raise", "pass", "lambda",
           "ifdef", "ifndef", "endif", "define", "undef", "include", "pragma", "defined"}  # the C preprocessor's


@dataclass(frozen=True)
class Section:
    path: str
    first_line: int
    text: str
    why: str  # "defines NAME" or "similar 0.31"


@dataclass
class Selection:
    sections: list[Section]
    lookup_texts: tuple[str, ...]  # whole files for the lookup drafter (most similar first)
    line: int  # the cursor line it was made at
    generation: int
    made_at: float = field(default_factory=time.monotonic)

    def context_files(self) -> list[ContextFile]:
        """One file section per path, its parts in line order (the layout the prompt keeps)."""
        by_path: dict[str, list[Section]] = {}
        for s in sorted(self.sections, key=lambda s: (s.path, s.first_line)):
            by_path.setdefault(s.path, []).append(s)
        return [ContextFile(path, "\n...\n".join(s.text for s in parts)) for path, parts in by_path.items()]

    def describe(self) -> list[dict]:
        return [{"path": s.path, "line": s.first_line + 1, "chars": len(s.text), "why": s.why} for s in self.sections]


# a name, and the attribute after it where there is one (`name.attr`, `name->attr`)
_ATTRIBUTE = re.compile(r"(?<![\w$.])(?<!->)([A-Za-z_$][\w$]*)(?:\s*(?:\.|->)\s*([A-Za-z_$][\w$]*))?")


def _names_near_cursor(prefix: str, defined_here: set[str], imports: Imports) -> list[tuple[str, str | None]]:
    """(name, the module it comes from: None where unknown, "*" one of imports.star) for the names
    worth a definition: those used above and on the cursor's line, nearest last use first; then the
    names the file imports and does not use yet (a use is coming), then its other imports. Attributes
    (`x.name`) are left out unless x is an imported module, and, where imports are the only way in
    (imports.strict), so is a name the file neither imports nor defines (a builtin, a parameter, a
    local). The name being typed (the line's unfinished last word) is left out, so the selection does
    not follow every key."""
    all_lines = prefix.split("\n")
    lines = all_lines[-NEAR_LINES:]
    lines[-1] = re.sub(r"[A-Za-z0-9_]+$", "", lines[-1])
    near: list[tuple[str, str | None]] = []
    for owner, attribute in reversed(_ATTRIBUTE.findall(without_imports("\n".join(lines), imports.language))):
        if attribute:
            module = imports.modules.get(owner)
            if module is None and owner in imports.names and family(imports.language) == "python":
                module = f"{imports.names[owner]}.{owner}".replace("..", ".")  # `from pkg import mod`
            if module is not None:
                near.append((attribute, module))
        if owner in imports.names:
            near.append((owner, imports.names[owner]))
        elif imports.star and owner not in imports.modules:
            near.append((owner, "*"))  # maybe from a module imported whole (`from m import *`)
        elif not imports.strict and owner not in imports.modules:
            near.append((owner, None))
    used = set(identifiers(without_imports(prefix, imports.language)))
    coming = [(n, m) for n, m in imports.names.items() if n not in used]
    rest = [(n, m) for n, m in imports.names.items() if n in used]
    seen: dict[str, str | None] = {}
    for name, module in [*near, *coming, *rest]:
        # short lower-case names (`call`, `skip`) are defined all over a repository: not worth a section
        if name not in _COMMON and name not in defined_here and (len(name) > 4 or not name.islower()):
            seen.setdefault(name, module)
    return list(seen.items())


def _definition(index: WorkspaceIndex, name: str, module: str | None, current: str, language: str,
                imports: Imports, nearest_if_unknown: bool = True):
    """The definition of `name` to show, or None: where the file says which module it comes from,
    that module's (none if no workspace file is that module: it is a library's); else the one in a
    header the file includes, else (nearest_if_unknown) the one nearest the current file in the tree."""
    mine = family(language)
    found = [d for d in index.defined(name) if d.path != current and d.path in index.files
             and family(index.files[d.path].language) == mine]
    if not found:
        return None
    nearest = lambda d: (_shared_dirs(d.path, current), -len(d.path))  # noqa: E731
    roots = tuple(folder.name for folder in index.folders)
    if module is not None:
        modules = imports.star if module == "*" else [module]
        scored = [(max(module_match(m, d.path, current, language, roots) for m in modules), d) for d in found]
        best = max(score for score, _ in scored)
        if best:
            return max((d for score, d in scored if score == best), key=nearest)
        # a package of the workspace that re-exports the name (`from pkg import name`, defined in
        # pkg/impl.py); a module outside the workspace (a library's) has nothing to show
        inside = any(m.startswith(".") or m.replace("/", ".").split(".")[0] in roots for m in modules)
        return max(found, key=nearest) if inside else None
    if imports.headers:
        scored = [(max(module_match(h, d.path, current, language) for h in imports.headers), d) for d in found]
        best = max(score for score, _ in scored)
        if best:
            return max((d for score, d in scored if score == best), key=nearest)
    return max(found, key=nearest) if nearest_if_unknown else None


def imported_definition(index: WorkspaceIndex, name: str, current: str, language: str, imports: Imports):
    """The definition of `name` the file's imports reach, or None where they do not say: in Python and
    JavaScript the name is imported by name from a workspace module; in C and C++ a header the file
    includes defines it (directly: not through the headers that header includes). What static analysis
    would call a cross-file use, as CrossCodeEval builds its cases."""
    module = imports.names.get(name)
    if module is None and family(language) in ("python", "javascript"):
        return None
    return _definition(index, name, module, current, language, imports, nearest_if_unknown=False)


def _shared_dirs(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a.split("/")[:-1], b.split("/")[:-1]):
        if x != y:
            break
        n += 1
    return n


def _query(prefix: str) -> frozenset[str]:
    """The identifiers of the whole lines above the cursor (its own line changes with every key)."""
    lines = prefix.split("\n")[:-1][-WINDOW_LINES:]
    return frozenset(identifiers("\n".join(lines))) - _COMMON


def _window_text(file: IndexedFile, start: int) -> str:
    return "\n".join(file.text.split("\n")[start:start + WINDOW_LINES]).rstrip()


def select(index: WorkspaceIndex, current: str, language: str, prefix: str, budget_tokens: int) -> Selection:
    """A fresh selection for a cursor at the end of `prefix` in workspace-relative file `current`."""
    generation, files = index.snapshot()
    budget = int(budget_tokens * CHARS_PER_TOKEN)
    mine = family(language)
    here = next((f for f in files if f.path == current), None)
    defined_here = {d.name for d in here.definitions} if here else set()
    imports = parse_imports(prefix, language)
    sections: list[Section] = []
    used = 0

    def add(section: Section) -> None:
        nonlocal used
        if used + len(section.text) + len(section.path) + 8 <= budget:
            sections.append(section)
            used += len(section.text) + len(section.path) + 8

    for name, module in _names_near_cursor(prefix, defined_here, imports):
        d = _definition(index, name, module, current, language, imports)
        if d is not None:
            add(Section(d.path, d.line, d.text, f"defines {name}"))
    query = _query(prefix)
    scored = [(score, f, start) for score, f, start in index.similar(query)
              if f.path != current and family(f.language) == mine]
    taken: dict[str, list[tuple[int, int]]] = {}
    for s in sections:
        taken.setdefault(s.path, []).append((s.first_line, s.first_line + s.text.count("\n") + 1))
    lookup: dict[str, None] = {}
    for score, f, start in scored:
        if score < MIN_SIMILARITY:
            break
        lookup.setdefault(f.path, None)
        spans = taken.setdefault(f.path, [])
        if any(a < start + WINDOW_LINES and start < b for a, b in spans):
            continue  # overlaps what is already shown from that file
        before = len(sections)
        add(Section(f.path, start, _window_text(f, start), f"similar {score:.2f}"))
        if len(sections) > before:
            spans.append((start, start + WINDOW_LINES))
        if used >= budget * 0.95:
            break
    texts, total = [], 0
    by_path = {f.path: f for f in files}
    for path in lookup:
        if total + len(by_path[path].text) > LOOKUP_CHARS:
            continue
        texts.append(by_path[path].text)
        total += len(by_path[path].text)
    return Selection(sections, tuple(texts), prefix.count("\n"), generation)


class ContextSelector:
    """Per document, the selection the last request used, kept while it is still good (see above)."""

    def __init__(self, index: WorkspaceIndex) -> None:
        self.index = index
        self._kept: dict[str, Selection] = {}
        self.counts = {"made": 0, "kept": 0}

    def for_request(self, document: str, current: str, language: str, prefix: str,
                    budget_tokens: int) -> Selection:
        line = prefix.count("\n")
        kept = self._kept.get(document)
        if kept is not None and abs(line - kept.line) < RESELECT_LINES and (
                kept.generation == self.index.generation or
                kept.sections and time.monotonic() - kept.made_at < STALE_S):
            self.counts["kept"] += 1
            return kept
        selection = select(self.index, current, language, prefix, budget_tokens)
        self._kept[document] = selection
        self.counts["made"] += 1
        return selection

    def forget(self, document: str) -> None:
        self._kept.pop(document, None)
