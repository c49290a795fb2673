"""Idle work while the user types: the suggestion at the cursor, started before the editor asks.

After an edit and a short quiet period, the engine starts on the request the editor will send when
the user stops there — at the end of the edit, where typing leaves the cursor. When the editor asks
(after its own debounce: 50 ms in VS Code, 150 ms in the Neovim plugin), its request is the same
one, so it joins the running job (Engine.submit) instead of starting over: the debounce no longer
adds to the wait. Where the editor will not ask, or will be answered from a shown suggestion
(mid-word, typing along a suggestion), only the prompt is read ahead into the KV caches.

It is idle work: any other request the user waits for cancels it within one forward, the next edit
cancels it, it stays inside the cache budget (the KV store evicts as for any request), and it runs
only for the document being edited.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from lsp_server.config import Settings
from lsp_server.documents import OpenDocument

log = logging.getLogger(__name__)

# Short: most of the clients' debounce is saved. Not zero: an edit that comes as several changes
# (a paste, an auto-closed bracket) starts one job, not one a change.
QUIET_S = 0.02


class IdleWork:
    def __init__(self, completions, host, settings: Callable[[], Settings], quiet_s: float = QUIET_S) -> None:
        self.completions = completions  # lsp_server.completions.Completions: builds the request
        self.host = host  # lsp_server.engine_host.EngineHost
        self.settings = settings
        self.quiet_s = quiet_s
        self._timer: asyncio.TimerHandle | None = None
        self._job = None  # the suggestion started for the last edit (a decoding.jobs.Job)

    def document_changed(self, doc: OpenDocument) -> None:
        """Every edit restarts the quiet period and stops the suggestion started for the edit before
        (the cursor has left it); only the latest edited document gets idle work."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._job is not None:
            self._job.cancel()  # stale, also when the editor's request joined it: that was for the old text
            self._job = None
        settings = self.settings()
        if not settings.idle_work or doc.edit_end is None or not settings.serves_language(doc.language_id):
            return
        self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._start, doc, doc.version)

    def _start(self, doc: OpenDocument, version: int) -> None:
        self._timer = None
        if doc.version != version or doc.edit_end is None or not self.host.ready:
            return  # edited again (a newer timer runs), or no engine yet
        try:
            request, generate = self.completions.idle_request(doc, doc.edit_end)
            if generate:
                self._job = self.host.submit(request, version, idle=True)
            else:
                self.host.prepare(request)
        except Exception:  # idle work must never disturb the server
            log.debug("idle work failed for %s", doc.uri, exc_info=True)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
