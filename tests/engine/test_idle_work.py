"""Idle work: reading a prompt ahead, and prefetching at idle priority. A request the user waits for
cancels idle work, which then finishes at most the one forward already running."""
from __future__ import annotations

import time
from dataclasses import replace

import pytest

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from decoding.runners import PREFILL_CHUNK

LONG_PREFIX = "def step(state):\n    total = 0\n" + "    total += state.value * 3 - 1\n" * 120


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = Engine(EngineConfig(target=str(tiny_model_dir), weights="fp32", max_tokens=8, context_tokens=4096))
    e.load()
    yield e
    e.close()


def test_a_prepared_prompt_is_reused_by_the_request_at_that_cursor(engine):
    request = CompletionRequest(prefix=LONG_PREFIX, suffix="\n", document="prepared", scope="full")
    read = engine.prepare(request).result(timeout=60)
    prompt = engine.build_prompt(request)
    assert read == len(prompt) - 1  # all but the last token, which the request's first forward sends
    result = engine.complete(request)
    assert result.stats.reused_prompt_tokens == len(prompt) - 1
    cold = engine.complete(CompletionRequest(prefix=LONG_PREFIX, suffix="\n", document="cold", scope="full"))
    assert result.text == cold.text
    assert engine.stats()["idle"]["prepared_tokens"] >= read
    assert engine.stats()["requests"] >= 2


def test_a_real_request_waits_for_at_most_one_forward_of_idle_work(engine):
    runner = engine.models.target_runner
    runner.store.clear()
    idle_request = CompletionRequest(prefix=LONG_PREFIX * 3, document="idle", scope="full")
    assert len(engine.build_prompt(idle_request)) > 3 * PREFILL_CHUNK  # several chunks to interrupt
    forward, log = runner.forward, []

    def logged_forward(ids, *args, **kwargs):  # which job each forward belonged to, and whether cancelled
        token = runner.cancel
        out = forward(ids, *args, **kwargs)
        log.append((token, token.cancelled if token is not None else False))
        time.sleep(0.02)  # a slow device: the idle job is surely mid-prefill when the user asks
        return out

    runner.forward = logged_forward
    try:
        idle = engine.prepare(idle_request)
        while not log:
            time.sleep(0.005)
        real = engine.submit(CompletionRequest(prefix="x = 1\n", document="typing", scope="full"))
        real_result = real.result(timeout=60)
        read = idle.result(timeout=60)
    finally:
        del runner.forward
    idle_token = idle.cancel_token
    assert idle_token.cancelled and real_result.stats.stopped != "cancelled"
    after_cancel = sum(1 for token, cancelled in log if token is idle_token and cancelled)
    assert after_cancel <= 1, f"idle work ran {after_cancel} forwards after a real request arrived"
    assert 0 < read < len(engine.build_prompt(idle_request)) - 1  # stopped part-way, kept what it read


def test_idle_prefetch_is_cancelled_by_a_real_request_and_not_counted_as_one(engine):
    before = engine.stats()
    engine.models.target_runner.test_delay_s = 0.02
    try:
        prefetch = engine.submit(CompletionRequest(prefix=LONG_PREFIX, document="next", scope="full",
                                                   max_tokens=64), idle=True)
        time.sleep(0.1)
        engine.complete(CompletionRequest(prefix="y = 2\n", document="other", scope="full", max_tokens=2))
        assert prefetch.result(timeout=60).stats.stopped == "cancelled"
    finally:
        engine.models.target_runner.test_delay_s = 0.0
    after = engine.stats()
    assert after["requests"] == before["requests"] + 1
    assert after["idle"]["prefetches"] == before["idle"]["prefetches"] + 1
    assert after["idle"]["cancelled"] >= before["idle"]["cancelled"] + 1


def test_an_idle_job_for_a_document_replaces_the_previous_one(engine):
    engine.models.target_runner.test_delay_s = 0.02
    try:
        first = engine.prepare(CompletionRequest(prefix=LONG_PREFIX, document="doc", scope="full"))
        second = engine.prepare(CompletionRequest(prefix=LONG_PREFIX + "    z = 1\n", document="doc", scope="full"))
        assert first.cancel_token.cancelled and not second.cancel_token.cancelled
        second.result(timeout=60)
        assert len(engine.jobs) == 0
    finally:
        engine.models.target_runner.test_delay_s = 0.0


def test_a_request_joins_the_idle_job_computing_it_and_gets_the_same_text(engine):
    request = CompletionRequest(prefix=LONG_PREFIX + "    done = ", document="joined", scope="full", max_tokens=8)
    cold = engine.complete(CompletionRequest(prefix=request.prefix, document="joined-cold", scope="full",
                                             max_tokens=8))
    runner = engine.models.target_runner
    before, forwards = engine.stats(), runner.forwards
    runner.test_delay_s = 0.02
    try:
        idle = engine.submit(request, version=3, idle=True)
        while runner.forwards == forwards:  # it is running when the user asks
            time.sleep(0.005)
        real = engine.submit(request, version=3)
        result = real.result(timeout=60)
    finally:
        runner.test_delay_s = 0.0
    assert real is idle and not idle.idle, "the request waited for the running job instead of starting over"
    assert result.text == cold.text and result.stats.stopped != "cancelled"
    after = engine.stats()
    assert after["requests"] == before["requests"] + 1
    assert after["idle"]["joined"] == before["idle"]["joined"] + 1
    assert after["idle"]["prefetches"] == before["idle"]["prefetches"], "counted once, as the request it became"
    assert after["last"]["generated_tokens"] == result.stats.generated_tokens
    # One job's forwards in all (its prompt read, then its generation): nothing started over.
    s = result.stats
    prefill_forwards = -(-(s.prompt_tokens - 1 - s.reused_prompt_tokens) // PREFILL_CHUNK)
    assert runner.forwards - forwards == prefill_forwards + s.target_forwards
    engine.jobs.document_changed("joined", 4)  # an edit after it: nothing left to stop
    assert len(engine.jobs) == 0


def test_an_idle_job_that_ended_answers_the_request_at_once_and_counts_as_it(engine):
    request = CompletionRequest(prefix=LONG_PREFIX + "    last = ", document="ended", scope="full", max_tokens=6)
    idle = engine.submit(request, idle=True)
    text = idle.result(timeout=60).text
    before = engine.stats()
    real = engine.submit(request, version=2)
    assert real is idle and real.future.done()
    assert real.result().text == text
    after = engine.stats()
    assert after["requests"] == before["requests"] + 1 and after["idle"]["joined"] == before["idle"]["joined"] + 1
    # Claimed once: asking again runs the model (the answer is the same, greedy).
    again = engine.submit(request, version=2)
    assert again is not idle and again.result(timeout=60).text == text


def test_only_the_same_request_joins_and_a_read_ahead_is_never_joined(engine):
    request = CompletionRequest(prefix=LONG_PREFIX + "    other = ", document="differs", scope="full", max_tokens=6)
    idle = engine.submit(request, idle=True)
    idle.result(timeout=60)
    changed = engine.submit(CompletionRequest(prefix=request.prefix + "1", document="differs", scope="full",
                                              max_tokens=6))
    assert changed is not idle and changed.result(timeout=60).stats.stopped != "cancelled"
    assert engine.submit(request) is not idle, "a newer request for the document dropped the ended idle job"
    read = engine.prepare(request)
    read.result(timeout=60)
    real = engine.submit(request)
    assert real is not read and isinstance(real.result(timeout=60).text, str)


def test_idle_work_for_a_request_already_being_computed_keeps_that_job(engine):
    request = CompletionRequest(prefix=LONG_PREFIX + "    again = ", document="kept", scope="full", max_tokens=6)
    engine.models.target_runner.test_delay_s = 0.02
    try:
        first = engine.submit(request, idle=True)  # a prefetch for after a suggestion
        second = engine.submit(request, idle=True)  # idle work after the edit that accepts it
        assert second is first and not first.cancel_token.cancelled
        first.result(timeout=60)
    finally:
        engine.models.target_runner.test_delay_s = 0.0


def test_a_job_told_what_the_user_typed_stops_at_its_first_token_that_differs(engine):
    # One token a forward (no drafts), so that a job can stop before its end.
    request = CompletionRequest(prefix="def area(width, height):\n    return ", suffix="\n", document="typed",
                                scope="full", drafter="none")
    text = engine.complete(request).text
    assert len(text) >= 2
    runner = engine.models.target_runner
    runner.test_delay_s = 0.1  # the first token comes >= 0.2 s after submit: expect() is called before
    try:
        along = engine.submit(request, idle=True)
        along.expect(text[:2])  # typed what it writes: it runs to its end
        assert along.result(timeout=60).text == text and not along.diverged
        other = engine.submit(replace(request, document="typed otherwise"), idle=True)  # not `along` again
        other.expect("#" if text[0] != "#" else "@")  # the first character differs
        result = other.result(timeout=60)
    finally:
        runner.test_delay_s = 0.0
    assert other.diverged and result.stats.stopped == "cancelled"
    # It stopped at the token that showed the difference, not at its end.
    assert result.stats.generated_tokens < engine.complete(request).stats.generated_tokens
    assert result.stats.forwards_after_cancel == 0


def test_job_expect_and_saw_compare_the_typing_with_the_text_so_far():
    from decoding.jobs import Job

    job = Job(CompletionRequest(prefix="x"))
    job.expect("ab")
    job.saw("a")
    job.saw("abc")  # wrote past the typing, along it
    assert not job.cancel_token.cancelled
    job.saw("abx")
    assert not job.cancel_token.cancelled, "past the typed text anything goes"
    late = Job(CompletionRequest(prefix="x"))
    late.saw("ac")
    late.expect("ab")  # typed after it wrote something else
    assert late.cancel_token.cancelled and late.diverged
