"""Idle work's prediction driven directly (lsp_server.prediction.Predictor), without a server: the
engine is a list of idle jobs the test finishes by hand (the Session stands in for the request path,
lsp_server.request_path.RequestPath), and the user's typing is didChange edits to a DocumentStore,
each followed by what IdleWork.document_changed does (follow_typing)."""
from __future__ import annotations

import asyncio

import pytest
from lsprotocol import types

from decoding.api import CompletionRequest, CompletionResult, RequestStats
from decoding.jobs import Job
from lsp_server.config import Settings
from lsp_server.cursor import read_cursor
from lsp_server.documents import DocumentStore
from lsp_server.postprocess import IndentStyle
from lsp_server.prediction import LINKS_AHEAD, Predicted, Predictor
from lsp_server.suggestions import SUPERSEDED

URI = "file:///w/total.py"
BEFORE = "def total(values):\n    result = 0\n    "  # the user stopped typing here
AFTER = "\n    return result\n"
FIRST_LINE = "for v in values:"
SECOND_LINE = "        result += v"

pytestmark = pytest.mark.asyncio


class Session:
    """A document, the predictor, and the idle jobs it submitted (in order): the request path the
    predictor asks for requests, jobs and the indentation."""

    def __init__(self) -> None:
        self.documents = DocumentStore()
        self.doc = self.documents.open(URI, "python", 1, BEFORE + AFTER)
        self.settings = Settings()
        self.jobs: list[Job] = []
        self.ended = 0
        self.predictor = Predictor(self.documents, lambda: self.settings, requests=self)

    @staticmethod
    def request_at(doc, prefix: str, suffix: str) -> CompletionRequest:
        return CompletionRequest(prefix=prefix, suffix=suffix, document=doc.uri)

    def submit(self, request: CompletionRequest, version: int, idle: bool = False) -> Job:
        assert idle, "the prediction's jobs are idle work"
        job = Job(request, version=version, idle=True)
        self.jobs.append(job)
        return job

    @staticmethod
    def indent(doc) -> IndentStyle:
        return IndentStyle()

    def start(self):
        offset = len(BEFORE)
        request = self.request_at(self.doc, self.doc.text[:offset], self.doc.text[offset:])
        return self.predictor.start(self.doc, self.doc.version, request, ended=self.count_ended)

    def count_ended(self, prediction) -> None:
        self.ended += 1

    def type(self, text: str) -> Job | None:
        """Insert text at the cursor (after the last edit) as one didChange; what follow_typing says."""
        offset = self.doc.edit_end if self.doc.edit_end is not None else len(BEFORE)
        at = self.doc.position_at(offset, self.documents.encoding)
        change = types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)
        self.documents.change(URI, self.doc.version + 1, [change])
        return self.predictor.follow_typing(self.doc, self.doc.edit_end)

    def cursor(self):
        at = self.doc.position_at(self.doc.edit_end, self.documents.encoding)
        return read_cursor(self.doc, at, None, self.documents.encoding, IndentStyle())


def finish(job: Job, text: str, stopped: str) -> None:
    job.saw(text)
    job.future.set_result(CompletionResult(text, RequestStats(generated_tokens=len(text), stopped=stopped)))


async def until(condition) -> None:
    for _ in range(200):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the prediction did not get there")


async def test_the_request_after_typing_along_is_answered_with_the_rest_of_the_link():
    s = Session()
    p = s.start()
    assert s.jobs[0].request.prefix == BEFORE and s.jobs[0].request.suffix == AFTER
    assert s.type("f") is s.jobs[0] and s.type("o") is s.jobs[0], "the running link follows the typing"
    assert s.jobs[0].must_begin_with == "fo"
    finish(s.jobs[0], FIRST_LINE, "eos")
    # The model ended its line: the next link is the line after an Enter, as if the user typed it.
    await until(lambda: len(s.jobs) == 2)
    assert p.text == FIRST_LINE and s.jobs[1].request.prefix == BEFORE + FIRST_LINE + "\n"
    answer = await s.predictor.answer(s.cursor())
    assert answer == Predicted("r v in values:", RequestStats(generated_tokens=16, stopped="eos").to_dict())


async def test_a_link_cut_short_goes_on_from_its_end_on_the_same_line():
    s = Session()
    p = s.start()
    finish(s.jobs[0], "for v in", "max_tokens")
    await until(lambda: len(s.jobs) == 2)
    assert s.jobs[1].request.prefix == BEFORE + "for v in" and p.lead == ""


async def test_typing_something_else_leaves_the_prediction():
    s = Session()
    s.start()
    s.jobs[0].saw("for")
    assert s.type("w") is None  # IdleWork stops it and starts idle work at the new cursor
    assert not s.predictor.covers(s.doc, s.doc.edit_end)


async def test_the_running_link_stops_itself_at_the_first_text_that_differs_from_the_typing():
    s = Session()
    s.start()
    assert s.type("w") is s.jobs[0], "nothing generated yet: the benefit of the doubt"
    s.jobs[0].saw("f")
    assert s.jobs[0].diverged and s.jobs[0].cancel_token.cancelled


async def test_a_request_at_the_end_of_a_line_the_model_ended_waits_for_it_and_gets_nothing_to_show():
    s = Session()
    p = s.start()
    s.jobs[0].saw("for v")
    s.type(FIRST_LINE)
    answer = asyncio.ensure_future(s.predictor.answer(s.cursor()))
    await asyncio.sleep(0)
    assert not answer.done(), "the cursor is past what the running link has written"
    finish(s.jobs[0], FIRST_LINE, "eos")
    # The engine would say nothing more there: asking it would only cancel the line after the Enter.
    assert await answer == Predicted("")
    assert p.running and p.lead == "\n"
    # The user types the Enter and the editor its indentation: the line after is on screen at once.
    assert s.type("\n    ") is s.jobs[1] and s.jobs[1].must_begin_with == "    "
    finish(s.jobs[1], SECOND_LINE, "eos")
    answer = await s.predictor.answer(s.cursor())
    assert answer.text == "    result += v"


async def test_the_chain_stays_links_ahead_of_the_cursor_and_goes_on_when_the_user_types_into_it():
    s = Session()
    p = s.start()
    finish(s.jobs[0], FIRST_LINE, "eos")
    await until(lambda: len(s.jobs) == 2)
    finish(s.jobs[1], SECOND_LINE, "eos")
    await until(lambda: s.ended == 1)
    assert LINKS_AHEAD == 2 and len(s.jobs) == 2, "two lines ahead of the cursor: it waits"
    assert not p.running and p.text == FIRST_LINE + "\n" + SECOND_LINE
    assert s.type(FIRST_LINE + "\n") is None, "nothing runs to follow the typing"
    assert s.predictor.covers(s.doc, s.doc.edit_end)
    assert s.predictor.extend(s.doc, s.doc.edit_end), "one line left ahead: the next is started"
    assert s.jobs[2].request.prefix == BEFORE + p.text + "\n"
    assert s.jobs[2].must_begin_with == ""


async def test_an_answer_for_a_document_edited_since_the_request_is_stale():
    s = Session()
    s.start()
    s.type("fo")
    finish(s.jobs[0], FIRST_LINE, "eos")
    cursor = s.cursor()
    s.type("r")
    assert await s.predictor.answer(cursor) is SUPERSEDED


async def test_stop_cancels_the_running_link():
    s = Session()
    s.start()
    job = s.jobs[0]
    assert s.predictor.owns(job)
    s.predictor.stop()
    assert job.cancel_token.cancelled and not job.diverged
    finish(job, "", "cancelled")
    await until(lambda: s.ended == 1)
    assert s.type("f") is None and await s.predictor.answer(s.cursor()) is None, "nothing to answer from"
