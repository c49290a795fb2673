"""How the replayed user types: the keystrokes of a region with human timing, and when they take a
suggestion.

Timing is drawn from one seeded `random.Random`, so a run repeats exactly and the runs compared side
by side (idle work on and off, llama.cpp) see the same keystrokes at the same moments:

- keys come in bursts of a few to a dozen keys, each burst at its own pace of 5–12 keys a second;
- after Enter the user stops to think about the next line (a pause of about 1–2.5 s);
- between bursts they hesitate briefly, and now and then stop for longer (a pause at random).

Enter is one keystroke that also brings the next line's indentation, as an editor's auto-indent does.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

BURST_KEYS = (4, 14)  # keys in a burst
BURST_KEYS_PER_S = (5.0, 12.0)  # each burst's pace
KEY_JITTER = (0.7, 1.3)  # one key's interval around its burst's pace
LINE_END_PAUSE_S = (0.9, 2.5)  # after Enter
RANDOM_PAUSE_S = (0.6, 2.0)  # at the end of some bursts
RANDOM_PAUSE_CHANCE = 0.3
HESITATION_S = (0.25, 0.45)  # at the end of the other bursts: too short to wait for a suggestion
PAUSE_MIN_S = 0.5  # a gap at least this long is a pause: the user looks at the screen
REACTION_S = 0.25  # a suggestion must have been on screen this long before the user can take it


@dataclass(frozen=True)
class Keystroke:
    start: int  # offset in the region where this key's text begins
    text: str  # one character, or a line break plus the next line's indentation
    delay_s: float  # after the previous keystroke (for the first: after the file was opened)
    pause: bool  # the delay is a pause: the user stopped and looks for a suggestion

    @property
    def end(self) -> int:
        return self.start + len(self.text)


def split_keys(region: str) -> list[tuple[int, str]]:
    """(offset, text) of each keystroke: one per character, except that a line break takes the
    following indentation with it."""
    keys: list[tuple[int, str]] = []
    i = 0
    while i < len(region):
        j = i + 1
        if region[i] == "\n":
            while j < len(region) and region[j] in " \t":
                j += 1
        keys.append((i, region[i:j]))
        i = j
    return keys


def plan_keystrokes(region: str, rng: random.Random, speed: float = 1.0) -> list[Keystroke]:
    """The keystrokes that type `region`, with their delays divided by `speed`."""
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    plan: list[Keystroke] = []
    burst_left, pace = 0, 1.0
    # The delay before the next key when it starts a burst. The first key comes after a pause: the
    # user has just put the cursor there and looks at the screen.
    gap = rng.uniform(*LINE_END_PAUSE_S)
    for start, text in split_keys(region):
        if burst_left == 0:
            burst_left = rng.randint(*BURST_KEYS)
            pace = rng.uniform(*BURST_KEYS_PER_S)
            delay = gap or rng.uniform(*KEY_JITTER) / pace
        else:
            delay = rng.uniform(*KEY_JITTER) / pace
        plan.append(Keystroke(start, text, delay / speed, delay >= PAUSE_MIN_S))
        burst_left -= 1
        gap = 0.0
        if text.startswith("\n"):
            burst_left, gap = 0, rng.uniform(*LINE_END_PAUSE_S)
        elif burst_left == 0:
            gap = (rng.uniform(*RANDOM_PAUSE_S) if rng.random() < RANDOM_PAUSE_CHANCE
                   else rng.uniform(*HESITATION_S))
    return plan


def keystroke_at(plan: list[Keystroke], offset: int) -> int:
    """Index of the keystroke that types the character at `offset` (after an accepted suggestion the
    user carries on from wherever it ended, possibly inside a line break's indentation)."""
    lo, hi = 0, len(plan) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if plan[mid].start <= offset:
            lo = mid
        else:
            hi = mid - 1
    return lo


def accepted_text(insert_text: str, typed_in_range: str, upcoming: str) -> str | None:
    """What Tab adds at the cursor when the user takes this suggestion, or None when they would not.

    `typed_in_range` is the document text from the item's range start to the cursor (what the user
    typed since the suggestion was made), `upcoming` what they are about to type. The user takes a
    suggestion only when all of its rest is a prefix of what they were going to type anyway."""
    if not insert_text.startswith(typed_in_range):
        return None
    rest = insert_text[len(typed_in_range):]
    if not rest or not upcoming.startswith(rest):
        return None
    return rest
