"""Idle work while the user types: the suggestion at the cursor, started before the editor asks.

After an edit and a short quiet period, the engine starts on the request the editor will send when
the user stops there — at the end of the edit, where typing leaves the cursor. When the editor asks
(after its own debounce: 50 ms in VS Code, 75 ms in the Neovim plugin), its request is the same
one, so it joins the running job (Engine.submit) instead of starting over: the debounce no longer
adds to the wait. Where the editor will not ask, or will be answered from a shown suggestion
(mid-word, typing along a suggestion), only the prompt is read ahead into the KV caches.

The user often goes on typing what that suggestion says (the end of a word, the `)` and the Enter
of a line). Then it is not stopped: it runs on, and the request at the next pause is answered from
its rest (lsp_server/prediction.py, behind TypingAlong: follow_typing, answer), with a head start of
every keystroke typed along it. It stops itself at the first token that differs from the typing
(Job.expect), and idle work starts again where the cursor is. Where the time cap ended it at a line
end, the line after is computed next, as if the user had typed it; where the model ended it at the
end of its line, the next is the request after an Enter there (`Prediction`): after an Enter along
the prediction, the next line is on screen as soon as the editor asks.

It is idle work: any other request the user waits for cancels it within one forward, an edit that
leaves it cancels it, it stays inside the cache budget (the KV store evicts as for any request), and
it runs only for the document being edited.

Before the first edit, a just-opened document is read ahead: the prompt of a cursor at its end, whose
prefix (the file from a step line on, decoding/prompt.py) every cursor whose prompt starts at the same
line reuses up to its own line: all of them in a file that fits the prompt budget. An editor that says
where its cursor rests (`draftwise/cursor`, sent by the VS Code and Neovim clients when the cursor
stops moving) gets the suggestion there started as after an edit: the first request after opening a
file and looking for the place to type finds its prompt read, or its answer ready. Each document is
read ahead once a version and place; the engine being still loading, the latest is read once it is
ready.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from lsp_server.config import Settings
from lsp_server.documents import DocumentStore, OpenDocument
from lsp_server.engine_host import EngineHost
from lsp_server.prediction import Prediction
from lsp_server.typing_along import TypingAlong

log = logging.getLogger(__name__)

# Short: most of the clients' debounce is saved. Not zero: an edit that comes as several changes
# (a paste, an auto-closed bracket) starts one job, not one a change.
QUIET_S = 0.02


class IdleWork:
    def __init__(self, typing_along: TypingAlong, documents: DocumentStore, host: EngineHost,
                 settings: Callable[[], Settings], quiet_s: float = QUIET_S) -> None:
        self.typing_along = typing_along  # the requests idle work computes ahead, and its prediction
        self.documents = documents
        self.host = host
        self.settings = settings
        self.quiet_s = quiet_s
        self._timer: asyncio.Handle | None = None
        self._read: dict[str, tuple[int, int, bool]] = {}  # uri -> (version, offset, generate) last done
        self._waiting: tuple[OpenDocument, int, bool, int] | None = None  # for the engine: (…, version)
        self.counts = {"opened": 0, "cursorHints": 0}  # read-aheads of just-opened documents, cursor hints acted on

    def document_opened(self, doc: OpenDocument) -> None:
        """A just-opened document: its prompt at the end of the file, read ahead (no cursor is known)."""
        if self._wanted(doc):
            self._ahead(doc, len(doc.text), generate=False)

    def cursor_rested(self, doc: OpenDocument, offset: int) -> None:
        """The editor's cursor rests at `offset` (draftwise/cursor): start the suggestion there, as after
        an edit (or only read its prompt, where the editor would not ask there)."""
        if self._wanted(doc) and not self.typing_along.prediction_covers(doc, offset):
            self._ahead(doc, offset, generate=True)

    def engine_ready(self) -> None:
        """The engine finished loading: the read-ahead that waited for it."""
        waiting, self._waiting = self._waiting, None
        if waiting is None:
            return
        doc, offset, generate, version = waiting
        # still open and still wanted (settings may have turned idle work off while the model loaded)
        if self.documents.is_stale(doc, doc.version) or not self._wanted(doc):
            return
        if doc.version == version:
            self._ahead(doc, offset, generate)
        elif doc.edit_end is not None:  # edited since (the offset points into an older text): where typing is
            self._start(doc, doc.version)
        else:
            self._ahead(doc, len(doc.text), generate=False)

    def _wanted(self, doc: OpenDocument) -> bool:
        settings = self.settings()
        return settings.idle_work and settings.serves_language(doc.language_id)

    def _ahead(self, doc: OpenDocument, offset: int, generate: bool) -> None:
        if not self.host.ready:
            self._waiting = (doc, offset, generate, doc.version)
            return
        if self._read.get(doc.uri) == (doc.version, offset, generate):
            return  # read (or started) there already, and nothing changed since
        self._read[doc.uri] = (doc.version, offset, generate)
        try:
            request, worth_generating = self.typing_along.idle_request(doc, offset)
            if generate and worth_generating:
                self.typing_along.start_prediction(doc, doc.version, request, self._prediction_ended)
            else:
                self.host.prepare(request)
            self.counts["cursorHints" if generate else "opened"] += 1
        except Exception:  # idle work must never disturb the server
            log.debug("read-ahead failed for %s", doc.uri, exc_info=True)

    def document_closed(self, uri: str) -> None:
        self._read.pop(uri, None)
        if self._waiting is not None and self._waiting[0].uri == uri:
            self._waiting = None

    def document_changed(self, doc: OpenDocument):
        """Every edit restarts the quiet period. The suggestion started for an earlier edit goes on
        while the user types what it says (the request at their next pause is answered from it):
        its job is returned, for the engine to keep even where an editor's request joined it.
        Otherwise it stops (the cursor has left it). Only the latest edited document gets idle work."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        settings = self.settings()
        if not settings.idle_work or doc.edit_end is None or not settings.serves_language(doc.language_id):
            self.typing_along.stop_prediction()
            return None
        if not self.host.ready:  # the latest edit is where the user will ask first: started once loaded
            self._waiting = (doc, doc.edit_end, True, doc.version)
            return None
        running_along = self.typing_along.follow_typing(doc, doc.edit_end)
        if running_along is not None:
            return running_along
        self.typing_along.stop_prediction()  # the typing left it (a finished one stays to answer from)
        self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._start, doc, doc.version)
        return None

    def _start(self, doc: OpenDocument, version: int) -> None:
        self._timer = None
        if self.documents.is_stale(doc, version) or doc.edit_end is None or not self.host.ready:
            return  # edited again (a newer timer runs), closed, or no engine yet
        try:
            read_ahead = self.typing_along.predict_at(doc, doc.edit_end, self._prediction_ended)
            if read_ahead is not None:  # nothing worth computing there: its prompt only
                self.host.prepare(read_ahead)
        except Exception:  # idle work must never disturb the server
            log.debug("idle work failed for %s", doc.uri, exc_info=True)

    def _prediction_ended(self, prediction: Prediction) -> None:
        """The user typed on along a prediction while it ran: now idle work moves to where they are
        (its next link, or a prompt read ahead, where the prediction still covers the cursor; else a
        new prediction)."""
        doc = prediction.doc
        if prediction.job.cancel_token.cancelled and not prediction.job.diverged:
            return  # stopped by an edit (which started idle work of its own) or by a request
        edited_since = doc.version != prediction.version and not self.documents.is_stale(doc, doc.version)
        if (self._timer is None and edited_since and self.typing_along.is_latest_prediction(prediction)
                and self.settings().idle_work):
            self._timer = asyncio.get_running_loop().call_soon(self._start, doc, doc.version)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.typing_along.stop_prediction()
