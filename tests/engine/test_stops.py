"""Where a completion stops when speculation accepted tokens past the stop, and the time limit."""
from __future__ import annotations

import time

import pytest
import torch

from decoding import CompletionRequest, EngineConfig
from decoding.drafters.base import Draft, Drafter, Offer
from decoding.engine import Engine
from decoding.speculative import Stop, EndCondition, TimeCap
from tests.engine.healed import HealedPrompt, last_logits

EOS = 0


NL = 99


def rule(text_rule=lambda text: None, final_rule=lambda text: None, max_tokens=10, deadline=None,
         whole_lines=True) -> EndCondition:
    """deadline: a time.monotonic() value, as a started time cap has."""
    # Token i decodes to the letter chr(ord('a') + i), NL to a line break; EOS decodes to nothing.
    decode = lambda ids: "".join("\n" if i == NL else chr(ord("a") + i) for i in ids if i != EOS)  # noqa: E731
    return EndCondition(frozenset({EOS}), max_tokens, decode, text_rule, final_rule, TimeCap(deadline=deadline), whole_lines)


def test_an_end_of_text_inside_an_accepted_run_keeps_only_what_comes_before_it():
    # One verify step accepted 5 tokens with the end-of-text as the third: plain decoding would have
    # stopped there, so the two after it are dropped.
    stop = rule().check([1, 2, EOS, 3, 4])
    assert stop == Stop("eos", 2, 2)
    assert stop.text([1, 2, EOS, 3, 4], rule().decode) == "bc"


def test_a_stop_rule_inside_an_accepted_run_cuts_the_text_where_it_fires():
    # The text rule fires once it sees "d" and keeps the text before it; tokens after are dropped.
    r = rule(text_rule=lambda text: text.index("d") if "d" in text else None)
    generated = [1, 2, 3, 4, 5, EOS]
    stop = r.check(generated)
    assert stop.reason == "stop_rule" and stop.text(generated, r.decode) == "bc"


def test_the_stop_rule_sees_the_text_before_an_end_of_text_only():
    seen = []
    r = rule(text_rule=lambda text: seen.append(text))
    assert r.check([1, EOS, 2]).reason == "eos"
    assert seen == ["b"]  # never "bc": the token after the end-of-text is not the model's output


def test_max_tokens_inside_an_accepted_run():
    stop = rule(max_tokens=3).check([1, 2, 3, 4, 5])
    assert stop == Stop("max_tokens", 3, 3)


def test_raw_output_ending_in_an_unfinished_utf8_sequence_keeps_only_the_finished_text():
    """The "full" scope has no final rule: its text is the raw output, minus a character whose
    bytes are not all there yet (plain decoding's text, as the benchmark decodes it)."""
    decode = lambda ids: "ab\ufffd" if len(ids) == 3 else "ab"  # noqa: E731 - the third token starts a character
    r = EndCondition(frozenset({EOS}), 3, decode, lambda text: None, lambda text: None)
    stop = r.check([1, 2, 3])
    assert stop == Stop("max_tokens", 3, 2) and stop.text([1, 2, 3], decode) == "ab"


def test_the_time_limit_of_raw_output_stops_and_keeps_what_was_generated():
    assert rule(deadline=time.monotonic() + 60, whole_lines=False).check([1, 2]) is None
    stop = rule(deadline=time.monotonic() - 1, final_rule=lambda text: len(text) - 1, whole_lines=False).check([1, 2])
    assert stop == Stop("time_limit", 2, 1)


def test_the_time_cap_starts_with_generation_and_only_once():
    """Fixed when the plan is made, started by the verify loop; the alternatives' loops that follow
    the greedy suggestion start it again and keep its deadline, so they share its cap."""
    cap = TimeCap(seconds=60)
    assert cap.deadline is None and not cap.passed()  # the prompt is being read: no clock yet
    cap.start()
    first = cap.deadline
    assert first is not None and not cap.passed()
    cap.deadline = time.monotonic() - 1  # the cap ran out
    cap.start()
    assert cap.deadline < first and cap.passed()
    uncapped = TimeCap(seconds=None)
    uncapped.start()
    assert uncapped.deadline is None and not uncapped.passed()


def test_past_the_time_limit_a_suggestion_ends_with_its_last_whole_line():
    """Never half a line on screen: past the deadline generation goes on to the end of the first
    line, and once a line is whole it stops there, keeping whole lines only."""
    past = time.monotonic() - 1
    seen = []
    r = rule(deadline=past, final_rule=lambda text: seen.append(text) or len(text))
    assert r.check([1, 2]) is None  # "bc": no line is whole yet
    assert r.check([NL, 1]) is None  # "\nb": the line that ended was empty
    stop = r.check([NL, 1, 2, NL, 3])  # "\nbc\nd": one whole line, and part of the next
    assert stop == Stop("time_limit", 5, 3) and seen == ["\nbc"]
    assert stop.text([NL, 1, 2, NL, 3], r.decode) == "\nbc"
    assert rule(deadline=time.monotonic() + 60).check([1, NL, 2]) is None  # before the deadline: nothing


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    e = Engine(EngineConfig(target=str(tiny_model_dir), weights="int8", max_tokens=48))
    e.load()
    yield e
    e.close()


class OracleDrafter(Drafter):
    """Drafts the target's own greedy tokens (computed beforehand), so every draft is accepted."""

    name = "suggestion"

    def __init__(self, tokens: list[int]):
        self.tokens, self.prompt_len = tokens, 0

    def begin(self, ctx):
        self.prompt_len = len(ctx.prompt_ids)

    def _rest(self, seq):
        done = seq[self.prompt_len:]
        return self.tokens[len(done):] if self.tokens[:len(done)] == done else []

    def offer(self, seq, room):
        n = min(len(self._rest(seq)), room)
        return Offer(n, "suggestion") if n else None

    def propose(self, seq, k):
        return Draft(self._rest(seq)[:k], self.name, key="suggestion")


def greedy_ids(engine, request, n: int) -> list[int]:
    prompt, out = HealedPrompt(engine, request), []
    with torch.inference_mode():
        for _ in range(n):
            logits = last_logits(engine.models.target.model, prompt.ids + out)
            out.append(int(prompt.limit(logits, out).argmax()))
    return out


def test_an_accepted_draft_past_a_line_end_gives_the_plain_line(engine, monkeypatch):
    """A draft of the model's own next 40 tokens is accepted in one step, past the end of the line:
    the line scope's stop rule still ends the text where plain decoding ends it."""
    cut_back = 0
    for n, prefix in enumerate(["for i in range(10):\n    print(", "x = [", "def f(a, b):\n    return a", "if x:\n    y",
                                "def f(a, b):\n    return a + ", "values = [1, 2, 3]\n"]):
        request = CompletionRequest(prefix=prefix, scope="line", drafter="none", document=f"plain-{n}")
        plain = engine.complete(request)
        if plain.stats.stopped != "stop_rule":
            continue  # the tiny model's continuation must end its line for this test
        oracle = greedy_ids(engine, request, 40)
        monkeypatch.setitem(engine.models.drafters, "suggestion", OracleDrafter(oracle))
        # a record of drafts that were always right: the cost model drafts as long as it may (16)
        monkeypatch.setitem(engine.models.cost.acceptance.lifetime, "suggestion", [1000.0, 0.0])
        drafted = engine.complete(CompletionRequest(prefix=prefix, scope="line", drafter="suggestion",
                                                    document=f"drafted-{n}"))
        assert drafted.text == plain.text
        s = drafted.stats
        assert s.stopped == "stop_rule" and s.target_forwards < plain.stats.target_forwards
        accepted_text = HealedPrompt(engine, request).text(oracle[:s.accepted_tokens])
        assert accepted_text.startswith(drafted.text)
        cut_back += len(accepted_text) > len(drafted.text)
    # where a draft was accepted past the line end (not every prefix's line ends inside a draft)
    assert cut_back >= 1


def test_a_time_limit_returns_the_part_generated_so_far(engine):
    prefix = "class Stack:\n    def push(self, item):\n        "
    whole = engine.complete(CompletionRequest(prefix=prefix, scope="full", max_tokens=48, drafter="none",
                                              document="whole"))
    engine.models.target_runner.test_delay_s = 0.05  # each forward takes >= 50 ms
    try:
        capped = engine.complete(CompletionRequest(prefix=prefix, scope="full", max_tokens=48, drafter="none",
                                                   document="capped", time_limit_s=0.2))
    finally:
        engine.models.target_runner.test_delay_s = 0.0
    assert capped.stats.stopped == "time_limit"
    assert 0 < capped.stats.generated_tokens < whole.stats.generated_tokens
    assert whole.text.startswith(capped.text)


def test_the_time_limit_counts_generation_not_the_prompt_read(engine, monkeypatch):
    """maxTimeMs caps a suggestion's generation: a slow prompt read (a cold prompt on a CPU) must not
    use it up, or every cold suggestion would stop at its first line end."""
    runner = engine.models.target_runner
    slow_sync = runner.sync

    def sync(*args, **kwargs):
        time.sleep(0.3)  # reading the prompt takes longer than the whole cap
        return slow_sync(*args, **kwargs)

    monkeypatch.setattr(runner, "sync", sync)
    prefix = "class Stack:\n    def push(self, item):\n        "
    result = engine.complete(CompletionRequest(prefix=prefix, scope="full", max_tokens=24, drafter="none",
                                               document="slow-prompt", time_limit_s=0.2))
    assert result.stats.prefill_ms >= 300
    assert result.stats.stopped != "time_limit" and result.stats.generated_tokens > 1


def test_a_prompt_is_fitted_to_a_cache_of_fixed_size(engine, monkeypatch):
    """llama.cpp's context cannot grow (the gguf format): a request whose budget is larger than the
    context gets a prompt that leaves room in it for the completion and a draft, not an error."""
    runner = engine.models.target_runner
    monkeypatch.setattr(runner, "context_limit", 160, raising=False)
    prefix = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(200))
    result = engine.complete(CompletionRequest(prefix=prefix, scope="full", max_tokens=24, context_tokens=100_000,
                                               document="fitted"))
    assert result.stats.prompt_tokens <= 160 - 24 - 17 and result.stats.generated_tokens > 0
    monkeypatch.setattr(runner, "context_limit", None)
    unbounded = engine.complete(CompletionRequest(prefix=prefix, scope="full", max_tokens=24, context_tokens=100_000,
                                                  document="unbounded"))
    assert unbounded.stats.prompt_tokens > 1000


def test_the_model_drafter_named_at_runtime_loads_the_draft_model_that_auto_left_out(tiny_model_dir, monkeypatch):
    """`auto` leaves out a draft model that cannot pay on this device; a request that names the model
    drafter later must get it, not plain decoding. (Tiny models' forward times are all overhead, so
    the verdict is forced here; the pricing itself is tested in test_cost_model.)"""
    from decoding.cost_model import CostModel

    monkeypatch.setattr(CostModel, "drafter_pays", lambda self, step_s, alpha=0.9: False)
    e = Engine(EngineConfig(target=str(tiny_model_dir), draft=str(tiny_model_dir), drafter="auto", weights="int8",
                            draft_weights="int8", max_tokens=16))
    e.load()
    try:
        assert e.models.draft is None and e.info()["draft_note"].startswith("unloaded")
        result = e.complete(CompletionRequest(prefix="def f(x):\n    return", scope="full", drafter="model",
                                              document="named"))
        assert result.stats.drafted_by.get("model", 0) > 0
        assert e.models.draft is not None and e.info()["draft_loaded"]
    finally:
        e.close()
