"""What the stop rules need to know about a programming language: the tables, one per language, and
their lookups (decoding/code_lines.py reads a line with them).

Language ids are the ones the Language Server Protocol uses ("python", "typescriptreact",
"shellscript", ...), so an editor's `languageId` can be passed straight through. For each language
the facts are deliberately shallow: how a line comment starts, how blocks are delimited, which line
endings open a block, which closing lines end one, which strings/comments may span lines, and which
column-0 keywords start a new top-level unit. That is enough to decide where a completion ends
without parsing code that is, by nature, incomplete.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

BRACE = "brace"  # `{ ... }` (indentation is conventional, not syntax)
INDENT = "indent"  # the body is whatever is indented deeper (Python, YAML)
KEYWORD = "keyword"  # `... end` / `fi` / `done` (Lua, Ruby, shell)


@dataclass(frozen=True)
class Region:
    """A comment or string that may span lines; inside one, indentation means nothing."""

    open: str
    close: str
    escapes: bool = False  # a backslash escapes the next character
    comment: bool = False


@dataclass(frozen=True)
class LanguageFacts:
    language: str
    blocks: str = BRACE
    line_comments: tuple[str, ...] = ()
    regions: tuple[Region, ...] = ()
    quotes: str = "\"'"  # single-line string delimiters
    # A line whose code part (comment removed, right-stripped) matches this opens a block. Lines
    # ending with `{`, `(` or `[` always do.
    opener_pattern: str = ""
    # Words that, like a closing bracket, end a block on a line of their own ("end", "fi").
    close_keywords: tuple[str, ...] = ()
    # Closing words followed by an arbitrary tail on the same line (Lua's `until cond`).
    close_keywords_with_tail: tuple[str, ...] = ()
    # Column-0 text that starts a new top-level unit; each begins with "\n" because it only counts
    # at the start of a line inside the generated text.
    top_level_stops: tuple[str, ...] = ()
    # Lines that belong to the definition below them (decorators, attributes, annotations).
    decorator_prefixes: tuple[str, ...] = ()
    # Column-0 lines that are not a dedent (C preprocessor directives inside a function body).
    column0_exempt_prefixes: tuple[str, ...] = ()
    # Shell/YAML `#` starts a comment only at the start of a word (`$#`, `a#b` are not comments).
    comment_needs_space: bool = False
    # Derived once, as fields rather than properties: the stop rules and code_lines read them for
    # every line of a request's plan, and a plain field is a read, not a call into this table.
    line_comment: str = field(init=False)  # the usual line comment prefix ("" when there is none)
    brace_delimited: bool = field(init=False)
    indentation_delimited: bool = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "line_comment", self.line_comments[0] if self.line_comments else "")
        object.__setattr__(self, "brace_delimited", self.blocks == BRACE)
        object.__setattr__(self, "indentation_delimited", self.blocks == INDENT)


_C_COMMENT = Region("/*", "*/", comment=True)
_C_FAMILY_OPENERS = (
    r"(?:=>$"
    r"|^\s*(?:case\b.*|default\s*|(?:public|private|protected)\s*):$"
    r"|^\s*(?:(?:if|for|while|switch)\s*\(.*\)|else(?:\s+if\s*\(.*\))?|do)$)"
)
_C_TYPES_AT_COLUMN_0 = (
    "\nint main", "\nint ", "\nvoid ", "\nstatic ", "\nstruct ", "\ntypedef ", "\nenum ",
    "\nunion ", "\nchar ", "\nunsigned ", "\nlong ", "\nshort ", "\ndouble ", "\nfloat ", "\nbool ",
    "\nconst ", "\nextern ", "\ninline ", "\nsize_t ", "\n#include ",
)
_JS_STOPS = (
    "\nfunction ", "\nasync function ", "\nexport ", "\nclass ", "\nmodule.exports",
)
_TS_STOPS = _JS_STOPS + (
    "\ninterface ", "\nenum ", "\ndeclare ", "\nnamespace ", "\nabstract class ",
)


def _brace_language(language: str, **overrides) -> LanguageFacts:
    facts = dict(
        language=language,
        blocks=BRACE,
        line_comments=("//",),
        regions=(_C_COMMENT,),
        quotes="\"'",
        opener_pattern=_C_FAMILY_OPENERS,
    )
    facts.update(overrides)
    return LanguageFacts(**facts)


_FACTS: dict[str, LanguageFacts] = {}


def _register(*facts: LanguageFacts) -> None:
    for item in facts:
        _FACTS[item.language] = item


_register(
    LanguageFacts(
        language="python",
        blocks=INDENT,
        line_comments=("#",),
        regions=(Region('"""', '"""', escapes=True), Region("'''", "'''", escapes=True)),
        opener_pattern=r":$",
        top_level_stops=("\ndef ", "\nclass ", "\nasync def ", "\nif __name__"),
        decorator_prefixes=("@",),
    ),
    *(
        _brace_language(
            language,
            regions=(_C_COMMENT, Region("`", "`", escapes=True)),
            top_level_stops=stops,
            decorator_prefixes=("@",),
        )
        for language, stops in (
            ("javascript", _JS_STOPS),
            ("javascriptreact", _JS_STOPS),
            ("typescript", _TS_STOPS),
            ("typescriptreact", _TS_STOPS),
        )
    ),
    _brace_language(
        "go",
        regions=(_C_COMMENT, Region("`", "`")),
        top_level_stops=("\nfunc ", "\ntype ", "\nimport ", "\npackage "),
    ),
    _brace_language(
        "rust",
        # Rust strings may span lines; `'` is not a string delimiter because of lifetimes (`'a`).
        regions=(_C_COMMENT, Region('"', '"', escapes=True)),
        quotes="",
        top_level_stops=(
            "\nfn ", "\npub fn ", "\nasync fn ", "\npub async fn ", "\nimpl ", "\nimpl<",
            "\nstruct ", "\npub struct ", "\nenum ", "\npub enum ", "\ntrait ", "\npub trait ",
            "\nmod ", "\npub mod ", "\npub(crate) ", "\nconst ", "\nstatic ", "\nuse ",
        ),
        decorator_prefixes=("#[",),
    ),
    _brace_language(
        "c",
        top_level_stops=_C_TYPES_AT_COLUMN_0,
        column0_exempt_prefixes=("#",),
    ),
    _brace_language(
        "cpp",
        top_level_stops=_C_TYPES_AT_COLUMN_0
        + ("\nclass ", "\nnamespace ", "\ntemplate<", "\ntemplate <", "\nauto "),
        column0_exempt_prefixes=("#",),
    ),
    _brace_language(
        "objective-c",
        top_level_stops=_C_TYPES_AT_COLUMN_0 + ("\n@interface ", "\n@implementation "),
        column0_exempt_prefixes=("#",),
    ),
    _brace_language(
        "objective-cpp",
        top_level_stops=_C_TYPES_AT_COLUMN_0 + ("\n@interface ", "\n@implementation "),
        column0_exempt_prefixes=("#",),
    ),
    _brace_language(
        "java",
        regions=(_C_COMMENT, Region('"""', '"""', escapes=True)),
        top_level_stops=(
            "\npublic ", "\nclass ", "\ninterface ", "\nenum ", "\nrecord ", "\nimport ",
            "\npackage ", "\nfinal class ", "\nabstract class ",
        ),
        decorator_prefixes=("@",),
    ),
    _brace_language(
        "csharp",
        top_level_stops=(
            "\nnamespace ", "\nusing ", "\npublic ", "\ninternal ", "\nclass ", "\nstatic class ",
        ),
        decorator_prefixes=("[",),
        column0_exempt_prefixes=("#",),
    ),
    _brace_language(
        "kotlin",
        regions=(_C_COMMENT, Region('"""', '"""')),
        top_level_stops=(
            "\nfun ", "\nclass ", "\nobject ", "\ninterface ", "\ndata class ", "\nenum class ",
            "\nimport ", "\npackage ",
        ),
        decorator_prefixes=("@",),
    ),
    _brace_language(
        "swift",
        regions=(_C_COMMENT, Region('"""', '"""', escapes=True)),
        top_level_stops=(
            "\nfunc ", "\nclass ", "\nstruct ", "\nextension ", "\nprotocol ", "\nenum ",
            "\nimport ",
        ),
        decorator_prefixes=("@",),
    ),
    _brace_language(
        "scala",
        regions=(_C_COMMENT, Region('"""', '"""')),
        opener_pattern=_C_FAMILY_OPENERS[:-1] + r"|[=:]$)",
        top_level_stops=(
            "\ndef ", "\nclass ", "\nobject ", "\ntrait ", "\ncase class ", "\nimport ",
            "\npackage ",
        ),
        decorator_prefixes=("@",),
    ),
    _brace_language(
        "dart",
        top_level_stops=("\nclass ", "\nvoid ", "\nimport ", "\nFuture<", "\nenum "),
        decorator_prefixes=("@",),
    ),
    _brace_language(
        "php",
        line_comments=("//", "#"),
        top_level_stops=(
            "\nfunction ", "\nclass ", "\nnamespace ", "\nuse ", "\ninterface ", "\ntrait ",
        ),
        decorator_prefixes=("#[",),
    ),
    _brace_language(
        "css",
        line_comments=(),
        opener_pattern="",
    ),
    LanguageFacts(
        language="lua",
        blocks=KEYWORD,
        line_comments=("--",),
        regions=(
            Region("--[[", "]]", comment=True),
            Region("--[==[", "]==]", comment=True),
            Region("--[=[", "]=]", comment=True),
            Region("[[", "]]"),
            Region("[==[", "]==]"),
            Region("[=[", "]=]"),
        ),
        opener_pattern=(
            r"(?:\bthen|\bdo|\belse|\brepeat|\bfunction\b[^()]*\([^()]*\))$"
        ),
        close_keywords=("end",),
        close_keywords_with_tail=("until",),
        top_level_stops=("\nlocal function ", "\nfunction "),
    ),
    LanguageFacts(
        language="ruby",
        blocks=KEYWORD,
        line_comments=("#",),
        opener_pattern=(
            r"(?:(?:\bdo|\{)(?:\s*\|[^|]*\|)?$"
            r"|^\s*(?:def|class|module|if|unless|while|until|case|begin|for|else|elsif|when"
            r"|rescue|ensure)\b(?!.*\bend$)"
            r"|=\s*(?:if|unless|case|begin)\b(?!.*\bend$))"
        ),
        close_keywords=("end",),
        top_level_stops=("\ndef ", "\nclass ", "\nmodule ", "\nrequire "),
    ),
    LanguageFacts(
        language="shellscript",
        blocks=KEYWORD,
        line_comments=("#",),
        # Shell quotes may span lines; `'...'` has no escapes.
        regions=(Region("'", "'"), Region('"', '"', escapes=True)),
        quotes="",
        opener_pattern=r"(?:\bthen|\bdo|\belse|\bin)$",
        close_keywords=("fi", "done", "esac"),
        top_level_stops=("\nfunction ",),
        comment_needs_space=True,
    ),
    LanguageFacts(
        language="yaml",
        blocks=INDENT,
        line_comments=("#",),
        opener_pattern=r"(?::|[|>][-+]?\d*)$",
        comment_needs_space=True,
    ),
)

GENERIC = LanguageFacts(language="", blocks=BRACE, quotes="")

_ALIASES = {
    "py": "python", "python3": "python", "js": "javascript", "jsx": "javascriptreact",
    "ts": "typescript", "tsx": "typescriptreact", "golang": "go", "rs": "rust", "c++": "cpp",
    "cxx": "cpp", "cc": "cpp", "h": "c", "sh": "shellscript", "bash": "shellscript",
    "zsh": "shellscript", "shell": "shellscript", "rb": "ruby", "cs": "csharp", "c#": "csharp",
    "kt": "kotlin", "yml": "yaml", "objc": "objective-c", "objcpp": "objective-cpp",
}


def normalize_language(language: str) -> str:
    """An LSP language id for common aliases and editor spellings ("py", "bash", "c++")."""
    key = (language or "").strip().lower()
    return _ALIASES.get(key, key)


def facts_for(language: str) -> LanguageFacts:
    """The facts for an LSP language id (or alias); a generic brace/indentation fallback for
    languages without specific facts."""
    return _FACTS.get(normalize_language(language), GENERIC)


def known_languages() -> tuple[str, ...]:
    """Languages with specific stop-rule facts."""
    return tuple(_FACTS)


_EXTENSIONS = {
    "py": "python", "pyi": "python", "pyw": "python",
    "js": "javascript", "mjs": "javascript", "cjs": "javascript",
    "jsx": "javascriptreact",
    "ts": "typescript", "mts": "typescript", "cts": "typescript",
    "tsx": "typescriptreact",
    "go": "go",
    "rs": "rust",
    "c": "c", "h": "c", "i": "c",
    "cc": "cpp", "cpp": "cpp", "cxx": "cpp", "c++": "cpp", "hpp": "cpp", "hh": "cpp",
    "hxx": "cpp", "h++": "cpp", "ipp": "cpp", "inl": "cpp", "tpp": "cpp", "ino": "cpp",
    "m": "objective-c", "mm": "objective-cpp",
    "lua": "lua",
    "java": "java",
    "rb": "ruby", "rake": "ruby", "gemspec": "ruby",
    "sh": "shellscript", "bash": "shellscript", "zsh": "shellscript", "ksh": "shellscript",
    "cs": "csharp", "csx": "csharp",
    "kt": "kotlin", "kts": "kotlin",
    "swift": "swift",
    "scala": "scala", "sc": "scala",
    "dart": "dart",
    "php": "php",
    "css": "css", "scss": "scss", "less": "less",
    "html": "html", "htm": "html",
    "json": "json", "jsonc": "jsonc",
    "yaml": "yaml", "yml": "yaml",
    "toml": "toml",
    "md": "markdown", "markdown": "markdown",
    "sql": "sql",
    "xml": "xml",
    "vue": "vue",
    "svelte": "svelte",
    "r": "r",
    "pl": "perl", "pm": "perl",
    "ex": "elixir", "exs": "elixir",
    "erl": "erlang",
    "hs": "haskell",
    "ml": "ocaml", "mli": "ocaml",
    "fs": "fsharp", "fsx": "fsharp",
    "clj": "clojure", "cljs": "clojure",
    "zig": "zig",
    "jl": "julia",
    "ps1": "powershell", "psm1": "powershell",
    "bat": "bat", "cmd": "bat",
    "tex": "latex",
    "rst": "restructuredtext",
    "mk": "makefile",
    "cmake": "cmake",
}
_FILENAMES = {
    "makefile": "makefile", "gnumakefile": "makefile", "dockerfile": "dockerfile",
    "gemfile": "ruby", "rakefile": "ruby", "cmakelists.txt": "cmake",
    ".bashrc": "shellscript", ".bash_profile": "shellscript", ".zshrc": "shellscript",
    ".profile": "shellscript",
}


def language_from_path(path: str) -> str:
    """The LSP language id for a file path or `file://` URI, from its name; "" when unknown."""
    if not path:
        return ""
    name = re.split(r"[/\\]", path.split("?", 1)[0].split("#", 1)[0])[-1].lower()
    if name in _FILENAMES:
        return _FILENAMES[name]
    if name.startswith("dockerfile."):
        return "dockerfile"
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem:  # no extension, or a dotfile such as ".env"
        return ""
    return _EXTENSIONS.get(extension, "")
