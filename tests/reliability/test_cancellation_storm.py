"""Cancellation storm: completion requests at typing speed, with edits and `$/cancelRequest`s between
them, against the real server (through the introspection driver, which adds a read-only request that
reports the server's tasks, threads and tables).

Each keystroke is a `didChange` (an insertion, or a backspace) followed by an inline completion
request; a quarter of the requests are cancelled by the client a moment later, and most of the rest
are overtaken by the next keystroke (the engine then stops them itself). Forwards are slowed down
(DRAFTWISE_TEST_FORWARD_DELAY_MS) so that generations are still running when the next key arrives,
as with a real model.

Afterwards: every request was answered exactly once (a result, or RequestCancelled); the server's
copy of the document is exactly what was typed; memory stayed within a stated bound; threads and
asyncio tasks are back where they started; nothing is left queued or in flight; and the last request,
asked again on a fresh document with the same text, gets the answer a calm request gets.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field

import psutil
import pytest

from reliability_support import FIGURES, tiny_args

QUICK_REQUESTS = 150
FULL_REQUESTS = 1000
WARMUP_KEYS = 20
FORWARD_DELAY_MS = 10
MAX_TOKENS = 16
KEY_INTERVAL_S = (0.015, 0.08)  # 12 to 65 keys a second: a fast typist's bursts
CANCEL_SHARE = 0.25
# RSS may grow this much over the storm: caches are bounded (KV store budget, suggestion memory,
# type-ahead memory), so growth beyond allocator noise means something keeps every request.
RSS_BOUND_MIB = {QUICK_REQUESTS: 48, FULL_REQUESTS: 64}
THREAD_SLACK = 2
POOL_MAX = min(32, (os.cpu_count() or 1) + 4)  # concurrent.futures.ThreadPoolExecutor's default size
REQUEST_CANCELLED = -32800
INTROSPECT = "draftwiseTest/introspect"

PREAMBLE = "# stack.py — 中文 comment, and an emoji 😀 before the cursor\nimport sys\n\n"
TRAILER = "\n\nif __name__ == \"__main__\":\n    main(sys.argv)\n"
PROGRAM = (
    "class Stack:\n"
    "    \"\"\"LIFO stack — 栈 (with a 🧱 in the docstring).\"\"\"\n\n"
    "    def __init__(self):\n"
    "        self.items = []\n\n"
    "    def push(self, item):\n"
    "        self.items.append(item)\n\n"
    "    def pop(self):\n"
    "        if not self.items:\n"
    "            raise IndexError(\"pop from empty stack 😢\")\n"
    "        return self.items.pop()\n\n"
    "    def peek(self):\n"
    "        return self.items[-1] if self.items else None\n\n"
    "    def __len__(self):\n"
    "        return len(self.items)\n\n\n"
    "def main(argv):\n"
    "    s = Stack()\n"
    "    for word in argv[1:]:\n"
    "        s.push(word)  # 単語\n"
    "    while s:\n"
    "        print(s.pop())\n"
)


def utf16_position(text: str, offset: int) -> dict:
    line_start = text.rfind("\n", 0, offset) + 1
    return {"line": text.count("\n", 0, offset),
            "character": len(text[line_start:offset].encode("utf-16-le")) // 2}


class Typist:
    """The document as the client has it, and the keystrokes that change it: the program typed at a
    cursor between a preamble and a trailer, with typos fixed by backspace and the odd correct
    character deleted and typed again."""

    def __init__(self, rng: random.Random, uri: str) -> None:
        self.rng = rng
        self.uri = uri
        self.text = PREAMBLE + TRAILER
        self.cursor = len(PREAMBLE)
        self.version = 1
        self.typed = 0  # characters of the program typed so far
        self.typo = False  # the character before the cursor is a typo

    def keystroke(self) -> dict:
        """Apply one key to the local text; returns the didChange params that say the same."""
        if self.typo or (self.typed and self.rng.random() < 0.04):
            # Backspace: after a typo, or now and then; in UTF-16 an emoji is two units wide.
            start = utf16_position(self.text, self.cursor - 1)
            end = utf16_position(self.text, self.cursor)
            self.text = self.text[:self.cursor - 1] + self.text[self.cursor:]
            self.cursor -= 1
            if self.typo:
                self.typo = False
            else:
                self.typed -= 1
            return self._change(start, end, "")
        if self.rng.random() < 0.05:
            char, self.typo = self.rng.choice("qxz😀中"), True
        else:
            char = PROGRAM[self.typed % len(PROGRAM)]
            self.typed += 1
        at = utf16_position(self.text, self.cursor)
        self.text = self.text[:self.cursor] + char + self.text[self.cursor:]
        self.cursor += 1
        return self._change(at, at, char)

    def _change(self, start: dict, end: dict, text: str) -> dict:
        self.version += 1
        return {"textDocument": {"uri": self.uri, "version": self.version},
                "contentChanges": [{"range": {"start": start, "end": end}, "text": text}]}

    def position(self) -> dict:
        return utf16_position(self.text, self.cursor)


@dataclass
class StormResult:
    requests: int
    cancels: int
    edits: int
    seconds: float
    answers: dict = field(default_factory=dict)  # kind -> count
    unexpected_answers: list = field(default_factory=list)
    unanswered: list = field(default_factory=list)
    answered_twice: list = field(default_factory=list)
    rss_start: int = 0
    rss_end: int = 0
    rss_peak: int = 0
    threads_start: int = 0
    threads_end: int = 0
    introspect_start: dict = field(default_factory=dict)
    introspect_end: dict = field(default_factory=dict)
    server_text_matches: bool = False
    last_answer: dict | None = None
    last_position: dict | None = None
    final_answer: dict | None = None
    reference_answer: dict | None = None
    stats_start: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    violations: list = field(default_factory=list)


def wait_until_idle(server, timeout: float = 60.0) -> dict:
    """Until nothing is queued or in flight in the server or the engine."""
    deadline = time.monotonic() + timeout
    while True:
        info = server.call(INTROSPECT, {})["result"]
        if not (info["engineJobs"] or info["engineQueue"] or info["pendingRequestFutures"]
                or info["serverTasks"] or info["backgroundTasks"]) or time.monotonic() > deadline:
            return info
        time.sleep(0.1)


def items_of(answer: dict | None):
    result = (answer or {}).get("result")
    return None if result is None else [(i["insertText"], i.get("range")) for i in result["items"]]


def run_storm(start_server, tiny_model_dir, places, n_requests: int, seed: int = 1234) -> StormResult:
    workspace, outside = places
    rng = random.Random(seed)
    server = start_server(tiny_args(tiny_model_dir), instrumented=True,
                          env={"DRAFTWISE_TEST_FORWARD_DELAY_MS": str(FORWARD_DELAY_MS)})
    server.initialize(workspace, options={"maxTokens": MAX_TOKENS}, encodings=["utf-16"])
    assert server.wait_for_state()["state"] == "ready"
    process = psutil.Process(server.pid)

    # Outside the workspace: no other document joins the prompt, so the reference below sees the
    # same prompt as the storm's document.
    typist = Typist(rng, (outside / "storm" / "stack.py").as_uri())
    server.open(typist.uri, typist.text, version=typist.version)

    def key_and_request(cancel_share: float) -> tuple[object, bool]:
        server.notify("textDocument/didChange", typist.keystroke())
        msg_id = server.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": typist.uri}, "position": typist.position(), "context": {"triggerKind": 2}})
        cancelled = rng.random() < cancel_share
        if cancelled:
            time.sleep(rng.uniform(0.0, 0.03))
            server.notify("$/cancelRequest", {"id": msg_id})
        time.sleep(rng.uniform(*KEY_INTERVAL_S))
        return msg_id, cancelled

    warmup = [key_and_request(CANCEL_SHARE)[0] for _ in range(WARMUP_KEYS)]
    server.wait_for(lambda books: not server.unanswered(warmup), 60, "warm-up answers")
    result = StormResult(requests=n_requests, cancels=0, edits=0, seconds=0.0)
    result.introspect_start = wait_until_idle(server)
    result.stats_start = server.stats()
    result.rss_start = result.rss_peak = process.memory_info().rss
    result.threads_start = process.num_threads()

    ids = []
    started = time.monotonic()
    for i in range(n_requests - 1):
        msg_id, cancelled = key_and_request(CANCEL_SHARE)
        ids.append(msg_id)
        result.cancels += cancelled
        if i % 50 == 0:
            result.rss_peak = max(result.rss_peak, process.memory_info().rss)
    # The last keystroke and its request, left alone: it must be answered for the final text.
    last_id, _ = key_and_request(0.0)
    ids.append(last_id)
    result.last_position = typist.position()
    result.edits = n_requests
    try:
        server.wait_for(lambda books: not server.unanswered(ids), 120, "storm answers")
    except TimeoutError:
        pass
    result.seconds = time.monotonic() - started
    result.unanswered = server.unanswered(ids)
    result.answered_twice = server.answered_twice()
    result.violations = [str(v) for v in server.books.violations]
    kinds: dict[str, int] = {}
    for msg_id in ids:
        got = server.responses_for(msg_id)
        if not got:
            continue
        answer = got[0]
        if "error" in answer:
            kind = "cancelled" if answer["error"]["code"] == REQUEST_CANCELLED else f"error {answer['error']['code']}"
            if kind != "cancelled":
                result.unexpected_answers.append(answer)
        elif answer["result"] is None:
            kind = "superseded (null)"
        elif answer["result"]["items"]:
            kind = "suggestion"
        else:
            kind = "empty"
        kinds[kind] = kinds.get(kind, 0) + 1
    result.answers = kinds
    result.last_answer = (server.responses_for(last_id) or [None])[0]

    result.introspect_end = wait_until_idle(server)
    result.rss_end = process.memory_info().rss
    result.rss_peak = max(result.rss_peak, result.rss_end)
    result.threads_end = process.num_threads()
    server_copy = server.call("draftwise/documentText", {"textDocument": {"uri": typist.uri}})["result"]
    result.server_text_matches = server_copy["text"] == typist.text and server_copy["version"] == typist.version
    result.stats = server.stats()

    # The final request, after the storm, on the storm's document (closed and reopened to clear the
    # server's type-ahead memory, whose answers depend on what was shown before) and the reference on
    # a fresh document with the same name and text (same prompt): a calm request's answer.
    server.notify("textDocument/didClose", {"textDocument": {"uri": typist.uri}})
    server.open(typist.uri, typist.text, version=typist.version + 1)
    position = typist.position()
    result.final_answer = server.response(server.inline(typist.uri, position["line"], position["character"]), 60)
    reference_uri = (outside / "reference" / "stack.py").as_uri()
    server.open(reference_uri, typist.text)
    result.reference_answer = server.response(server.inline(reference_uri, position["line"], position["character"]), 60)
    assert server.shutdown_and_exit() == 0
    return result


def record(result: StormResult) -> None:
    """Into the figures, unless a longer storm already is (the full storm outranks the quick one)."""
    if result.unanswered:
        FIGURES.add("hangs", len(result.unanswered))
    if FIGURES.values.get("storm_requests", 0) > result.requests:
        return
    mib = 1 << 20
    FIGURES.set("storm_requests", result.requests)
    FIGURES.set("storm_cancels", result.cancels)
    FIGURES.set("storm_edits", result.edits)
    FIGURES.set("storm_seconds", result.seconds)
    FIGURES.set("storm_answers", ", ".join(f"{k}: {n}" for k, n in sorted(result.answers.items())))
    FIGURES.set("storm_rss_start_mib", result.rss_start / mib)
    FIGURES.set("storm_rss_end_mib", result.rss_end / mib)
    FIGURES.set("storm_rss_peak_mib", result.rss_peak / mib)
    FIGURES.set("storm_rss_bound_mib", RSS_BOUND_MIB[result.requests])
    FIGURES.set("storm_threads_start", result.threads_start)
    FIGURES.set("storm_threads_end", result.threads_end)
    FIGURES.set("storm_tasks_start", result.introspect_start["asyncioTasks"])
    FIGURES.set("storm_tasks_end", result.introspect_end["asyncioTasks"])
    FIGURES.set("storm_last_right", items_of(result.final_answer) == items_of(result.reference_answer)
                and items_of(result.final_answer) is not None)


@pytest.fixture(scope="module")
def quick_storm(start_server, tiny_model_dir, places) -> StormResult:
    result = run_storm(start_server, tiny_model_dir, places, QUICK_REQUESTS)
    record(result)
    return result


@pytest.fixture(scope="module")
def full_storm(start_server, tiny_model_dir, places) -> StormResult:
    result = run_storm(start_server, tiny_model_dir, places, FULL_REQUESTS, seed=99)
    record(result)
    return result


def check_answers(r: StormResult) -> None:
    assert not r.violations
    assert not r.unanswered, f"{len(r.unanswered)} requests never answered: {r.unanswered[:10]}"
    assert not r.answered_twice, f"answered twice: {r.answered_twice[:10]}"
    assert not r.unexpected_answers, f"errors other than RequestCancelled: {r.unexpected_answers[:5]}"
    assert sum(r.answers.values()) == r.requests
    # The storm really cancelled work: some requests were cancelled, some overtaken by keys.
    assert r.answers.get("cancelled", 0) > 0 and r.answers.get("superseded (null)", 0) > 0, r.answers
    # Cancelled jobs stop inside the verify loop: at most one target forward after each cancel.
    cancelled_jobs = r.answers.get("cancelled", 0) + r.answers.get("superseded (null)", 0)
    after_cancel = r.stats["cumulative"]["forwards_after_cancel"] - r.stats_start["cumulative"]["forwards_after_cancel"]
    assert after_cancel <= cancelled_jobs


def check_nothing_lost(r: StormResult) -> None:
    assert r.server_text_matches, "the server's copy of the document differs from what was typed"


def pool_threads(names: list[str]) -> dict[str, int]:
    """Threads per ThreadPoolExecutor (named "ThreadPoolExecutor-<pool>_<n>")."""
    pools: dict[str, int] = {}
    for name in names:
        if name.startswith("ThreadPoolExecutor-"):
            pool = name.rsplit("_", 1)[0]
            pools[pool] = pools.get(pool, 0) + 1
    return pools


def check_resources(r: StormResult) -> None:
    grown_mib = (r.rss_end - r.rss_start) / (1 << 20)
    assert grown_mib <= RSS_BOUND_MIB[r.requests], \
        f"RSS grew {grown_mib:.0f} MiB over {r.requests} requests (bound {RSS_BOUND_MIB[r.requests]} MiB)"
    start, end = r.introspect_start, r.introspect_end
    # Thread pools start threads lazily, up to a fixed size: pygls reads stdin through a
    # ThreadPoolExecutor, which adds a thread whenever a read is submitted before the last one's thread
    # is marked idle again (more often on a busy CPU), up to Python's default of cpu_count + 4. Those
    # are bounded by their pool; any other new thread counts against the slack. A leak grows with the
    # number of requests, which the 1,000-request storm would show.
    pools = [pool_threads(start["threads"]), pool_threads(end["threads"])]
    assert all(n <= POOL_MAX for n in pools[1].values()), pools
    pool_growth = sum(pools[1].values()) - sum(pools[0].values())
    assert r.threads_end - pool_growth <= r.threads_start + THREAD_SLACK, \
        (r.threads_start, r.threads_end, start["threads"], end["threads"])
    assert len(end["threads"]) - pool_growth <= len(start["threads"]) + THREAD_SLACK, (start["threads"], end["threads"])
    assert end["asyncioTasks"] <= start["asyncioTasks"]
    for key in ("engineJobs", "engineQueue", "pendingRequestFutures", "serverTasks", "backgroundTasks"):
        assert end[key] == 0, f"{key} = {end[key]} after the storm"


def check_last_answer(r: StormResult) -> None:
    last = r.last_answer
    assert last is not None and "result" in last and last["result"] is not None, \
        f"the last keystroke's request was not answered for the final text: {last}"
    for item in last["result"]["items"]:
        assert item["range"]["start"] == r.last_position  # for the final cursor, not a stale one
    assert items_of(r.final_answer) is not None
    assert items_of(r.final_answer) == items_of(r.reference_answer), (r.final_answer, r.reference_answer)


def check_futures_drained(r: StormResult) -> None:
    # pygls alone keeps each notification's handler future in its table of in-flight requests and
    # never removes it: one entry per keystroke, for the life of the session.
    grown = r.introspect_end["requestFutures"] - r.introspect_start["requestFutures"]
    assert grown <= 1, f"pygls' in-flight table grew by {grown} entries over {r.requests} keystrokes"


def test_storm_every_request_answered_once(quick_storm):
    check_answers(quick_storm)


def test_storm_loses_no_edit(quick_storm):
    check_nothing_lost(quick_storm)


def test_storm_memory_threads_and_tasks_stay_bounded(quick_storm):
    check_resources(quick_storm)


def test_storm_last_request_gets_the_right_answer(quick_storm):
    check_last_answer(quick_storm)


def test_storm_leaves_no_handler_futures_behind(quick_storm):
    check_futures_drained(quick_storm)


@pytest.mark.slow
def test_full_storm(full_storm):
    check_answers(full_storm)
    check_nothing_lost(full_storm)
    check_resources(full_storm)
    check_last_answer(full_storm)


@pytest.mark.slow
def test_full_storm_leaves_no_handler_futures_behind(full_storm):
    check_futures_drained(full_storm)
