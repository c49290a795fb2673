"""The replayed editor against a scripted backend: debounce, cancellation, display, Tab."""
from __future__ import annotations

import random
import time

from bench.replay.editor import NEOVIM, VSCODE, Document, FileResult, ReplayedSuggestion, TypingSession
from bench.replay.keystrokes import plan_keystrokes
from bench.replay.runs import summarize

PREFIX = "def f(x):\n    "
REGION = "y = x + 1\n    z = y * 2\n    return z"
SUFFIX = "\n\nprint(f(1))\n"
SPEED = 8.0  # pauses of about 0.1-0.3 s


class ScriptedBackend:
    """Answers after `delay_s` with the next `ahead` characters the user will type (or a wrong text)."""

    def __init__(self, delay_s: float, ahead: int = 6, wrong: bool = False) -> None:
        self.delay_s, self.ahead, self.wrong = delay_s, ahead, wrong
        self.requests: dict[int, tuple[float, str, int]] = {}
        self.cancelled: list[int] = []
        self.accepted_items: list[ReplayedSuggestion] = []
        self.changes: list[str] = []

    def open(self, doc): self.opened = doc.text
    def close(self, doc): self.closed = doc.text
    def change(self, doc, start, end, text): self.changes.append(text)
    def cancel(self, handle): self.cancelled.append(handle)
    def accepted(self, suggestion): self.accepted_items.append(suggestion)

    def request(self, doc):
        handle = len(self.requests)
        typed = doc.text[len(PREFIX):doc.cursor]
        rest = REGION[len(typed):][:self.ahead]
        self.requests[handle] = (time.monotonic() + self.delay_s, "#" + rest if self.wrong else rest, doc.cursor)
        return handle

    def answer(self, handle, doc, deadline):
        ready_at, text, cursor = self.requests[handle]
        if ready_at > deadline:
            time.sleep(max(0.0, deadline - time.monotonic()))
            return None
        time.sleep(max(0.0, ready_at - time.monotonic()))
        return (ReplayedSuggestion(text, cursor, cursor, {"command": "draftwise.accepted"}) if text else None), ready_at


def replay(backend, profile) -> tuple[FileResult, Document]:
    doc = Document("file:///w/f.py", "python", PREFIX + SUFFIX, len(PREFIX))
    plan = plan_keystrokes(REGION, random.Random(5), SPEED)
    result = FileResult("f.py", "python", profile.name, len(REGION))
    return TypingSession(backend, doc, REGION, plan, profile, result, SPEED).run(), doc


def test_the_user_takes_suggestions_that_are_what_they_type_next():
    backend = ScriptedBackend(delay_s=0.01)
    result, doc = replay(backend, NEOVIM)
    assert backend.closed == PREFIX + REGION + SUFFIX  # the document ends as the file was
    assert result.accepted >= 1 and result.accepted == len(backend.accepted_items)
    assert result.accepted <= result.shown
    assert result.typed_chars + result.accepted_chars == len(REGION)
    assert all(item.command == {"command": "draftwise.accepted"} for item in backend.accepted_items)
    seen = [x for x in result.pause_latencies_s if x is not None]
    # Nothing new shows before the debounce fires; 0: a suggestion typed along was still on screen.
    assert seen and all(x == 0.0 or x >= NEOVIM.debounce_s for x in seen)
    assert any(x >= NEOVIM.debounce_s for x in seen)
    figures = summarize([result], compute_s=1.0)
    assert 0 < figures["chars_saved_share"] <= 1 and 0 < figures["accepted_share"] <= 1
    assert figures["compute_s_per_char"] == round(1.0 / len(REGION), 4)


def test_wrong_suggestions_are_shown_but_never_taken():
    backend = ScriptedBackend(delay_s=0.01, wrong=True)
    result, _ = replay(backend, VSCODE)
    assert result.shown >= 1 and result.accepted == 0 and result.accepted_chars == 0
    assert result.typed_chars == len(REGION)
    assert backend.changes and "".join(backend.changes) == REGION


def test_answers_slower_than_the_pauses_are_cancelled_and_never_shown():
    backend = ScriptedBackend(delay_s=5.0)
    result, _ = replay(backend, VSCODE)
    assert result.shown == 0 and result.requests >= 1
    assert result.cancelled == result.requests  # every keystroke cancels the request in flight
    assert result.pause_latencies_s and all(x is None for x in result.pause_latencies_s)
    figures = summarize([result], compute_s=None)
    assert figures["shown_within_1s_share"] == 0 and figures["pause_to_suggestion_ms_p50"] is None
