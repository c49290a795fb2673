"""Deciding whether a request continues the suggestion on screen."""
from __future__ import annotations

from lsp_server.typeahead import TypeAheadMemory

URI = "file:///w/a.py"


def memory_showing(text: str, prefix: str = "def f():\n    return ", suffix: str = "\n\nx = 1\n") -> TypeAheadMemory:
    memory = TypeAheadMemory()
    memory.remember(URI, prefix, suffix, text)
    return memory


def test_typing_along_the_suggestion_gives_the_rest():
    memory = memory_showing("sum(values)")
    assert memory.continuation(URI, "def f():\n    return s", "\n\nx = 1\n") == "um(values)"
    assert memory.continuation(URI, "def f():\n    return sum(val", "\n\nx = 1\n") == "ues)"


def test_asking_again_at_the_same_place_gives_the_whole_suggestion():
    memory = memory_showing("sum(values)")
    assert memory.continuation(URI, "def f():\n    return ", "\n\nx = 1\n") == "sum(values)"


def test_typing_something_else_or_everything_ends_the_continuation():
    memory = memory_showing("sum(values)")
    assert memory.continuation(URI, "def f():\n    return m", "\n\nx = 1\n") is None
    assert memory.continuation(URI, "def f():\n    return sum(values)", "\n\nx = 1\n") is None
    assert memory.continuation(URI, "def g():\n    return s", "\n\nx = 1\n") is None  # edited before


def test_a_bracket_the_editor_closed_while_typing_keeps_the_continuation():
    memory = memory_showing("sum(values)")
    # Typing "sum(" makes the editor insert ")" right of the cursor.
    assert memory.continuation(URI, "def f():\n    return sum(", ")\n\nx = 1\n") == "values)"


def test_other_edits_after_the_cursor_end_the_continuation():
    memory = memory_showing("sum(values)")
    assert memory.continuation(URI, "def f():\n    return s", "\n\nx = 2\n") is None
    assert memory.continuation(URI, "def f():\n    return s", "z\n\nx = 1\n") is None


def test_documents_are_separate_and_memory_is_bounded():
    memory = TypeAheadMemory(max_documents=2)
    for name in ("a", "b", "c"):
        memory.remember(f"file:///w/{name}.py", "p", "", "text")
    assert memory.continuation("file:///w/a.py", "p", "") is None  # evicted, the oldest
    assert memory.continuation("file:///w/c.py", "pt", "") == "ext"
    memory.forget("file:///w/c.py")
    assert memory.continuation("file:///w/c.py", "pt", "") is None


def test_only_the_latest_shown_suggestion_and_prefetches_after_it_answer_at_once():
    """An older suggestion was replaced on screen: typing along it is no reason to answer instantly.
    A prefetch (computed for after the latest one) is, and so is the latest one behind it."""
    prefix, suffix = "def f():\n    return ", "\n\nx = 1\n"
    memory = TypeAheadMemory()
    memory.remember(URI, prefix, suffix, "sum(values)")  # shown, then replaced by:
    memory.remember(URI, prefix, suffix, "max(values)")
    assert memory.continuation(URI, prefix + "s", suffix) is None
    assert memory.continuation(URI, prefix + "m", suffix) == "ax(values)"
    memory.remember(URI, prefix + "max(values)", suffix, "\n    # done", prefetched=True)
    assert memory.continuation(URI, prefix + "max(values)\n ", suffix) == "   # done"
    assert memory.continuation(URI, prefix + "ma", suffix) == "x(values)"  # behind the prefetch
    assert memory.continuation(URI, prefix + "su", suffix) is None
