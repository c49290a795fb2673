"""Turn the engine's text into the edit an editor shows: what to insert at the cursor and how many
characters to the right of the cursor it replaces.

The engine already decides how far to generate (line / block scope) and cuts text that repeats the
document's suffix. What is left is editor-side:
- mid-line with real text to the right, only one line makes sense;
- editors auto-close brackets and quotes, so `print(|)` has a `)` right of the cursor; when the
  suggestion closes that bracket itself, the edit's range covers the auto-inserted `)` instead of
  leaving two;
- new lines are indented with the document's tabs or spaces, whatever the model produced;
- nothing (or only whitespace) is never sent;
- after a word cut short by the cursor, a text that would break it (go on with blanks or a line end,
  or type its letters again) is never sent: token healing (decoding/healing.py) is what keeps the
  model's text whole, this is the last guard.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from decoding.brackets import QUOTES, only_closers, scan_brackets

# Words a line may end with, or go on from with a blank, though the document has them nowhere else
# (a new file's first `return`): the keywords of the languages the corpus and the presets cover.
KEYWORDS = frozenset("""
and as assert async await break case catch char class const continue def default del delete do double
elif else end enum export extends extern false final finally float fn for from func function go goto
if impl import in int interface let local long match mod module namespace new nil none not null or
package pass private protected pub public raise return self short signed static struct super switch
template then this throw throws true try type typedef typename typeof union unsigned use using var void
volatile where while with yield
""".split())
_WORD_END = re.compile(r"\w+\Z")  # \Z: `$` would also match before a final line end
_WORD_START = re.compile(r"\w+")
_COMMENT_STARTS = ("#", "//", "/*", "--")

# The characters an editor's auto-closing leaves right of the cursor.
_AUTO_CLOSED_RUN = re.compile(r"[)\]}\"'`]*")
_LEADING_WS = re.compile(r"^[ \t]*")


@dataclass(frozen=True)
class IndentStyle:
    use_tabs: bool = False
    width: int = 4  # columns per level (spaces per tab when converting)


@dataclass(frozen=True)
class Edit:
    text: str  # inserted at the cursor
    replace: int  # code points right of the cursor (on the cursor's line) that text replaces


def detect_indent(document: str, max_lines: int = 2000) -> IndentStyle:
    """The document's indentation: tabs or spaces, and the most common step between levels."""
    tab_lines = space_lines = 0
    steps: Counter[int] = Counter()
    previous = 0
    for line in document.splitlines()[:max_lines]:
        if not line.strip():
            continue
        indent = _LEADING_WS.match(line).group(0)
        if indent.startswith("\t"):
            tab_lines += 1
        elif indent:
            space_lines += 1
        width = len(indent.expandtabs(8))
        if indent and not indent.startswith("\t") and width > previous:
            steps[width - previous] += 1
        previous = width
    if tab_lines > space_lines:
        return IndentStyle(use_tabs=True, width=4)
    common = [step for step, _ in steps.most_common() if step in (2, 3, 4, 8)]
    return IndentStyle(use_tabs=False, width=common[0] if common else 4)


def convert_indent(text: str, style: IndentStyle, first_line_too: bool) -> str:
    """Rewrite the leading whitespace of each line of text in the document's style."""
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if i == 0 and not first_line_too:
            continue
        indent = _LEADING_WS.match(line).group(0)
        if not indent:
            continue
        columns = len(indent.expandtabs(style.width))
        if style.use_tabs:
            new = "\t" * (columns // style.width) + " " * (columns % style.width)
        else:
            new = " " * columns
        lines[i] = new + line[len(indent):]
    return "\n".join(lines)


def open_quote(line_before: str) -> str | None:
    """The quote character of a string literal left open before the cursor on this line, if any."""
    quote: str | None = None
    escaped = False
    for ch in line_before:
        if escaped:
            escaped = False
        elif ch == "\\" and quote is not None:
            escaped = True
        elif quote is None and ch in QUOTES:
            quote = ch
        elif ch == quote:
            quote = None
    return quote


def closers_of_earlier_text(text: str, quote_at_start: str | None) -> list[str]:
    """Brackets and quotes in text that close something opened before the cursor, in order."""
    return scan_brackets(text, quote_at_start)[0]


def is_mid_line(line_after: str) -> bool:
    """Text right of the cursor that a multi-line suggestion would push down and leave dangling."""
    return not only_closers(line_after)


def shape(text: str, line_before: str, line_after: str, indent: IndentStyle) -> Edit | None:
    """The edit to show for the engine's text at a cursor between line_before and line_after
    (the cursor line's text, without its line break); None when there is nothing worth showing."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if is_mid_line(line_after):
        text = text.split("\n", 1)[0]
    text = convert_indent(text, indent, first_line_too=not line_before.strip())
    at_line_end = not line_after.strip()
    if at_line_end:
        text = text.rstrip()

    # Auto-closed brackets/quotes right of the cursor that the suggestion closes itself.
    auto_closed = _AUTO_CLOSED_RUN.match(line_after).group(0)
    quote = open_quote(line_before)
    closes = closers_of_earlier_text(text, quote)
    replace = 0
    while replace < min(len(auto_closed), len(closes)) and auto_closed[replace] == closes[replace]:
        replace += 1

    # The rest of the line, if the suggestion ends by repeating it, is not inserted twice; unless
    # the suggestion needs those characters to close its own brackets (`print(|)` -> `len(x)`).
    rest = line_after[replace:].rstrip()
    if rest.strip() and "\n" not in text and text.endswith(rest) \
            and not scan_brackets(text[: -len(rest)], quote)[1]:
        text = text[: -len(rest)]

    if not text.strip() or text == line_after[:replace]:
        return None
    return Edit(text=text, replace=replace)


def breaks_the_word(text: str, prefix: str, suffix: str) -> bool:
    """After a word at the cursor (`prefix` ends in a letter, digit or underscore), whether `text` would
    break it:
    - it goes on with two or more blanks or a tab (`s` + `        self.data = ...`): indentation, not
      what follows a word, unless a comment follows them (`x = 1  # one`) or what follows them starts
      at a column that the lines around start a column at after blanks (a Go struct, `#define`s);
    - it ends the line right after a word alone on its line that the document has nowhere else and no
      language has as a keyword (`    se` + a line break), unless its next line underlines it (a
      docstring's `Parameters` + `----------`);
    - it types the word's letters again (`return n` + `n * f(n - 1)`, `ret` + `return x`): a keyword
      or a word the document has, typed after its own first letters, making one it has nowhere else.
    A single blank or a line end after a word is how code goes on (`return n` + ` * f(n - 1)`, a new
    name `total` + ` = 0`): healing lets the model decide that the word is whole."""
    typed = _WORD_END.search(prefix, max(0, len(prefix) - WORD_CHARS))  # a word, not the whole document
    if typed is None or not text:
        return False
    word = typed.group()
    blanks = _LEADING_WS.match(text).group(0)
    line_before = prefix[max(prefix.rfind("\n"), prefix.rfind("\r")) + 1:]
    if (len(blanks) >= 2 or "\t" in blanks) and not text[len(blanks):].startswith(_COMMENT_STARTS):
        return not _starts_a_column(len((line_before + blanks).expandtabs(TAB_COLUMNS)), prefix, suffix)
    if text[0] in "\r\n":
        return line_before.strip() == word and word not in KEYWORDS and not _UNDERLINE.match(text) and \
            not _is_known(word, prefix, suffix, len(word))
    head = _WORD_START.match(text)
    return head is not None and head.group().startswith(word) and \
        (head.group() in KEYWORDS or _is_known(head.group(), prefix, suffix, len(word))) and \
        not _is_known(word + head.group(), prefix, suffix, len(word))


TAB_COLUMNS = 8  # where a tab that aligns columns leads to (the editors' default)
WORD_CHARS = 256  # the longest word before the cursor looked at
# a non-blank after a run of blanks inside a line (not before a comment): where a column starts
_COLUMN_START = re.compile(r"(?<=\S)(?:[ \t]{2,}|\t)(?!#|//|--|/\*)(?=\S)")
_UNDERLINE = re.compile(r"\r?\n[ \t]*([-=~^])\1{2,}[ \t]*(\r?\n|$)")


def _starts_a_column(column: int, prefix: str, suffix: str, lines: int = 5) -> bool:
    """Whether one of the lines around the cursor (up to `lines` each side) starts a column at `column`
    after a run of blanks."""
    around = prefix.rsplit("\n", lines + 1)[-lines - 1:-1] + suffix.split("\n", lines + 1)[1:lines + 1]
    # a character's column is at least its index: what lies past `column` starts no column there
    return any(len(line[:m.end()].expandtabs(TAB_COLUMNS)) == column
               for line in around for m in _COLUMN_START.finditer(line[:column + 1].rstrip("\r")))


def _is_known(word: str, prefix: str, suffix: str, typed: int) -> bool:
    """Whether the document has `word` as a whole word away from the cursor (the word being typed, the
    prefix's last `typed` characters, is left out)."""
    pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")
    return bool(pattern.search(prefix, 0, len(prefix) - typed) or pattern.search(suffix))
