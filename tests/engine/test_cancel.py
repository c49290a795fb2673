"""Cancellation from another thread stops the verify loop within one forward (counted, not timed)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine

LONG = dict(prefix="for i in range(10):\n    print(i)\n" * 8, suffix="", scope="full", max_tokens=400)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = Engine(EngineConfig(target=str(tiny_model_dir), drafter="none"))
    e.load()
    # Each forward sleeps a little so a 400-token generation is long enough to interrupt; this is the
    # engine's test-only slow-down switch, not a timing assertion.
    e.models.target_runner.test_delay_s = 0.01
    e.models.end_ids = frozenset()  # never stop at end-of-text, so only the cancel can end the request early
    yield e
    e.close()


def cancel_after(engine, job, forwards: int) -> threading.Thread:
    start = engine.models.target_runner.forwards

    def watch():
        while engine.models.target_runner.forwards - start < forwards and not job.future.done():
            threading.Event().wait(0.001)
        job.cancel()

    t = threading.Thread(target=watch)
    t.start()
    return t


def test_cancel_from_another_thread_stops_within_one_forward(engine):
    job = engine.submit(CompletionRequest(document="c1", **LONG))
    watcher = cancel_after(engine, job, forwards=10)
    result = job.result(timeout=60)
    watcher.join()
    assert result.stats.stopped == "cancelled"
    assert result.stats.forwards_after_cancel <= 1
    assert result.stats.generated_tokens < 400


def test_caches_stay_consistent_after_cancel(engine):
    req = dict(LONG, max_tokens=12)
    job = engine.submit(CompletionRequest(document="c2", **LONG))
    cancel_after(engine, job, forwards=5).join()
    assert job.result(timeout=60).stats.stopped == "cancelled"
    warm = engine.complete(CompletionRequest(document="c2", **req))
    engine.clear_caches()
    cold = engine.complete(CompletionRequest(document="c2", **req))
    assert warm.stats.reused_prompt_tokens > 0 and cold.stats.reused_prompt_tokens == 0
    assert warm.text == cold.text


def test_latest_request_for_a_document_wins(engine):
    first = engine.submit(CompletionRequest(document="same", **LONG))
    start = engine.models.target_runner.forwards
    while engine.models.target_runner.forwards - start < 3:
        threading.Event().wait(0.001)
    second = engine.submit(CompletionRequest(document="same", **dict(LONG, max_tokens=5)))
    assert first.result(timeout=60).stats.stopped == "cancelled"
    assert second.result(timeout=60).stats.stopped == "max_tokens"
    assert first.result().stats.forwards_after_cancel <= 1


def test_queued_job_cancelled_before_it_runs_spends_no_forwards(engine):
    blocker = engine.submit(CompletionRequest(document="blocker", **dict(LONG, max_tokens=30)))
    queued = engine.submit(CompletionRequest(document="queued", **LONG))
    queued.cancel()
    blocker.result(timeout=60)
    r = queued.result(timeout=60)
    assert r.stats.stopped == "cancelled" and r.stats.target_forwards == 0 and r.text == ""


def test_job_is_awaitable_from_asyncio(engine):
    async def main():
        return await engine.submit(CompletionRequest(document="aio", **dict(LONG, max_tokens=4)))

    assert asyncio.run(main()).stats.generated_tokens == 4


def test_a_cancel_stops_the_draft_models_catch_up_between_chunks(tiny_model_dir, tiny_draft_dir):
    """The draft model reads the prompt when it first drafts; a cancel must not wait for all of it."""
    from decoding.runners import PREFILL_CHUNK

    e = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_draft_dir), drafter="model",
                            weights="int8", draft_weights="int8"))  # exact on every CPU: drafting stays on
    e.load()
    try:
        draft_runner = e.models.drafters["model"].runner
        long_prompt = dict(prefix="x = [i * i for i in range(100)]\n" * 200, suffix="", scope="full", max_tokens=40)
        job = e.submit(CompletionRequest(document="catch-up", **long_prompt))
        before = draft_runner.forwards
        forward = draft_runner.forward

        def forward_then_cancel(*args, **kwargs):  # cancelled during the first chunk of the catch-up
            out = forward(*args, **kwargs)
            job.cancel()
            return out

        draft_runner.forward = forward_then_cancel
        result = job.result(timeout=120)
        del draft_runner.forward
        assert result.stats.stopped == "cancelled"
        assert result.stats.prompt_tokens > PREFILL_CHUNK + 1  # so the catch-up had a chunk to skip
        assert draft_runner.forwards - before == 1
        # The engine goes on: the same request, uncancelled, completes.
        assert e.complete(CompletionRequest(document="catch-up", **long_prompt)).stats.stopped != "cancelled"
    finally:
        e.close()
