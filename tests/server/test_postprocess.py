"""Shaping the engine's text into the edit an editor shows."""
from __future__ import annotations

import pytest

from lsp_server.completions import mid_word
from lsp_server.postprocess import (
    Edit, IndentStyle, closers_of_earlier_text, convert_indent, detect_indent, open_quote, shape,
)

SPACES4 = IndentStyle(use_tabs=False, width=4)
TABS = IndentStyle(use_tabs=True, width=4)


def applied(line_before: str, line_after: str, edit: Edit) -> str:
    """The line as the editor shows it after accepting the edit."""
    return line_before + edit.text + line_after[edit.replace:]


def test_mid_line_keeps_only_the_first_line():
    edit = shape("items, key=len)\n    more()\n", "sorted(", " if ok else []", SPACES4)
    assert edit == Edit("items, key=len)", 0)


def test_end_of_a_block_opener_keeps_the_block_and_drops_trailing_blank_lines():
    edit = shape("\n    return a + b\n\n", "def add(a, b):", "", SPACES4)
    assert edit == Edit("\n    return a + b", 0)


@pytest.mark.parametrize("line_before,line_after,text,expected_line", [
    # The suggestion closes the auto-inserted bracket itself: the range covers it.
    ("print(", ")", '"hi")', 'print("hi")'),
    ('print("', '")', 'hi")', 'print("hi")'),
    ("xs = [", "];", "1, 2]", "xs = [1, 2];"),
    ("f(", ")", "a), g(b)", "f(a), g(b)"),
    # Brackets the suggestion opens and closes itself leave the auto-inserted one alone.
    ("print(", ")", "len(x)", "print(len(x))"),
    ('x = f("', '")', "it's", 'x = f("it\'s")'),
    # Nothing closes the auto-inserted bracket: it stays where it is.
    ("print(", ")", "value", "print(value)"),
])
def test_auto_closed_brackets_and_quotes_are_not_duplicated(line_before, line_after, text, expected_line):
    edit = shape(text, line_before, line_after, SPACES4)
    assert applied(line_before, line_after, edit) == expected_line


def test_a_multi_line_suggestion_that_closes_the_auto_closed_bracket_covers_it():
    edit = shape("\n    a,\n    b,\n)", "call(", ")", SPACES4)
    assert edit == Edit("\n    a,\n    b,\n)", 1)
    assert applied("call(", ")", edit) == "call(\n    a,\n    b,\n)"


def test_suggestion_repeating_the_rest_of_the_line_is_trimmed():
    assert shape("total + 1", "return ", "total + 1", SPACES4) is None
    edit = shape("bar + foo", "x = ", "foo", SPACES4)
    assert applied("x = ", "foo", edit) == "x = bar + foo"


@pytest.mark.parametrize("text", ["", "   ", "\n\n", "\t \n "])
def test_empty_or_whitespace_only_suggestions_are_not_sent(text):
    assert shape(text, "x = ", "", SPACES4) is None


def test_a_suggestion_that_only_retypes_the_auto_closed_text_is_not_sent():
    assert shape(")", "print(x", ")", SPACES4) is None


def test_spaces_become_tabs_in_a_tab_indented_document():
    edit = shape("\n    if x:\n        y()\n      z", "def f():", "", TABS)
    assert edit.text == "\n\tif x:\n\t\ty()\n\t  z"


def test_tabs_become_spaces_in_a_space_indented_document():
    edit = shape("\n\treturn {\n\t\tok: true,\n\t}", "function f() {", "", IndentStyle(False, 2))
    assert edit.text == "\n  return {\n    ok: true,\n  }"


def test_first_line_indentation_is_converted_only_at_a_blank_cursor_line():
    assert convert_indent("\tx\n\ty", SPACES4, first_line_too=False) == "\tx\n    y"
    assert convert_indent("\tx\n\ty", SPACES4, first_line_too=True) == "    x\n    y"
    edit = shape("\treturn 1", "", "", SPACES4)  # cursor at column 0 of an empty line
    assert edit.text == "    return 1"


def test_detect_indent():
    assert detect_indent("def f():\n\tif x:\n\t\treturn 1\n") == IndentStyle(True, 4)
    assert detect_indent("function f() {\n  if (x) {\n    return 1;\n  }\n}\n") == IndentStyle(False, 2)
    assert detect_indent("class A:\n    def f(self):\n        pass\n") == IndentStyle(False, 4)
    assert detect_indent("x = 1\n") == IndentStyle(False, 4)


def test_open_quote():
    assert open_quote('x = "abc') == '"'
    assert open_quote('x = "a\\"b') == '"'
    assert open_quote("x = 'a' + \"") == '"'
    assert open_quote('x = "done"') is None
    assert open_quote("it = `tmpl ${'q'}") == "`"


def test_closers_of_earlier_text():
    assert closers_of_earlier_text('hi")', '"') == ['"', ")"]
    assert closers_of_earlier_text("a[0]) + (b)", None) == [")"]
    assert closers_of_earlier_text('"(" )', None) == [")"]  # brackets inside strings do not count


def test_repeated_punctuation_after_a_covered_bracket_is_trimmed():
    edit = shape("x);", "foo(", ");", SPACES4)
    assert applied("foo(", ");", edit) == "foo(x);"


def test_the_mid_word_rule_needs_a_word_character_on_both_sides():
    assert mid_word("    va", "lue = 1")
    assert mid_word("x_", "1")
    assert not mid_word("", "value = 1")  # the start of a line: new code goes before it
    assert not mid_word("value ", "= 1")
    assert not mid_word("print(", "x)")
    assert not mid_word("value", "")  # the end of a word: completing it is the point


@pytest.mark.parametrize("prefix,text,suffix,broken", [
    # indentation after a word: the line would break
    ("class A:\n    def f(self):\n        s", "        self.data = 1", "", True),
    ("def f(default=1):\n    d", "         default=default,", "", True),
    ("x = value", "\tmore", "", True),
    ("x = value", "  # a comment after two blanks (PEP 8)", "", False),
    # the word's letters typed again, making a word the document has nowhere else
    ("function factorial(n) {\n  return n", "n * factorial(n - 1);", "\n}", True),
    ("hasjabs = []\nfor op in ops:\n    ha", "hasjabs.append(op)", "", True),
    ("import textwrap\ntextwrap.de", "dent(s)", "", False),  # `dedent`: `dent` is no word here
    ("xx = 1\nprint(x", "x)", "", False),  # `xx` is a name the document has
    # a name the document knows, then a blank or a line end: how code goes on
    ("function factorial(n) {\n  return n", " * factorial(n - 1);", "\n}", False),
    ("total = 0\nx = total", "\ny = 2", "", False),
    # a new name, then a blank: the model decided the word is whole
    ("def f():\n    total", " = 0", "", False),
    # a lone word cut short, then a line end
    ("def f():\n    se", "\n    return", "", True),
    ("def f():\n    return", "\n", "", False),  # a keyword
    # no word before the cursor, or the word goes on
    ("def f():\n    ", "    x = 1", "", False),
    ("for x in xs:\n    continue\n", "        y = 2", "", False),  # after an Enter: no word at the cursor
    # columns aligned with blanks around the cursor: blanks after a word are the file's style
    ("type T struct {\n\tID       int\n\tName", "     string", "\n\tLongName string\n}", False),
    ("#define MAX_N      128\n#define MAX_LEN", "    256", "", False),
    ("#define A\t1\n#define MAX_LEN", "\t256", "", False),
    ("#define MAX_N  128\n#define MAX_LEN", "    256", "", True),  # blanks to no column the lines have
    ("x = 1  # one\ny = 2  # two\nz = value", "    more", "", True),  # a comment's blanks align nothing
    ("x = 1\n#   see below\ndef f():\n    s", "        self.data = 1", "", True),
    ("x = 1\r\n#define MAX_N      128\r\n#define MAX_LEN", "    256", "", False),  # CRLF
    # a whole word alone on its line, then a line end (a docstring's section)
    ('def f(a):\n    """\n    Parameters', "\n    ----------", "", False),
    ("def f():\n    retu", "\n    x", "", True),  # a word cut short of any length
    ("def f():\n    ret", "return x", "", True),  # a keyword typed again
    ("    ha", "hasjabs.append(op)", "", False),  # a new name: the model may mean it
    ("x = se", "lf.data", "", False),
])
def test_a_text_that_would_break_the_word_before_the_cursor_is_not_shown(prefix, text, suffix, broken):
    from lsp_server.postprocess import breaks_the_word

    assert breaks_the_word(text, prefix, suffix) is broken
