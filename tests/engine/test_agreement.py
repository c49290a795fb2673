"""The one rule for typing along a suggestion (decoding/agreement.py), as type-ahead, idle work's
prediction, a job told what the user typed and the suggestion drafter use it."""
from __future__ import annotations

import pytest

from decoding.agreement import agrees, remains, typed_since

RULES = {"agrees": agrees, "remains": remains, "typed_since": typed_since}

CASES = [
    # agrees(text, typed): the same up to the shorter one's length
    ("agrees", ("sum(values)", "sum("), True, "typed part of the suggestion"),
    ("agrees", ("sum(", "sum(values)"), True, "typed past what a running job has generated so far"),
    ("agrees", ("sum(values)", "sum(values)"), True, "typed it all"),
    ("agrees", ("", "x"), True, "nothing generated yet: the benefit of the doubt"),
    ("agrees", ("sum(values)", "sun"), False, "typed something else"),
    ("agrees", ("sum(", "sum[values"), False, "went another way past what is generated"),
    # remains(suggestion, typed): what is left of the suggestion after the typing
    ("remains", ("sum(values)", ""), "sum(values)", "typed nothing"),
    ("remains", ("sum(values)", "sum(val"), "ues)", "typed part of it"),
    ("remains", ("sum(values)", "sum(values)"), "", "typed to its end"),
    ("remains", ("sum(values)", "sum(values) "), None, "typed past its end"),
    ("remains", ("sum(values)", "max("), None, "typed something else"),
    ("remains", ([5, 7, 9], [5]), [7, 9], "the drafter: the target generated the hint's first token"),
    ("remains", ([5, 7, 9], [5, 8]), None, "the drafter: the target went another way"),
    ("remains", ([5, 7], [5, 7, 9]), None, "the drafter: the target went past the hint"),
    # typed_since(old_prefix, old_suffix, prefix, suffix): what was typed at the old cursor
    ("typed_since", ("return ", "\nx = 1", "return sum", "\nx = 1"), "sum", "typed at the cursor"),
    ("typed_since", ("return ", "\nx = 1", "return ", "\nx = 1"), "", "no edit"),
    ("typed_since", ("return ", "\nx = 1", "return sum(", ")\nx = 1"), "sum(", "the editor closed the bracket"),
    ("typed_since", ("return ", "\nx = 1", "return sum(", "a)\nx = 1"), None, "an edit right of the cursor"),
    ("typed_since", ("return ", "\nx = 1", "retur", "\nx = 1"), None, "deleted before the cursor"),
    ("typed_since", ("return ", "\nx = 1", "return s", "\nx = 2"), None, "edited further down"),
    ("typed_since", ("def f():\n    ", "\n", "def g():\n    x", "\n"), None, "edited an earlier line"),
]


@pytest.mark.parametrize("rule, args, expected, why", CASES, ids=[f"{c[0]}: {c[3]}" for c in CASES])
def test_typing_along_a_suggestion(rule, args, expected, why):
    assert RULES[rule](*args) == expected
