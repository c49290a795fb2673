"""The replayed editor: one file typed back through a completion backend, as VS Code or Neovim with
the draftwise clients would do it.

What the editor does, per client (`ClientProfile`):

- every keystroke is a `didChange`; it cancels the request in flight (`$/cancelRequest`) and restarts
  the debounce timer; when the timer fires, the editor asks for an inline completion at the cursor;
- an answer for the document as it still is puts the suggestion on screen;
- both keep a suggestion on screen while the user types along it, and ask again after the debounce
  (the server answers such requests at once from the suggestion); any other change clears it.

The user (see `keystrokes`) takes a suggestion with Tab when all of it is what they were about to
type and it has been on screen long enough to be read; Tab inserts it, and the editor runs the
item's command (`draftwise.accepted`), as the clients do.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from bench.replay.keystrokes import REACTION_S, Keystroke, accepted_text, keystroke_at


@dataclass(frozen=True)
class ClientProfile:
    name: str
    debounce_s: float  # from the last change to the completion request
    keeps_ghost_typing_along: bool  # a typed character that matches the suggestion keeps it shown


# VS Code's own inline-completion debounce (`InlineCompletionsDebounce`, min = max = 50 ms, in
# vscode's inlineCompletionsModel); the draftwise extension adds none of its own.
VSCODE = ClientProfile("vscode", 0.050, True)
# editor-clients/neovim/lua/draftwise/init.lua: `debounce_ms = 75`; ghost.lua keeps a suggestion typed
# along (carry).
NEOVIM = ClientProfile("neovim", 0.075, True)
CLIENTS = {c.name: c for c in (VSCODE, NEOVIM)}


@dataclass
class Document:
    uri: str
    language: str
    text: str
    cursor: int  # offset (code points)
    version: int = 1

    def position(self, offset: int) -> dict:
        """LSP position of an offset, in code points (the replay asks the server for utf-32)."""
        line = self.text.count("\n", 0, offset)
        return {"line": line, "character": offset - (self.text.rfind("\n", 0, offset) + 1)}

    def offset(self, position: dict) -> int:
        start = 0
        for _ in range(position["line"]):
            start = self.text.index("\n", start) + 1
        return start + position["character"]

    def insert(self, text: str) -> tuple[dict, dict]:
        """Insert at the cursor and move it past the text; returns the replaced (empty) range."""
        at = self.position(self.cursor)
        self.text = self.text[:self.cursor] + text + self.text[self.cursor:]
        self.cursor += len(text)
        self.version += 1
        return at, at


@dataclass
class ReplayedSuggestion:
    insert_text: str
    start: int  # offset where the item's range starts
    end: int  # ... and ends (text it would replace)
    command: dict | None  # run after inserting it, as the editor does
    shown_at: float = 0.0  # time.monotonic()
    replaces_right: bool = False  # its range covers text right of the cursor: not plain typing ahead


class Backend(Protocol):
    """What the editor talks to: the draftwise server over LSP, or another completion server."""

    def open(self, doc: Document) -> None: ...
    def change(self, doc: Document, start: dict, end: dict, text: str) -> None: ...
    def request(self, doc: Document) -> Any: ...
    def cancel(self, handle: Any) -> None: ...
    def answer(self, handle: Any, doc: Document, deadline: float) -> tuple[ReplayedSuggestion | None, float] | None: ...
    def accepted(self, suggestion: ReplayedSuggestion) -> None: ...
    def close(self, doc: Document) -> None: ...


@dataclass
class FileResult:
    path: str
    language: str
    client: str
    chars: int  # characters of the region
    typed_chars: int = 0  # ... typed by the user (the rest came from accepted suggestions)
    accepted_chars: int = 0
    shown: int = 0  # suggestions put on screen
    accepted: int = 0
    requests: int = 0
    cancelled: int = 0
    pause_latencies_s: list[float | None] = field(default_factory=list)  # None: nothing showed in the pause
    seconds: float = 0.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["pause_latencies_ms"] = [None if x is None else round(x * 1000, 1) for x in d.pop("pause_latencies_s")]
        d["seconds"] = round(self.seconds, 2)
        return d


@dataclass
class _Pending:
    handle: Any
    version: int


class TypingSession:
    """Types one region back into its document and records what the user saw."""

    def __init__(self, backend: Backend, doc: Document, region: str, plan: list[Keystroke],
                 profile: ClientProfile, result: FileResult, speed: float = 1.0) -> None:
        self.backend, self.doc, self.region, self.plan = backend, doc, region, plan
        self.profile, self.result = profile, result
        self.reaction_s = REACTION_S / speed
        self.pos = 0  # characters of the region in the document
        self.pending: _Pending | None = None
        self.shown: ReplayedSuggestion | None = None
        self.debounce_at = math.inf
        self.next_key_at = math.inf
        self.pause_start: float | None = None
        self.pause_latency: float | None = None

    def run(self) -> FileResult:
        started = time.monotonic()
        self.backend.open(self.doc)
        self._schedule_key(started)
        self.debounce_at = started + self.profile.debounce_s  # the cursor was just placed here
        while self.pos < len(self.region):
            self._step()
        self._cancel_pending()
        self.backend.close(self.doc)
        self.result.seconds = time.monotonic() - started
        return self.result

    def _step(self) -> None:
        deadline = min(self.next_key_at, self.debounce_at)
        if self.pending is not None:
            got = self.backend.answer(self.pending.handle, self.doc, deadline)
            if got is not None:
                self._on_answer(*got)
                return
        else:
            time.sleep(max(0.0, deadline - time.monotonic()))
        now = time.monotonic()
        if now >= self.debounce_at:
            self.debounce_at = math.inf
            self.pending = _Pending(self.backend.request(self.doc), self.doc.version)
            self.result.requests += 1
        elif now >= self.next_key_at:
            self._key_due(now)

    def _on_answer(self, suggestion: ReplayedSuggestion | None, arrived: float) -> None:
        pending, self.pending = self.pending, None
        if suggestion is None or pending.version != self.doc.version:
            return
        suggestion.shown_at = arrived
        suggestion.replaces_right = suggestion.end > self.doc.cursor
        self.shown = suggestion
        self.result.shown += 1
        if self.pause_start is not None and self.pause_latency is None:
            self.pause_latency = max(0.0, arrived - self.pause_start)

    def _key_due(self, now: float) -> None:
        self._end_pause()
        take = self._acceptable(now)
        if take is not None:
            self._accept(take)
        else:
            self._type(self.region[self.pos:self.plan[keystroke_at(self.plan, self.pos)].end])
        self.debounce_at = now + self.profile.debounce_s
        if self.pos < len(self.region):
            self._schedule_key(now)

    def _schedule_key(self, now: float) -> None:
        key = self.plan[keystroke_at(self.plan, self.pos)]
        self.next_key_at = now + key.delay_s
        if key.pause:
            self.pause_start = now
            self.pause_latency = 0.0 if self.shown is not None else None  # still on screen

    def _end_pause(self) -> None:
        if self.pause_start is not None:
            self.result.pause_latencies_s.append(self.pause_latency)
            self.pause_start = self.pause_latency = None

    def _acceptable(self, now: float) -> str | None:
        s = self.shown
        if s is None or now - s.shown_at < self.reaction_s or s.replaces_right:
            return None
        return accepted_text(s.insert_text, self.doc.text[s.start:self.doc.cursor], self.region[self.pos:])

    def _type(self, text: str) -> None:
        self._edit(text)
        self.result.typed_chars += len(text)
        s = self.shown
        typed_along = s is not None and s.insert_text.startswith(self.doc.text[s.start:self.doc.cursor]) \
            and self.doc.cursor - s.start < len(s.insert_text)
        if not (self.profile.keeps_ghost_typing_along and typed_along):
            self.shown = None

    def _accept(self, text: str) -> None:
        suggestion, self.shown = self.shown, None
        self._edit(text)
        self.result.accepted += 1
        self.result.accepted_chars += len(text)
        self.backend.accepted(suggestion)

    def _edit(self, text: str) -> None:
        self._cancel_pending()
        start, end = self.doc.insert(text)
        self.pos += len(text)
        self.backend.change(self.doc, start, end, text)

    def _cancel_pending(self) -> None:
        if self.pending is not None:
            self.backend.cancel(self.pending.handle)
            self.result.cancelled += 1
            self.pending = None
