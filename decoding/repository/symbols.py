"""Definitions in a source file: the names it defines at its top levels, each with the lines a caller
needs to use it (a signature, a class's outline).

Regular expressions per language family rather than parsers: the prebuilt tree-sitter grammar packs
fetch their grammars at run time, which an offline machine cannot, and what a completion needs from
another file is the head of a definition (its name, parameters, fields), which these lines hold.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

MAX_DEFINITION_LINES = 14  # a function's head and docstring; a class's outline


@dataclass(frozen=True)
class Definition:
    name: str
    path: str  # workspace-relative
    line: int  # 0-based line of the definition
    text: str  # the lines shown to the model


_PY = re.compile(r"^(?:async\s+)?(?:def|class)\s+([A-Za-z_]\w*)|^([A-Z][A-Z0-9_]*|[A-Za-z_]\w*)\s*(?::[^=]+)?=(?!=)")
_JS = re.compile(r"^(?:export\s+)?(?:default\s+)?(?:async\s+)?(?:function\*?|class|interface|type|enum|"
                 r"const|let|var|abstract\s+class)\s+([A-Za-z_$][\w$]*)")
_GO = re.compile(r"^(?:func(?:\s*\([^)]*\))?|type|var|const)\s+([A-Za-z_]\w*)")
_RUST = re.compile(r"^(?:pub(?:\([^)]*\))?\s+)?(?:async\s+)?(?:fn|struct|enum|trait|type|const|static|mod|impl)"
                   r"\s+([A-Za-z_]\w*)")
_C_LIKE = re.compile(r"^(?:(?:public|private|protected|static|final|abstract|export|inline|extern|virtual|"
                     r"struct|class|enum|interface|record|sealed|typedef|const|unsigned|signed)\s+)*"
                     r"(?:class|struct|enum|interface|record|[A-Za-z_][\w:<>,\[\]*& ]*?)\s+\**([A-Za-z_]\w*)\s*[({;=]")
_RUBY = re.compile(r"^(?:def\s+(?:self\.)?|class\s+|module\s+)([A-Za-z_]\w*[?!]?)")

_PATTERNS = {
    "python": _PY, "javascript": _JS, "typescript": _JS, "javascriptreact": _JS, "typescriptreact": _JS,
    "go": _GO, "rust": _RUST, "c": _C_LIKE, "cpp": _C_LIKE, "java": _C_LIKE, "csharp": _C_LIKE, "kotlin": _JS,
    "ruby": _RUBY, "php": _JS, "swift": _JS, "scala": _JS,
}
# Words the patterns can catch that name no definition (C's type words, storage classes, keywords).
_KEYWORDS = {"if", "for", "while", "return", "switch", "else", "case", "do", "try", "catch", "new", "delete",
             "sizeof", "main", "struct", "enum", "union", "class", "void", "typedef", "extern", "static", "const",
             "unsigned", "signed", "int", "char", "long", "short", "float", "double", "bool", "auto", "inline",
             "volatile", "register", "default", "public", "private", "protected", "virtual", "template",
             "typename", "namespace", "using", "operator", "friend", "export", "import", "function", "async",
             "await", "let", "var", "self", "this", "None", "True", "False", "null", "true", "false"}


def _block_end(lines: list[str], start: int, language: str) -> int:
    """The exclusive end of the definition starting at `start` (a class's body can be long)."""
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    limit = min(len(lines), start + 400)
    while end < limit:
        line = lines[end]
        if line.strip():
            depth = len(line) - len(line.lstrip())
            if depth <= indent:
                if language != "python" and line.strip()[:1] in "})]":
                    end += 1  # a closing brace belongs to the block
                break
        end += 1
    return end


def _outline(lines: list[str], start: int, end: int, language: str) -> str:
    """A class's head and its members' first lines; a function's head and docstring."""
    head = lines[start]
    body = lines[start + 1:end]
    if language == "python" and head.lstrip().startswith("class"):
        inner = [ln for ln in body if ln.strip().startswith(("def ", "async def ", "@")) or
                 re.match(r"^\s+\w+\s*(:[^=]*)?=|^\s+\w+\s*:\s*\S", ln) or ln.strip().startswith(('"""', "'''"))]
        body = inner
    return "\n".join([head, *body[:MAX_DEFINITION_LINES - 1]]).rstrip()


def definitions(text: str, language: str, path: str) -> list[Definition]:
    """Top-level definitions (and, for classes, their outline) in file order."""
    pattern = _PATTERNS.get(language)
    if pattern is None:
        return []
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if not line or line[0] in " \t#/*}":  # top level only: indented lines belong to a block
            continue
        m = pattern.match(line)
        if not m:
            continue
        name = next((g for g in m.groups() if g), "")
        if not name or name in _KEYWORDS or len(name) < 2:
            continue
        end = _block_end(lines, i, language)
        out.append(Definition(name, path, i, _outline(lines, i, end, language)))
    return out


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifiers(text: str) -> list[str]:
    return _IDENTIFIER.findall(text)
