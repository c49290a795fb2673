"""Idle work: reading a prompt ahead, and prefetching at idle priority. A request the user waits for
cancels idle work, which then finishes at most the one forward already running."""
from __future__ import annotations

import time

import pytest

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from decoding.runner import PREFILL_CHUNK

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
