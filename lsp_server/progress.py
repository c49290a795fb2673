"""Work-done progress (`$/progress` begin/report/end) for model loading, when the client supports it."""
from __future__ import annotations

import logging
import uuid

from lsprotocol import types
from pygls.lsp.server import LanguageServer

log = logging.getLogger(__name__)


class LoadProgress:
    """One server-initiated progress bar. Every method is a no-op when the client did not announce
    `window.workDoneProgress`, or refused to create the token."""

    def __init__(self, server: LanguageServer, title: str) -> None:
        self._server = server
        self._title = title
        self._token: str | None = None
        self._percentage = 0

    def _client_supports_it(self) -> bool:
        # Before initialize pygls has no client capabilities at all (the attribute is missing).
        caps = getattr(self._server.protocol, "client_capabilities", None)
        return bool(caps and caps.window and caps.window.work_done_progress)

    async def begin(self, message: str) -> None:
        if not self._client_supports_it():
            return
        token = f"draftwise-load-{uuid.uuid4().hex[:8]}"
        try:
            await self._server.work_done_progress.create_async(token)
        except Exception as err:  # the client may refuse; loading goes on without a progress bar
            log.info("client refused a progress token (%s); loading without progress", err)
            return
        self._token = token
        self._server.work_done_progress.begin(token, types.WorkDoneProgressBegin(
            title=self._title, message=message, percentage=0, cancellable=False))

    def report(self, message: str, fraction: float | None) -> None:
        if self._token is None:
            return
        if fraction is not None:
            # Clients draw a bar that should not move backwards.
            self._percentage = max(self._percentage, min(100, int(round(fraction * 100))))
        self._server.work_done_progress.report(self._token, types.WorkDoneProgressReport(
            message=message, percentage=self._percentage, cancellable=False))

    def end(self, message: str) -> None:
        if self._token is None:
            return
        self._server.work_done_progress.end(self._token, types.WorkDoneProgressEnd(message=message))
        self._token = None
