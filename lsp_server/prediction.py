"""Idle work's prediction: the suggestion computed where the user last stopped typing, before the
editor asks, kept running while they type along it and grown a link at a time ahead of them.

lsp_server/idle_work.py decides when idle work starts; this module owns what the prediction
computes, how far it runs, and how a request at the user's next pause is answered from it.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Callable

from decoding.api import CompletionRequest
from decoding.jobs import Job
from decoding.agreement import agrees, remains, typed_since
from lsp_server.config import Settings
from lsp_server.cursor import Cursor, cursor_line, line_break_of
from lsp_server.documents import DocumentStore, OpenDocument
from lsp_server.postprocess import shape
from lsp_server.request_path import RequestPath
from lsp_server.suggestions import SUPERSEDED, Superseded

log = logging.getLogger(__name__)

CUT_SHORT = ("time_limit", "max_tokens")  # stop reasons of a suggestion the model had more to say after
MODEL_ENDED = ("stop_rule", "eos")  # stop reasons of a suggestion the model (or a stop rule) ended

# A prediction grows a line at a time while the user types along it: it keeps this many finished
# links from the one the cursor is in to its end (the line being typed and the one after the Enter).
LINKS_AHEAD = 2


@dataclass
class Prediction:
    """The suggestion idle work computes at the cursor where the user last stopped typing. While the
    user goes on typing what it says, it keeps running, and the request at their next pause is
    answered from it (Predictor.answer); otherwise it is stopped.

    It is a chain of links, each computed in idle time as if the user had typed the text so far, so
    the next suggestion is ready when they get there. The time cap (maxTimeMs) ends a suggestion at a
    line end although the model had more to say (as maxTokens may): the next link goes on from there.
    Where the model itself ended the suggestion at the end of its line, the next link is the line
    after an Enter there: the request after the user's Enter (and the editor's indentation) is
    answered from it at once. Each link is the suggestion the editor would get at its start; a
    request is answered with the rest of the link the cursor is in."""

    doc: OpenDocument
    version: int  # the document version it was started for
    prefix: str
    suffix: str
    job: Job  # the running link's job, or the last link's
    ended: Callable[["Prediction"], None]  # told each time its task is over
    task: asyncio.Task | None = None  # awaits the links and adds their text
    text: str = ""  # the finished links' text, as the editor would show it at `prefix`, with their leads
    ends: list[int] = field(default_factory=list)  # where each finished link ends in `text`
    starts: list[int] = field(default_factory=list)  # where each finished link's suggestion starts (after its lead)
    stats: list[dict] = field(default_factory=list)  # each finished link's engine stats (the statusline's timing)
    # How the next link starts after `text`: "" where the last link was cut short (CUT_SHORT: the
    # model had more to say), a line break where the model ended it at the end of its line; None: no
    # next link. `lead` is the running link's: typed by the user, not part of its suggestion.
    next_lead: str | None = None
    lead: str = ""
    _grown: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def typed(self, prefix: str, suffix: str) -> str | None:
        """What the user typed since it started, if the document reads prefix + suffix by that alone."""
        return typed_since(self.prefix, self.suffix, prefix, suffix)

    def agrees(self, typed: str) -> bool:
        """The typing agrees with what is generated so far. A running link is given the benefit of
        the doubt for what it has not generated yet: it stops itself at its first token that
        disagrees (Job.expect). Not a job whose text comes only at its end (a remote engine's)."""
        so_far = self.text + (self.lead + self.job.text_so_far if self.running else "")
        return agrees(so_far, typed) and (bool(so_far) or self.job.tells_text)

    def link_at(self, typed: str) -> int | None:
        """Which finished link the user is in after typing `typed` (0-based); None past them, or
        where they have not typed its lead yet."""
        k = next((k for k, end in enumerate(self.ends) if len(typed) < end), None)
        return k if k is not None and len(typed) >= self.starts[k] else None

    def ended_line_at(self, typed: str) -> bool:
        """The user has typed a link to its end, where the model ended the suggestion at the end of
        its line (the next link, after a line break, is the line after an Enter)."""
        n = len(typed)
        if n == len(self.text):
            return bool(self.lead if self.running else self.next_lead)
        return any(end == n and start > n for end, start in zip(self.ends, self.starts[1:]))

    def wants_link(self, typed: str) -> bool:
        """Another link is worth computing: there is one to compute, and the user has come within
        LINKS_AHEAD links of the end (of links with text: the model may end a line with nothing to say)."""
        ahead = sum(end > len(typed) and end > start for start, end in zip(self.starts, self.ends))
        return self.next_lead is not None and ahead < LINKS_AHEAD

    def add_link(self, text: str, next_lead: str | None, stats: dict) -> None:
        self.starts.append(len(self.text) + len(self.lead))
        self.text += self.lead + text
        self.ends.append(len(self.text))
        self.stats.append(stats)
        self.next_lead, self.lead = next_lead, ""
        self.grew()

    def grew(self) -> None:
        """Wake whoever waits for the next link (or for the end)."""
        self._grown.set()
        self._grown = asyncio.Event()

    async def next_link(self) -> None:
        """Until a link is added or the chain stops (a cancelled waiter leaves it running)."""
        await self._grown.wait()


@dataclass(frozen=True)
class Predicted:
    """What the prediction has for a request: the rest of the link the cursor is in, and that link's
    engine stats (the statusline's timing); "" and None where the user typed a link to the end of the
    line where the model ended it."""

    text: str
    stats: dict | None = None


class Predictor:
    """Owns idle work's latest prediction: starts it, adds each link as it finishes and starts the next
    while the user types along it, answers a request from it, and stops it."""

    def __init__(self, documents: DocumentStore, settings: Callable[[], Settings], requests: RequestPath) -> None:
        self.documents = documents
        self.settings = settings
        self.requests = requests  # each link's request and idle job, and the indentation it is shaped to
        self.latest: Prediction | None = None  # idle work's latest suggestion

    def start(self, doc: OpenDocument, version: int, request: CompletionRequest,
              ended: Callable[[Prediction], None]) -> Prediction | None:
        """Start idle work's suggestion for `request` (TypingAlong.idle_request); `ended` is called each
        time its task is over (finished, stopped, or waiting for the user to come within LINKS_AHEAD
        links of its end: extend)."""
        job = self.requests.submit(request, version, idle=True)
        if job is None:
            return None
        self.latest = prediction = Prediction(doc, version, request.prefix, request.suffix, job, ended)
        self._follow_links(prediction)
        return prediction

    def extend(self, doc: OpenDocument, offset: int) -> bool:
        """Idle work with the cursor at `offset` along the stopped prediction: its next link, if the
        user has come within LINKS_AHEAD links of its end. Whether one was started."""
        p = self.latest
        typed = self._typed_along(doc, doc.text[:offset], doc.text[offset:])
        if typed is None or p.running or not p.wants_link(typed) or not self._next_link(p, typed):
            return False
        self._follow_links(p)
        return True

    def covers(self, doc: OpenDocument, offset: int) -> bool:
        """The user typed along the latest prediction since it started, and it has more to show at
        `offset` (or, still running, agrees with the typing so far): it answers the request at the
        next pause, nothing new needs computing."""
        return self._typed_along(doc, doc.text[:offset], doc.text[offset:]) is not None

    def follow_typing(self, doc: OpenDocument, offset: int) -> Job | None:
        """After an edit: the job of the running link if the prediction covers the new cursor, told
        what the user typed into it (it stops itself at a token that differs: Job.expect); else None."""
        typed = self._typed_along(doc, doc.text[:offset], doc.text[offset:])
        if typed is None or not self.latest.running:
            return None
        p = self.latest
        p.job.expect(typed[len(p.text) + len(p.lead):])  # the running link's suggestion starts there
        return p.job

    def owns(self, job: Job) -> bool:
        """`job` is the latest prediction's link: the running one, or its last."""
        return self.latest is not None and job is self.latest.job

    def stop(self) -> None:
        if self.latest is not None and self.latest.running:
            self.latest.job.cancel()

    async def answer(self, cursor: Cursor) -> Predicted | Superseded | None:
        """The rest of the link of the prediction that the user typed into since it started (waiting
        for that link to finish); "" where they typed a link to the end of the line where the model
        ended it (the next link is the line after an Enter); else None."""
        typed = self._typed_along(cursor.doc, cursor.prefix, cursor.suffix)
        if typed is None:
            return None
        p, waited = self.latest, time.perf_counter()
        while p.running and len(typed) >= len(p.text) + len(p.lead):
            await p.next_link()  # a cancelled request leaves the prediction running
        if self.documents.is_stale(cursor.doc, cursor.version):
            return SUPERSEDED
        if remains(p.text, typed) is None:
            return None
        link = p.link_at(typed)
        if link is None:
            # Where the model ended its line the engine would say nothing more: asking it again would
            # only cancel the next link, the line after the user's Enter.
            return Predicted("") if p.ended_line_at(typed) else None
        log.info("request: answered from idle work's suggestion (%d characters typed along it, link %d of %d; "
                 "waited %.0f ms)", len(typed), link + 1, len(p.ends), (time.perf_counter() - waited) * 1000)
        return Predicted(p.text[len(typed):p.ends[link]], p.stats[link])  # the rest of the link the cursor is in

    def _typed_along(self, doc: OpenDocument, prefix: str, suffix: str) -> str | None:
        """What the user typed since the latest prediction started, if that covers the cursor at
        prefix|suffix; else None."""
        p = self.latest
        if p is None or p.doc is not doc or (not p.ends and not p.running):
            return None
        typed = p.typed(prefix, suffix)
        if typed is None or not p.agrees(typed) or not (typed or p.ends):
            return None  # (at its start while its first link runs: a request there joins that job)
        return typed if p.running or len(typed) < len(p.text) or p.ended_line_at(typed) else None

    def _follow_links(self, p: Prediction) -> None:
        p.task = asyncio.ensure_future(self._links(p))
        p.task.add_done_callback(lambda _: p.ended(p))

    async def _links(self, p: Prediction) -> None:
        """The prediction's task: add each link's text when it is done, and start the next one while
        the user is within LINKS_AHEAD links of the end."""
        try:
            while await self._add_link(p):
                typed = self._typed_now(p)
                if typed is None or not p.wants_link(typed) or not self._next_link(p, typed):
                    return
        finally:
            p.grew()

    async def _add_link(self, p: Prediction) -> bool:
        """Await the running link and add its text as the editor would show it at the link's start."""
        try:
            result = await p.job
        except Exception:
            log.debug("idle work failed for %s", p.doc.uri, exc_info=True)
            return False
        if result.stats.stopped == "cancelled":
            return False
        start = p.prefix + p.text + p.lead
        line_before, line_after = cursor_line(start, p.suffix)
        edit = shape(result.text, line_before, line_after, self.requests.indent(p.doc))
        text = edit.text if edit is not None else ""
        next_lead = None  # only a link that leaves the rest of the line as it is can be taken as typed
        if edit is None or edit.replace == 0:
            end_before, end_after = cursor_line(start + text, p.suffix)
            if result.stats.stopped in CUT_SHORT and text:
                next_lead = ""
            elif result.stats.stopped in MODEL_ENDED and end_before.strip() and not end_after.strip():
                # The model ended the suggestion at the end of its line (even with nothing to say):
                # the user's next key is most likely Enter.
                next_lead = line_break_of(p.prefix)
        if not text and next_lead is None:
            return False
        p.add_link(text, next_lead, stats=result.stats.to_dict())
        return True

    def _next_link(self, p: Prediction, typed: str) -> bool:
        """Submit the prediction's next link: the request at its end (after its lead), as if the user
        had typed it."""
        doc, lead = p.doc, p.next_lead
        if self.documents.is_stale(doc, doc.version) or not self.settings().idle_work or not agrees(p.text + lead, typed):
            return False
        request = self.requests.request_at(doc, p.prefix + p.text + lead, p.suffix)
        job = self.requests.submit(request, doc.version, idle=True)
        if job is None:
            return False
        job.expect(typed[len(p.text) + len(lead):])  # typed past the finished links already
        p.job, p.lead = job, lead
        return True

    def _typed_now(self, p: Prediction) -> str | None:
        """What the user has typed along the prediction so far (None: they left it, or it is gone)."""
        doc = p.doc
        if self.latest is not p or self.documents.is_stale(doc, doc.version):  # closed (or opened anew)
            return None
        if doc.version == p.version:
            return ""
        if doc.edit_end is None:
            return None
        typed = p.typed(doc.text[:doc.edit_end], doc.text[doc.edit_end:])
        return typed if typed is not None and agrees(p.text, typed) else None

