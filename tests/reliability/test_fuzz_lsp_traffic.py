"""Property-based LSP traffic against the real server process, at the byte level.

Properties, checked after every batch of generated messages:
- the process is alive;
- every well-formed request got exactly one response, carrying its id, with a result or an error
  whose code JSON-RPC or LSP defines; no notification and no ignored message got one;
- a sentinel request sent after the batch is answered within HANG_S (else: a hang);
- stdout carried nothing but Content-Length framed JSON-RPC 2.0 messages (checked by raw_lsp's reader).

The default run sends a few hundred messages per session; `make test-reliability` runs the slow
test, which sends FULL_FUZZ_MESSAGES (10,000 by default).
"""
from __future__ import annotations

import math
import os
import time
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from lsp_fuzz import (
    CLIENT_RESPONSE, GARBAGE, MAX_TOKENS_IN_FUZZ, NOTIFICATION, ODD_ENVELOPE, REQUEST, IdSource, Outgoing, Places,
    Write, lsp_messages, writes,
)
from reliability_support import FIGURES, tiny_args

HANG_S = 60.0  # a request unanswered this long after its batch counts as a hang
FULL_FUZZ_MESSAGES = int(os.environ.get("DRAFTWISE_FUZZ_MESSAGES", "10000"))
QUICK_FUZZ_MESSAGES = 500
BATCH = (10, 60)  # messages per generated batch
INTERNAL_ERROR = -32603
# Before initialize: no initialize request, which would start the session.
BEFORE_INITIALIZE_LEFT_OUT = ("initialize-again",)


class FuzzRun:
    """Feeds generated batches to one server and checks the properties after each."""

    def __init__(self, server, places: Places, *, leave_out: tuple[str, ...] = ()) -> None:
        self.server = server
        self.places = places
        self.ids = IdSource()
        self.recent_ids: list = []
        self.odd_ids: set[str] = set()
        self.leave_out = leave_out
        self.sent = 0
        self.kinds: Counter[str] = Counter()
        self.error_codes: Counter[int] = Counter()
        self.internal_errors: list[str] = []

    def messages(self):
        return lsp_messages(self.places, self.ids, recent_ids=self.recent_ids, leave_out=self.leave_out)

    def run_batch(self, messages: list[Outgoing], chunks: list[Write]) -> None:
        server = self.server
        assert server.alive(), "the server died in an earlier batch"
        requests = [m for m in messages if m.kind == REQUEST]
        for m in requests:
            server.expect_response(m.msg_id)
        for m in messages:
            if m.kind == ODD_ENVELOPE:
                self.odd_ids.add(repr(m.msg_id))
        try:
            for chunk in chunks:
                server.send_bytes(chunk.data)
                if chunk.await_id is not None:
                    server.wait_for(lambda books: server.responses_for(chunk.await_id), HANG_S,
                                    f"the answer to {chunk.await_id!r}")
        except (BrokenPipeError, OSError) as err:
            raise AssertionError(f"the server stopped reading ({err}); batch:\n{describe(messages)}") from err
        except TimeoutError:
            FIGURES.add("hangs")
            raise AssertionError(f"no answer to {chunk.await_id!r} after {HANG_S:.0f} s; batch:\n"
                                 f"{describe(messages)}\nserver log tail:\n{server.log_text()[-3000:]}")
        self.sent += len(messages)
        self.kinds.update(m.kind for m in messages)
        FIGURES.add("fuzz_messages", len(messages))
        FIGURES.add("fuzz_batches")
        FIGURES.add("fuzz_requests", len(requests))
        FIGURES.add("fuzz_notifications", sum(m.kind in (NOTIFICATION, CLIENT_RESPONSE) for m in messages))
        FIGURES.add("fuzz_garbage", sum(m.kind == GARBAGE for m in messages))
        FIGURES.add("fuzz_odd_envelopes", sum(m.kind == ODD_ENVELOPE for m in messages))

        sentinel = server.request("draftwise/stats", {})
        ids = [m.msg_id for m in requests] + [sentinel]
        try:
            server.wait_for(lambda books: not server.unanswered(ids), HANG_S, "answers to the batch")
        except TimeoutError:
            missing = server.unanswered(ids)
            FIGURES.add("hangs", len(missing))
            if not server.alive():
                server.crashed = True
            by_id = {repr(m.msg_id): m for m in requests}
            raise AssertionError(
                f"{len(missing)} request(s) unanswered after {HANG_S:.0f} s (server "
                f"{'alive' if server.alive() else f'exited {server.process.returncode}'}):\n"
                + "\n".join(by_id[repr(i)].describe() if repr(i) in by_id else f"sentinel {i}" for i in missing)
                + f"\nbatch:\n{describe(messages)}\nserver log tail:\n{server.log_text()[-3000:]}")
        self.check(messages, requests)

    def check(self, messages: list[Outgoing], requests: list[Outgoing]) -> None:
        server = self.server
        assert server.alive()
        assert not server.books.violations, \
            "stdout carried something other than protocol:\n" + "\n".join(map(str, server.books.violations[:5]))
        twice = server.answered_twice()
        assert not twice, f"requests answered more than once: {twice[:5]}"
        unexpected = [i for i in server.unexpected_ids() if repr(i) not in self.odd_ids]
        assert not unexpected, f"responses to ids never sent as requests: {unexpected[:5]}\n{describe(messages)}"
        for answer in server.books.null_id_errors:
            assert "error" in answer and answer["error"]["code"] in (-32700, -32600), answer
        for m in requests:
            answer = server.responses_for(m.msg_id)[0]
            if "error" in answer:
                code = answer["error"]["code"]
                self.error_codes[code] += 1
                FIGURES.add("fuzz_errors")
                if code == INTERNAL_ERROR:
                    self.internal_errors.append(f"{m.describe()} -> {answer['error']['message'][:200]}")
            else:
                FIGURES.add("fuzz_results")
            FIGURES.add("fuzz_answered_once")


def describe(messages: list[Outgoing]) -> str:
    return "\n".join(m.describe() for m in messages)


def fuzz(run: FuzzRun, total_messages: int) -> None:
    """Send at least total_messages generated messages, in batches, through hypothesis (in rounds
    sized so that the last one overshoots by at most a few batches)."""
    while run.sent < total_messages:
        fuzz_round(run, max(1, math.ceil((total_messages - run.sent) / BATCH[1])))


def fuzz_round(run: FuzzRun, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, database=None, print_blob=True,
              # The server's state carries over between examples, so a shrunk example would not
              # replay the failure faithfully: report the failing batch as generated instead.
              phases=(Phase.explicit, Phase.generate),
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def batch(data):
        messages = data.draw(st.lists(run.messages(), min_size=BATCH[0], max_size=BATCH[1]), label="messages")
        run.run_batch(messages, data.draw(writes(messages), label="writes"))

    batch()


def start_initialized(start_server, tiny_model_dir, places):
    workspace, outside = places
    server = start_server(tiny_args(tiny_model_dir))
    server.initialize(workspace, options={"maxTokens": MAX_TOKENS_IN_FUZZ}, encodings=["utf-16"])
    assert server.wait_for_state()["state"] == "ready"
    return server


def record_error_codes(run: FuzzRun) -> None:
    totals = Counter(FIGURES.values.get("fuzz_error_codes", {}))
    totals.update(run.error_codes)
    FIGURES.set("fuzz_error_codes", dict(totals))


def assert_no_internal_errors(run: FuzzRun) -> None:
    # An internal error is an exception no handler expected: the server survived it, but bad input
    # should get a precise answer (InvalidParams, MethodNotFound, ...), not a stack trace.
    assert not run.internal_errors, f"{len(run.internal_errors)} internal errors, e.g.:\n" + \
        "\n".join(run.internal_errors[:10])


def session_ends_cleanly(server) -> None:
    FIGURES.add("fuzz_engine_requests", server.stats()["requests"])
    assert server.shutdown_and_exit() == 0
    assert not server.books.violations
    assert not server.answered_twice()


def test_fuzz_before_initialize(start_server, tiny_model_dir, places):
    """Traffic before `initialize`: every request is answered, and the session can still start."""
    workspace, outside = places
    server = start_server(tiny_args(tiny_model_dir))
    run = FuzzRun(server, Places(workspace, outside), leave_out=BEFORE_INITIALIZE_LEFT_OUT)
    fuzz(run, 150)
    record_error_codes(run)
    server.initialize(workspace, options={"maxTokens": MAX_TOKENS_IN_FUZZ})
    assert server.wait_for_state()["state"] == "ready"
    session_ends_cleanly(server)
    assert_no_internal_errors(run)


def fuzz_initialized_session(start_server, tiny_model_dir, places, messages: int) -> None:
    server = start_initialized(start_server, tiny_model_dir, places)
    run = FuzzRun(server, Places(*places))
    started = time.monotonic()
    fuzz(run, messages)
    record_error_codes(run)
    FIGURES.add("fuzz_seconds", int(time.monotonic() - started))
    session_ends_cleanly(server)
    assert_no_internal_errors(run)


def test_fuzz_initialized_quick(start_server, tiny_model_dir, places):
    fuzz_initialized_session(start_server, tiny_model_dir, places, QUICK_FUZZ_MESSAGES)


@pytest.mark.slow
def test_fuzz_initialized_full(start_server, tiny_model_dir, places):
    fuzz_initialized_session(start_server, tiny_model_dir, places, FULL_FUZZ_MESSAGES)
