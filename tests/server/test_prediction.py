"""Idle work's prediction as a chain of links (lsp_server.prediction.Prediction): which link a request
is in, where a line the model ended leaves the user, and when the next link is worth computing."""
from __future__ import annotations

from lsp_server.prediction import LINKS_AHEAD, Prediction


def finished(*links: tuple[str, str, str | None]) -> Prediction:
    """A prediction whose links (lead, text, next lead) are all finished; nothing runs."""
    p = Prediction(doc=None, version=1, prefix="        if not line:\n            conti", suffix="\n",
                   job=None, ended=lambda _: None)
    for lead, text, next_lead in links:
        p.lead = lead  # as Predictor._next_link sets it for the running link
        p.add_link(text, next_lead, stats={})
    return p


def test_a_line_the_model_ended_is_followed_by_the_line_after_an_enter():
    p = finished(("", "ue", "\n"), ("\n", "        result.append(line)", ""))
    assert p.text == "ue\n        result.append(line)"
    assert p.starts == [0, 3] and p.ends == [2, len(p.text)]
    assert p.link_at("u") == 0
    # At the end of the line the model ended: no link to answer from, and nothing to ask the engine.
    assert p.link_at("ue") is None and p.ended_line_at("ue")
    # After the Enter, and after the editor's indentation: the line after.
    assert p.link_at("ue\n") == 1 and p.link_at("ue\n        ") == 1
    assert not p.ended_line_at("ue\n") and not p.ended_line_at("u")


def test_a_line_cut_short_goes_on_from_its_end():
    p = finished(("", "ue", ""), ("", "\n        result.append(line)", None))
    assert p.link_at("ue") == 1  # the next link starts where the first ends: it answers there
    assert not p.ended_line_at("ue") and not p.ended_line_at(p.text)


def test_an_empty_link_at_a_line_end_does_not_count_as_a_line_ahead():
    # Cut short by the time cap, then nothing more from the model at the line end: the line after
    # the Enter is still wanted while the user types the first line.
    p = finished(("", "ue", ""), ("", "", "\n"))
    assert LINKS_AHEAD == 2 and p.wants_link("")
    assert p.link_at("ue") is None and p.ended_line_at("ue")
    p.lead = "\n"
    p.add_link("        result.append(line)", "", stats={})
    assert not p.wants_link(""), "two lines ahead of the cursor"
    assert p.wants_link("ue\n    ")


def test_no_next_link_where_the_model_ended_mid_line():
    p = finished(("", "fill(text)", None))
    assert not p.wants_link("fill(text)") and not p.ended_line_at("fill(text)")
