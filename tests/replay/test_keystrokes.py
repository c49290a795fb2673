"""The replayed user: typing rhythm and the rule for taking a suggestion."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from bench.replay.editor import NEOVIM, VSCODE
from bench.replay.keystrokes import (
    BURST_KEYS_PER_S, KEY_JITTER, PAUSE_MIN_S, accepted_text, keystroke_at, plan_keystrokes, split_keys,
)

REGION = "if x:\n        y = compute(x, 2)\n        return y\n    else:\n        return None"
CLIENTS = Path(__file__).resolve().parents[2] / "editor-clients"


def test_keys_cover_the_region_and_enter_brings_the_indentation():
    keys = split_keys(REGION)
    assert "".join(text for _, text in keys) == REGION
    assert ("\n        " in [text for _, text in keys])
    for (start, text), (next_start, _) in zip(keys, keys[1:]):
        assert start + len(text) == next_start


def test_the_plan_repeats_for_a_seed_and_differs_for_another():
    a = plan_keystrokes(REGION, random.Random(1))
    assert a == plan_keystrokes(REGION, random.Random(1))
    assert [k.delay_s for k in a] != [k.delay_s for k in plan_keystrokes(REGION, random.Random(2))]


def test_timing_is_human_bursts_with_pauses_after_enter():
    region = "\n".join(f"    value_{i} = compute(value_{i - 1}, {i})" for i in range(40))
    plan = plan_keystrokes(region, random.Random(0))
    fastest = KEY_JITTER[0] / BURST_KEYS_PER_S[1]
    assert all(k.delay_s >= fastest - 1e-9 for k in plan)
    after_enter = [k for prev, k in zip(plan, plan[1:]) if prev.text.startswith("\n")]
    assert after_enter and all(k.pause for k in after_enter)  # the user stops at the end of each line
    in_bursts = [k.delay_s for k in plan if not k.pause]
    rate = len(in_bursts) / sum(in_bursts)
    assert BURST_KEYS_PER_S[0] * 0.7 <= rate <= BURST_KEYS_PER_S[1] * 1.3
    random_pauses = [k for prev, k in zip(plan, plan[1:]) if k.pause and not prev.text.startswith("\n")]
    assert random_pauses  # and now and then in the middle of a line
    assert all(k.pause == (k.delay_s >= PAUSE_MIN_S) for k in plan)


def test_speed_divides_the_delays_and_keeps_the_pauses():
    slow, fast = (plan_keystrokes(REGION, random.Random(3), speed) for speed in (1.0, 4.0))
    assert [k.pause for k in slow] == [k.pause for k in fast]
    assert [round(k.delay_s / 4, 9) for k in slow] == [round(k.delay_s, 9) for k in fast]
    with pytest.raises(ValueError):
        plan_keystrokes(REGION, random.Random(3), 0)


def test_after_a_suggestion_typing_resumes_at_the_key_that_covers_the_offset():
    plan = plan_keystrokes(REGION, random.Random(0))
    for offset in range(len(REGION)):
        key = plan[keystroke_at(plan, offset)]
        assert key.start <= offset < key.end


@pytest.mark.parametrize("insert, typed, upcoming, taken", [
    ("compute(x, 2)", "", "compute(x, 2)\n        return y", "compute(x, 2)"),  # all of it comes next
    ("compute(x, 2)", "comp", "ute(x, 2)\n", "ute(x, 2)"),  # typed along it since it was made
    ("compute(x, 3)", "", "compute(x, 2)", None),  # wrong somewhere: keep typing
    ("compute(x, 2)\n        return y\n", "", "compute(x, 2)\n        return y", None),  # runs past what comes
    ("compute", "cx", "ompute", None),  # typed something else since
    ("comp", "comp", "ute", None),  # nothing left to take
])
def test_a_suggestion_is_taken_only_when_all_of_it_is_what_comes_next(insert, typed, upcoming, taken):
    assert accepted_text(insert, typed, upcoming) == taken


def test_client_debounces_are_the_editor_clients_own():
    init = (CLIENTS / "neovim/lua/draftwise/init.lua").read_text()
    assert int(re.search(r"debounce_ms = (\d+)", init).group(1)) == round(NEOVIM.debounce_s * 1000)
    extension = (CLIENTS / "vscode/src/extension.ts").read_text()
    assert "debounce" not in extension.lower()  # VS Code's own 50 ms is the only one
    assert VSCODE.debounce_s == 0.050
    # Both keep a suggestion typed along (the Neovim plugin's carry, tests/editors/nvim.test.mjs).
    assert VSCODE.keeps_ghost_typing_along and NEOVIM.keeps_ghost_typing_along
