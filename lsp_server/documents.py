"""Open documents as the client sees them, positions in the negotiated encoding, and the other files
shown to the model as context.

We keep our own copy of each document rather than pygls' workspace copy because LSP has exactly three
line breaks (\\n, \\r\\n, \\r) while `str.splitlines` (which pygls uses) also breaks at form feeds,
\\x1c-\\x1e, \\x85, \\u2028 and \\u2029; source files do contain form feeds (some C and Python files use
them as page breaks), and a single one shifts every line number after it.

Columns: the client counts `Position.character` in UTF-16 code units (the default), UTF-8 bytes or
code points, as negotiated at initialize. Python strings index code points.
"""
from __future__ import annotations

import bisect
import itertools
import os
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath, PureWindowsPath
from typing import Iterable, Sequence

from lsprotocol import types
from pygls.uris import to_fs_path

from decoding.api import ContextFile

LINE_BREAK = re.compile(r"\r\n|\r|\n")
UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
ENCODINGS = (UTF8, UTF16, UTF32)


def code_units(char: str, encoding: str) -> int:
    """How many units of the client's encoding one code point takes."""
    cp = ord(char)
    if encoding == UTF16:
        return 2 if cp > 0xFFFF else 1
    if encoding == UTF8:
        return 1 if cp < 0x80 else 2 if cp < 0x800 else 3 if cp < 0x10000 else 4
    return 1


def units_in(text: str, encoding: str) -> int:
    if encoding == UTF32 or text.isascii():
        return len(text)
    return sum(code_units(c, encoding) for c in text)


def index_at_units(line: str, units: int, encoding: str) -> int:
    """Code-point index of a column given in client units.

    Past the end of the line means the end of the line (as the spec says). A column inside a
    multi-unit character (half a surrogate pair, a byte inside a UTF-8 sequence) lands before it,
    so an insertion there never splits the character.
    """
    if units <= 0:
        return 0
    if encoding == UTF32 or line.isascii():
        return min(units, len(line))
    seen = 0
    for index, char in enumerate(line):
        seen += code_units(char, encoding)
        if seen > units:
            return index
        if seen == units:
            return index + 1
    return len(line)


@dataclass
class OpenDocument:
    uri: str
    language_id: str
    version: int
    text: str
    last_used: int = 0  # a store-wide counter value: larger is more recent
    # Where the last edit ended, as a code-point offset: most likely the cursor (typing inserts at the
    # cursor and leaves it after the text). None after a whole-document change.
    edit_end: int | None = None
    _lines: tuple[list[int], list[int]] | None = field(default=None, repr=False)

    def _line_table(self) -> tuple[list[int], list[int]]:
        """(start offset of each line, offset where each line's content ends before its break)."""
        if self._lines is None:
            starts, ends = [0], []
            for m in LINE_BREAK.finditer(self.text):
                ends.append(m.start())
                starts.append(m.end())
            ends.append(len(self.text))
            self._lines = (starts, ends)
        return self._lines

    @property
    def line_count(self) -> int:
        return len(self._line_table()[0])

    def line(self, number: int) -> str:
        starts, ends = self._line_table()
        return self.text[starts[number]:ends[number]]

    def offset_at(self, position: types.Position, encoding: str) -> int:
        """Code-point offset into text of a client position (clamped into the document)."""
        starts, ends = self._line_table()
        if position.line >= len(starts):
            return len(self.text)
        start, end = starts[position.line], ends[position.line]
        return start + index_at_units(self.text[start:end], position.character, encoding)

    def position_at(self, offset: int, encoding: str) -> types.Position:
        starts, ends = self._line_table()
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(starts, offset) - 1
        column_end = min(offset, ends[line])  # an offset inside a \r\n counts as the end of the line
        return types.Position(line=line, character=units_in(self.text[starts[line]:column_end], encoding))

    def apply_change(self, change: types.TextDocumentContentChangeEvent, encoding: str) -> None:
        if isinstance(change, types.TextDocumentContentChangePartial):
            start = self.offset_at(change.range.start, encoding)
            end = self.offset_at(change.range.end, encoding)
            if end < start:
                raise ValueError(f"change range ends before it starts: {change.range}")
            self.text = self.text[:start] + change.text + self.text[end:]
            self.edit_end = start + len(change.text)
        else:
            self.text = change.text
            self.edit_end = None
        self._lines = None


class DocumentStore:
    """The documents the client has open, in the client's position encoding."""

    def __init__(self, encoding: str = UTF16) -> None:
        self.encoding = encoding
        self._documents: dict[str, OpenDocument] = {}
        self._clock = itertools.count(1)

    def __contains__(self, uri: str) -> bool:
        return uri in self._documents

    def __len__(self) -> int:
        return len(self._documents)

    def get(self, uri: str) -> OpenDocument | None:
        return self._documents.get(uri)

    def open(self, uri: str, language_id: str, version: int, text: str) -> OpenDocument:
        doc = OpenDocument(uri, language_id, version, text, last_used=next(self._clock))
        self._documents[uri] = doc
        return doc

    def is_stale(self, doc: OpenDocument, version: int) -> bool:
        """Whether an answer made for `doc` at `version` came too late: the document was closed (or
        opened anew) or edited since."""
        return self._documents.get(doc.uri) is not doc or doc.version != version

    def change(self, uri: str, version: int,
               changes: Iterable[types.TextDocumentContentChangeEvent]) -> OpenDocument:
        doc = self._documents.get(uri)
        if doc is None:
            raise KeyError(f"didChange for a document that is not open: {uri}")
        for change in changes:
            doc.apply_change(change, self.encoding)
        doc.version = version
        doc.last_used = next(self._clock)
        return doc

    def close(self, uri: str) -> None:
        self._documents.pop(uri, None)

    def touch(self, uri: str) -> None:
        if (doc := self._documents.get(uri)) is not None:
            doc.last_used = next(self._clock)

    def most_recent_first(self) -> list[OpenDocument]:
        return sorted(self._documents.values(), key=lambda d: d.last_used, reverse=True)


# ---- paths and context ---------------------------------------------------------------------------

def uri_to_path(uri: str) -> str | None:
    """Filesystem path of a file: URI; None for other schemes (untitled:, git:, ...)."""
    if not uri.startswith("file:"):
        return None
    return to_fs_path(uri)


def _pure(path: str):
    return PureWindowsPath(path) if os.name == "nt" else PurePosixPath(path)


def workspace_relative(path: str | None, folders: Sequence[str]) -> str | None:
    """path relative to the innermost workspace folder holding it (with / separators); None if no
    folder holds it. `..` segments are resolved first so they cannot climb out of a folder."""
    if path is None:
        return None
    target = _pure(os.path.normpath(path))
    best: str | None = None
    best_depth = -1
    for folder in folders:
        root = _pure(os.path.normpath(folder))
        if target != root and target.is_relative_to(root) and len(root.parts) > best_depth:
            best, best_depth = target.relative_to(root).as_posix(), len(root.parts)
    return best


def display_path(uri: str, folders: Sequence[str]) -> str:
    """The path the model sees for a document: workspace-relative, else just the file name (an
    absolute path says nothing useful to the model and leaks the user's directory layout)."""
    path = uri_to_path(uri)
    relative = workspace_relative(path, folders)
    if relative is not None:
        return relative
    return _pure(path).name if path else ""


def select_context(store: DocumentStore, current: OpenDocument, folders: Sequence[str],
                   max_files: int = 8, max_chars: int = 6000) -> list[ContextFile]:
    """Other open documents of the same language inside the workspace, most recently used first.

    Each text is cut to max_chars (from the top of the file, where imports and definitions are): the
    engine tokenizes every context file on every request and drops files that do not fit whole, so a
    huge file would only cost time.
    """
    files: list[ContextFile] = []
    for doc in store.most_recent_first():
        if len(files) >= max_files:
            break
        if doc.uri == current.uri or doc.language_id != current.language_id or not doc.text.strip():
            continue
        relative = workspace_relative(uri_to_path(doc.uri), folders)
        if relative is None:
            continue
        text = doc.text
        if len(text) > max_chars:
            head = text[:max_chars]
            text = head[:head.rfind("\n") + 1] or head  # whole lines, unless one line is that long
        files.append(ContextFile(path=relative, text=text))
    return files
