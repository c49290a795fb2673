"""Document sync and position encodings, checked against Python's own codecs as the oracle."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lsprotocol import types

from lsp_server.documents import (
    UTF8, UTF16, UTF32, DocumentStore, OpenDocument, display_path, select_context, workspace_relative,
)

ENCODINGS = (UTF8, UTF16, UTF32)


def client_units(text: str, encoding: str) -> int:
    """What a client counts, computed the way a client would: by encoding the text."""
    if encoding == UTF8:
        return len(text.encode("utf-8"))
    if encoding == UTF16:
        return len(text.encode("utf-16-le")) // 2
    return len(text)


def client_position(text: str, offset: int, encoding: str) -> types.Position:
    """The LSP position of a code-point offset: only \\n, \\r\\n and \\r end lines."""
    line_start, line = 0, 0
    i = 0
    while i < offset:
        if text[i] == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
            i += 2
            line, line_start = line + 1, i
        elif text[i] in "\r\n":
            i += 1
            line, line_start = line + 1, i
        else:
            i += 1
    return types.Position(line=line, character=client_units(text[line_start:offset], encoding))


MIXED_LINE = 'label = "😀 中文 é" + f(x)  # 🀄'


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_column_of_a_non_ascii_line_maps_to_its_code_point(encoding):
    text = "first line\n" + MIXED_LINE + "\nlast"
    doc = OpenDocument("file:///w/a.py", "python", 1, text)
    start = len("first line\n")
    for column in range(len(MIXED_LINE) + 1):
        position = types.Position(line=1, character=client_units(MIXED_LINE[:column], encoding))
        assert doc.offset_at(position, encoding) == start + column
        assert doc.position_at(start + column, encoding) == position


def test_the_same_column_number_means_different_places_per_encoding():
    doc = OpenDocument("file:///w/a.py", "python", 1, 's = "😀" + x')
    # After the emoji's closing quote: 7 code points, 8 UTF-16 units, 10 UTF-8 bytes.
    assert doc.offset_at(types.Position(line=0, character=7), UTF32) == 7
    assert doc.offset_at(types.Position(line=0, character=8), UTF16) == 7
    assert doc.offset_at(types.Position(line=0, character=10), UTF8) == 7


@pytest.mark.parametrize("encoding,inside", [(UTF16, 1), (UTF8, 1), (UTF8, 3)])
def test_a_column_inside_a_character_lands_before_it(encoding, inside):
    doc = OpenDocument("file:///w/a.py", "python", 1, "x😀y")
    assert doc.offset_at(types.Position(line=0, character=1 + inside), encoding) == 1


def test_positions_past_the_end_are_clamped():
    doc = OpenDocument("file:///w/a.py", "python", 1, "ab\r\ncd\n")
    assert doc.offset_at(types.Position(line=0, character=99), UTF16) == 2  # before the \r\n
    assert doc.offset_at(types.Position(line=1, character=99), UTF16) == 6
    assert doc.offset_at(types.Position(line=7, character=0), UTF16) == len(doc.text)
    assert doc.line_count == 3


def test_only_lsp_line_breaks_end_lines():
    # Form feed, \x1c, \x85 and \u2028 are line breaks for str.splitlines but not for LSP.
    text = "a\x0cb\x1cc\x85d\u2028e\rf\r\ng\nh"
    doc = OpenDocument("file:///w/a.c", "c", 1, text)
    assert [doc.line(i) for i in range(doc.line_count)] == ["a\x0cb\x1cc\x85d\u2028e", "f", "g", "h"]
    assert doc.offset_at(types.Position(line=1, character=0), UTF16) == text.index("f")


_ALPHABET = st.sampled_from(list("ab xy(") + ["😀", "中", "é", "\n", "\r\n", "\r", "\x0c", "\u2028", "\t"])
_TEXT = st.lists(_ALPHABET, max_size=40).map("".join)


def _valid_offsets(text: str) -> list[int]:
    # A position can never point between the \r and \n of one line break.
    return [i for i in range(len(text) + 1) if not (0 < i < len(text) and text[i - 1] == "\r" and text[i] == "\n")]


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, new=_TEXT, data=st.data(), encoding=st.sampled_from(ENCODINGS))
def test_incremental_changes_match_the_clients_text(text, new, data, encoding):
    offsets = _valid_offsets(text)
    a = data.draw(st.sampled_from(offsets))
    b = data.draw(st.sampled_from(offsets))
    start, end = min(a, b), max(a, b)
    store = DocumentStore(encoding)
    store.open("file:///w/a.py", "python", 1, text)
    change = types.TextDocumentContentChangePartial(
        range=types.Range(start=client_position(text, start, encoding), end=client_position(text, end, encoding)),
        text=new)
    doc = store.change("file:///w/a.py", 2, [change])
    assert doc.text == text[:start] + new + text[end:]
    assert doc.version == 2
    # Positions computed after the change agree with the client's view of the new text.
    for offset in _valid_offsets(doc.text):
        assert doc.position_at(offset, encoding) == client_position(doc.text, offset, encoding)


def test_several_changes_in_one_notification_apply_in_order():
    store = DocumentStore(UTF16)
    store.open("file:///w/a.py", "python", 1, "😀\nbc\n")
    doc = store.change("file:///w/a.py", 2, [
        types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=0, character=2), end=types.Position(line=0, character=2)),
            text="x"),  # after the emoji (2 UTF-16 units)
        types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=0, character=0), end=types.Position(line=1, character=1)),
            text=""),  # from the start to after "b", in the text the first change produced
        types.TextDocumentContentChangePartial(
            range=types.Range(start=types.Position(line=0, character=1), end=types.Position(line=0, character=1)),
            text="!"),
    ])
    assert doc.text == "c!\n"


def test_a_whole_document_change_replaces_the_text():
    store = DocumentStore(UTF8)
    store.open("file:///w/a.py", "python", 1, "old")
    doc = store.change("file:///w/a.py", 5, [types.TextDocumentContentChangeWholeDocument(text="new\ntext")])
    assert (doc.text, doc.version, doc.line_count) == ("new\ntext", 5, 2)


def test_change_to_a_document_that_is_not_open_is_an_error():
    with pytest.raises(KeyError, match="not open"):
        DocumentStore().change("file:///w/nope.py", 2, [])


# ---- paths and context ---------------------------------------------------------------------------

def test_workspace_relative_paths():
    folders = ["/w", "/w/sub"]
    assert workspace_relative("/w/a/b.py", folders) == "a/b.py"
    assert workspace_relative("/w/sub/c.py", folders) == "c.py"  # innermost folder wins
    assert workspace_relative("/elsewhere/d.py", folders) is None
    assert workspace_relative("/w/../etc/passwd", folders) is None
    assert workspace_relative("/ws/e.py", folders) is None  # a sibling with a common name prefix
    assert workspace_relative("/w", folders) is None


def test_display_path_is_relative_inside_the_workspace_and_a_bare_name_outside():
    assert display_path("file:///w/pkg/m.py", ["/w"]) == "pkg/m.py"
    assert display_path("file:///home/me/secret/m.py", ["/w"]) == "m.py"
    assert display_path("untitled:Untitled-1", ["/w"]) == ""


def _store_with(*docs: tuple[str, str, str]) -> DocumentStore:
    store = DocumentStore()
    for uri, language, text in docs:
        store.open(uri, language, 1, text)
    return store


def test_context_is_same_language_inside_the_workspace_most_recent_first():
    store = _store_with(
        ("file:///w/old.py", "python", "old = 1\n"),
        ("file:///w/pkg/util.py", "python", "def util(): ...\n"),
        ("file:///w/app.ts", "typescript", "let x = 1\n"),
        ("file:///outside/leak.py", "python", "secret = 1\n"),
        ("untitled:Untitled-1", "python", "scratch = 1\n"),
        ("file:///w/empty.py", "python", "  \n"),
        ("file:///w/main.py", "python", "import util\n"),
    )
    store.touch("file:///w/old.py")  # used after util.py now
    current = store.get("file:///w/main.py")
    context = select_context(store, current, ["/w"])
    assert [f.path for f in context] == ["old.py", "pkg/util.py"]
    assert context[1].text == "def util(): ...\n"


def test_context_without_workspace_folders_is_empty():
    store = _store_with(("file:///w/a.py", "python", "a = 1\n"), ("file:///w/b.py", "python", "b = 2\n"))
    assert select_context(store, store.get("file:///w/b.py"), []) == []


def test_context_files_are_cut_at_whole_lines_and_limited_in_number():
    long_text = "".join(f"line_{i} = {i}\n" for i in range(1000))
    store = _store_with(*[(f"file:///w/f{i}.py", "python", long_text) for i in range(12)],
                        ("file:///w/main.py", "python", ""))
    context = select_context(store, store.get("file:///w/main.py"), ["/w"], max_files=8, max_chars=100)
    assert len(context) == 8
    for f in context:
        assert len(f.text) <= 100 and f.text.endswith("\n") and long_text.startswith(f.text)
        assert re.fullmatch(r"(line_\d+ = \d+\n)+", f.text)
