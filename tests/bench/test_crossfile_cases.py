"""Which lines the cross-file benchmark removes: a use of a name the file's imports reach in another
file of the package, not a namesake (a local, a keyword argument, a word in a comment). Built from a
small package written here; the runs themselves need a model (`draftwise bench --cross-file`)."""
from __future__ import annotations

import textwrap

from bench.crossfile import _names_used, crossfile_cases

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


def test_corpus_cases_run_in_their_package_and_never_see_their_own_file(tmp_path):
    """--corpus-context: ordinary corpus cases, each with its package as the workspace; the selection
    shows other files of that package, never the case's own file (it holds the removed line)."""
    from bench.crossfile import corpus_cases_in_workspaces
    from decoding.repository.selection import select

    site = tmp_path / "site"
    for name in ("shop", "bank"):
        package = site / name
        package.mkdir(parents=True)
        for i in range(3):
            (package / f"part_{i}.py").write_text(FILLER.replace("helper_", f"{name}_{i}_"))
    (site / "loose.py").write_text(FILLER)  # a module directly in the root: no package, no workspace
    cases, indexes = corpus_cases_in_workspaces(6, seed=0, languages=["python"], corpus=str(site))
    try:
        assert cases and all(x.package.parent == site and x.package.name in ("shop", "bank") for x in cases)
        assert all(x.case.path.startswith("part_") for x in cases)  # relative to its package
        for x in cases:
            assert (x.package / x.case.path).read_text().startswith(x.before)
            assert x.before.endswith(x.case.prefix)
            selection = select(indexes[x.package], x.case.path, "python", x.before, 512)
            assert selection.sections and all(s.path != x.case.path for s in selection.sections)
    finally:
        for index in indexes.values():
            index.close()


def test_bench_corpus_context_runs_each_case_with_and_without_the_context(tiny_model_dir, tmp_path, capsys):
    """`draftwise bench --limit 0 --corpus-context N` end to end on the tiny model: both rows for every
    case, the paired comparison, the table on stdout and the JSON."""
    import json

    from lsp_server.cli import main

    site = tmp_path / "site"
    for name in ("shop", "bank"):
        (site / name).mkdir(parents=True)
        for i in range(3):
            (site / name / f"part_{i}.py").write_text(FILLER.replace("helper_", f"{name}_{i}_"))
    out = tmp_path / "corpus-context.json"
    code = main(["bench", "--target", str(tiny_model_dir), "--weights", "fp32", "--limit", "0", "--corpus-context", "3",
                 "--corpus", str(site), "--languages", "python", "--max-tokens", "4", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())["corpus_context"]
    assert data["rows"] == ["none@fp32", "none@fp32+context"] and len(data["cases"]) == 3
    for row in data["rows"]:
        assert len(data["runs"][row]) == 3
    plain, context = (data["summary"][row] for row in data["rows"])
    assert context["prompt_tokens_median"] > plain["prompt_tokens_median"]  # the other files were shown
    assert data["summary"]["paired"]["cases"] == 3
    assert "Corpus cases in their packages: 3" in capsys.readouterr().out
