"""Idle prefill: while the user types, read the prompt the next request at the cursor will have.

After an edit and a short quiet period, the engine extends its KV cache (and a draft model's) with
the prompt of a request at the end of that edit — where typing leaves the cursor. When the editor
then asks (after its own debounce), the request finds most of its prompt read. It is idle work: any
request the user waits for cancels it within one prefill chunk, it stays inside the cache budget
(the KV store evicts as for any request), and it runs only for the document being edited.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable

from lsp_server.config import Settings
from lsp_server.documents import OpenDocument

log = logging.getLogger(__name__)

QUIET_S = 0.04  # shorter than the clients' debounce, so the prompt is read before the request comes


class IdlePrefill:
    def __init__(self, completions, host, settings: Callable[[], Settings], quiet_s: float = QUIET_S) -> None:
        self.completions = completions  # lsp_server.completions.Completions: builds the request
        self.host = host  # lsp_server.engine_host.EngineHost
        self.settings = settings
        self.quiet_s = quiet_s
        self._timer: asyncio.TimerHandle | None = None

    def document_changed(self, doc: OpenDocument) -> None:
        """Every edit restarts the quiet period; only the latest edited document is prepared."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        settings = self.settings()
        if not settings.idle_work or doc.edit_end is None or not settings.serves_language(doc.language_id):
            return
        self._timer = asyncio.get_running_loop().call_later(self.quiet_s, self._prepare, doc, doc.version)

    def _prepare(self, doc: OpenDocument, version: int) -> None:
        self._timer = None
        if doc.version != version or doc.edit_end is None or not self.host.ready:
            return  # edited again (a newer timer runs), or no engine yet
        prefix, suffix = doc.text[:doc.edit_end], doc.text[doc.edit_end:]
        try:
            self.host.prepare(self.completions.request_at(doc, prefix, suffix, self.settings()))
        except Exception:  # idle work must never disturb the server
            log.debug("idle prefill failed for %s", doc.uri, exc_info=True)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
