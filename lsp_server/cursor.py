"""Where a completion request completes: the document text around the cursor, read once, and the
rules that look only at that text."""
from __future__ import annotations

from dataclasses import dataclass

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from lsp_server.documents import LINE_BREAK, OpenDocument
from lsp_server.postprocess import IndentStyle


@dataclass(frozen=True)
class Cursor:
    """Where one request completes, read once from the document as it was when the request came."""

    doc: OpenDocument
    version: int
    start: int  # the range a suggestion replaces starts here (a selected popup item's start) ...
    end: int  # ... and ends here, before the auto-closed characters the edit also covers
    inserted: str  # a selected popup item's text, taken as typed
    prefix: str
    suffix: str
    line_before: str  # the cursor's line, before and after the cursor
    line_after: str
    indent: IndentStyle


def read_cursor(doc: OpenDocument, position: types.Position, selected: types.SelectedCompletionInfo | None,
                encoding: str, indent: IndentStyle) -> Cursor:
    start = end = doc.offset_at(position, encoding)
    inserted = ""
    if selected is not None:
        # The popup's selected item would replace `range` with its text; suggest what follows it.
        start = doc.offset_at(selected.range.start, encoding)
        end = doc.offset_at(selected.range.end, encoding)
        if end < start:
            raise JsonRpcInvalidParams("selectedCompletionInfo.range ends before it starts")
        inserted = selected.text
    prefix, suffix = doc.text[:start] + inserted, doc.text[end:]
    line_before, line_after = cursor_line(prefix, suffix)
    return Cursor(doc, doc.version, start, end, inserted, prefix, suffix, line_before, line_after, indent)


def mid_word(line_before: str, line_after: str) -> bool:
    """The rule for keystrokes not worth a generation: an automatic request with a letter, digit or
    underscore on both sides of the cursor is inside a word (editing an identifier, not writing new
    code). Editors do not show inline suggestions there, or the user types over them; an explicit
    invoke is still answered."""
    def word_char(ch: str) -> bool:
        return ch.isalnum() or ch == "_"

    return bool(line_before) and bool(line_after) and word_char(line_before[-1]) and word_char(line_after[0])


def line_break_of(text: str) -> str:
    """The line break an Enter inserts in this document."""
    return "\r\n" if "\r\n" in text else "\n"


def cursor_line(prefix: str, suffix: str) -> tuple[str, str]:
    """The cursor line's text before and after the cursor, without line breaks."""
    cut = max(prefix.rfind("\n"), prefix.rfind("\r"))
    match = LINE_BREAK.search(suffix)
    return prefix[cut + 1:], suffix[: match.start()] if match else suffix
