"""The gguf weight format: the real 0.5B's GGUF file on llama.cpp under the engine's verify loop.

Lossless here means equal to plain greedy decoding of the same GGUF on llama.cpp, which this file
runs itself: the prompt read once (its last `prompt_tail` tokens in the call that gives the
first token, as the engine reads a prompt), then one token per llama_decode call. Needs the `llamacpp`
extra (skips without it: it is a ~12-minute build) and the pulled 0.5B.
"""
from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from decoding import CompletionRequest, EngineConfig
from decoding.engine import Engine
from decoding.runners import PREFILL_CHUNK
from tests.engine.healed import HealedPrompt

pytest.importorskip("llama_cpp", reason="the gguf format needs the llamacpp extra: pip install -e '.[llamacpp]'")
pytestmark = pytest.mark.real_model
STDLIB = Path(sysconfig.get_paths()["stdlib"])


def fim_cases():
    for name, statement in [("textwrap.py", "text = text.expandtabs(self.tabsize)"),
                            ("json/encoder.py", "chunks = self.iterencode(o, _one_shot=True)"),
                            ("shlex.py", "self.lineno = 1"),
                            ("argparse.py", "self._actions = []")]:
        text = (STDLIB / name).read_text()
        at = text.index(statement)
        yield name, text[:at], text[at + len(statement):]


@pytest.fixture(scope="module")
def engine(real_model):
    e = Engine(EngineConfig(target=real_model, weights="gguf", max_tokens=32, context_tokens=768))
    e.load()
    yield e
    e.close()


@pytest.fixture(scope="module")
def reference_model(real_model):
    """A second llama.cpp instance of the same file, so the reference shares no state with the engine."""
    from decoding.models.checkpoint import GGUF_CONTEXT_TOKENS, gguf_file
    from decoding.models.llamacpp_model import LlamaCppModel

    model = LlamaCppModel(gguf_file(real_model), GGUF_CONTEXT_TOKENS)
    yield model
    model.close()


def plain_greedy(model, engine: Engine, request: CompletionRequest, max_tokens: int) -> str:
    prompt = HealedPrompt(engine, request)
    ids = prompt.ids
    model.lib.llama_memory_clear(model.memory, True)
    tail = min(engine.models.target_runner.prompt_tail, len(ids))
    for start in range(0, len(ids) - tail, PREFILL_CHUNK):
        model.decode(ids[start:min(start + PREFILL_CHUNK, len(ids) - tail)], start, keep=1)
    out, last = [], ids[-tail:]
    for step in range(max_tokens):
        logits = torch.from_numpy(model.decode(last, len(ids) - len(last) + step, keep=1)[0])
        token = int(prompt.limit(logits, out).argmax())
        if token in engine.models.end_ids:
            break
        out.append(token)
        last = [token]
    return prompt.text(out)


def test_the_engine_runs_the_gguf_file_on_llama_cpp(engine):
    from decoding.runners.llamacpp import LlamaCppRunner

    assert engine.info()["weights"] == "gguf"
    assert isinstance(engine.models.target_runner, LlamaCppRunner)


def test_drafts_are_no_wider_than_the_widest_exact_forward(engine):
    """Measured at load: where llama.cpp computes a k-token forward's rows unlike one-token steps,
    speculation could change the text, so drafts stop one token short of the first inexact width
    (none at all when two rows already differ), and the engine says why."""
    from decoding.runners import exactness

    runner = engine.models.target_runner
    per_width = {int(w): d for w, d in runner.exactness["per_width"].items()}
    assert all(d == 0.0 for w, d in per_width.items() if w <= runner.exact_width)
    if runner.exact_width < max(per_width):
        assert per_width[runner.exact_width + 1] > 0.0
    assert runner.exactness["positions"] == exactness.positions(runner.max_positions, max(per_width))
    assert max(runner.exactness["positions"]) + max(per_width) <= runner.context_limit  # the widest fits
    assert engine.models.cost.max_draft == max(0, min(16, runner.exact_width - 1))
    # the first forward's prompt tail and a draft fit in the exact width together
    assert runner.prompt_tail + engine.models.cost.max_draft <= max(runner.exact_width, 1)
    info = engine.info()
    if runner.verify_exact:
        assert not info["drafting_off"] and info["verify"]["exact_width"] == runner.exact_width
    else:
        assert "decodes plainly" in info["drafting_off"] and engine.models.drafter_mode("auto") == "none"


@pytest.mark.parametrize("case", list(fim_cases()), ids=lambda c: c[0])
def test_every_drafter_equals_plain_greedy_of_the_same_gguf(engine, reference_model, case):
    name, prefix, suffix = case
    expected = plain_greedy(reference_model, engine, CompletionRequest(prefix=prefix, suffix=suffix, scope="full",
                                                                       max_tokens=32), 32)
    assert expected.strip(), "the reference generated nothing: the case checks nothing"
    half = len(expected) // 2
    hint = expected[:half] + " # not what the model says" + expected[half:]  # right, then wrong
    for drafter in ("none", "lookup", "suggestion", "auto"):
        result = engine.complete(CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=32,
                                                   drafter=drafter, document=f"{name}-{drafter}", draft_hint=hint))
        assert result.text == expected, f"{name}, drafter {drafter}"
        if engine.models.drafting_off:  # this build's verify rows differ from decode steps: plain only
            assert result.stats.drafted_tokens == 0 and result.stats.drafter == "none", result.stats
        elif drafter == "suggestion":  # verified several drafted tokens at once, and rejected some
            assert 0 < result.stats.accepted_tokens < result.stats.drafted_tokens, result.stats
    if engine.models.drafting_off:
        pytest.skip("drafting is off on this llama.cpp build (no verify width is exact): only plain decoding "
                    "was compared with the reference")


def test_a_document_switch_restores_its_cache_and_computes_the_same_logits(engine, real_model):
    """Two documents take turns: each comes back to its own saved cache (not a cold read), and the
    logits after a restore are those of a cold read, bit for bit."""
    runner = engine.models.target_runner
    engine.models.clear_caches()
    a = engine.build_prompt(CompletionRequest(prefix="def add(a, b):\n    return", suffix="\n"))
    b = engine.build_prompt(CompletionRequest(prefix="class Stack:\n    def push(self, item):\n", suffix=""))

    def read(ids, doc):
        reused = runner.start(ids, doc)
        runner.sync(ids)
        logits = runner.forward([ids[-1]])[-1].clone()
        runner.finish()
        return reused, logits

    cold_a = read(a, "a")
    cold_b = read(b, "b")
    assert cold_a[0] == 0 and cold_b[0] == 0
    warm_a = read(a, "a")  # the live cache holds b now: a's comes back from its saved state
    assert warm_a[0] == len(a) - 1
    assert bool((warm_a[1] == cold_a[1]).all())
    warm_b = read(b, "b")
    assert warm_b[0] == len(b) - 1 and bool((warm_b[1] == cold_b[1]).all())


def test_typing_in_one_document_saves_no_state_and_a_switch_saves_it_once(engine, monkeypatch):
    """A finished request's cache stays in the live sequence; its bytes are copied out only when
    another document needs the sequence (a copy costs ~14 ms per 1,000 tokens on every keystroke)."""
    runner = engine.models.target_runner
    engine.models.clear_caches()
    saves = []
    real_save = runner.model.save
    monkeypatch.setattr(runner.model, "save", lambda: saves.append(1) or real_save())
    prefix = "def add(a, b):\n    return"
    for typed in ("", " a", " a +"):  # keystrokes in one document
        engine.complete(CompletionRequest(prefix=prefix + typed, suffix="\n", document="typed", max_tokens=2))
    assert saves == []
    other = engine.complete(CompletionRequest(prefix="class Stack:\n", document="other", max_tokens=2))
    assert saves == [1] and other.stats.reused_prompt_tokens == 0
    back = engine.complete(CompletionRequest(prefix=prefix + " a +", suffix="\n", document="typed", max_tokens=2))
    assert back.stats.reused_prompt_tokens == back.stats.prompt_tokens - 1  # restored from the saved state
    assert saves == [1, 1]  # "other" saved before the live sequence was restored over


def test_a_cancel_from_another_thread_costs_at_most_the_forward_in_flight(engine):
    import threading

    prefix, suffix = next(iter(fim_cases()))[1:]
    runner = engine.models.target_runner
    engine.models.clear_caches()
    start = runner.forwards
    job = engine.submit(CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=32, drafter="none",
                                          document="cancel"))
    while runner.forwards - start < 4 and not job.future.done():  # the prompt's chunks, then decode steps
        threading.Event().wait(0.001)
    job.cancel()
    result = job.result(timeout=60)
    assert result.stats.stopped == "cancelled"
    assert result.stats.forwards_after_cancel <= 1


def test_at_a_lines_indentation_the_model_writes_the_line_there(engine):
    """Each case's prefix ends at a statement's indentation. A prompt ending on the indentation token
    made the 0.5B indent again (shlex.py: `        self.debuglevel = 0`); healed, the prompt holds
    all but the last blank and the model's first token writes it with the statement's first word."""
    for name, prefix, suffix in fim_cases():
        request = CompletionRequest(prefix=prefix, suffix=suffix, scope="full", max_tokens=12, drafter="none",
                                    document=f"heal-{name}")
        assert prefix.endswith("    ") and engine.models.prompt_parts(request).healed == " "
        text = engine.complete(request).text
        assert text.strip() and not text[0].isspace(), (name, text)


def test_a_prompt_budget_larger_than_llama_cpps_context_is_fitted_to_it(engine):
    """contextTokens accepts far more than llama.cpp's context holds: such a request gets a prompt that
    fits, with room for the completion, instead of an error from llama_decode."""
    n_ctx = engine.models.target_runner.context_limit
    prefix = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(n_ctx // 4))
    result = engine.complete(CompletionRequest(prefix=prefix, scope="line", max_tokens=16, context_tokens=131072,
                                               document="huge-budget"))
    assert result.stats.stopped != "error" and result.stats.generated_tokens > 0
    assert n_ctx // 2 < result.stats.prompt_tokens <= n_ctx - 16 - 17
