"""Which lines the cross-file benchmark removes: a use of a name the file's imports reach in another
file of the package, not a namesake (a local, a keyword argument, a word in a comment). Built from a
small package written here; the runs themselves need a model (`draftwise bench --cross-file`)."""
from __future__ import annotations

import textwrap

from decoding.bench.crossfile import _names_used, crossfile_cases

FILLER = "".join(f"def helper_{i}(value):\n    return value + {i}\n\n\n" for i in range(40))  # the prefix a case needs


def test_names_in_strings_and_comments_are_not_uses():
    assert _names_used('total = price(item)  # Widget is nearby') == ["total", "price", "item"]
    assert _names_used('x = "Widget" + label  /* Gadget */') == ["x", "label"]
    assert _names_used("frame.Widget(count)") == ["frame", "count"]


def test_a_case_uses_an_imported_name_not_a_namesake(tmp_path):
    package = tmp_path / "site" / "shop"
    package.mkdir(parents=True)
    (package / "widgets.py").write_text("class Widget:\n    def __init__(self, size):\n        self.size = size\n")
    # another file defines `timeout` and `Gadget`; the user's file never imports them
    (package / "settings.py").write_text("def timeout():\n    return 30\n\n\nclass Gadget:\n    pass\n")
    (package / "other.py").write_text("def unrelated():\n    return 1\n")
    (package / "__init__.py").write_text("")
    (package / "store.py").write_text(textwrap.dedent("""\
        from .widgets import Widget


        """) + FILLER + textwrap.dedent("""\
        def build(timeout):
            # a Gadget is not made here
            wait(timeout=timeout)
            size = 3  # as a Gadget has
            return Widget(size=size)
        """))
    for seed in range(5):  # the line is drawn at random among the candidates: every draw must be the use
        cases, indexes = crossfile_cases(4, seed=seed, languages=["python"], corpus=str(tmp_path / "site"))
        try:
            assert [(c.case.path, c.name, c.defined_in) for c in cases] == [("store.py", "Widget", "widgets.py")]
            assert cases[0].case.expected == "return Widget(size=size)"
        finally:
            for index in indexes.values():
                index.close()
