"""Fault injection for reliability tests: DRAFTWISE_FAULTS=name[:count],...

Faults that cannot be produced on demand on a test machine (running out of memory while loading or
generating, a draft model that breaks while the target loads) are raised at the place where the
real failure would surface, so tests exercise the real recovery path. Off unless the variable is set.

- target_load_oom   : loading the target raises MemoryError
- draft_load_error  : loading the draft model fails (the server must serve without it)
- generate_oom[:N]  : the next N requests run out of memory as they start generating (default: 1)
- remote_stream_left_open : a cancel does not reach the remote engine's stream, which is read on to
                     its end instead of closed (what the vLLM cancel tests must catch: the server
                     then goes on generating)
"""
from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_remaining: dict[str, int] | None = None


def _table() -> dict[str, int]:
    global _remaining
    if _remaining is None:
        _remaining = {}
        for item in filter(None, (x.strip() for x in os.environ.get("DRAFTWISE_FAULTS", "").split(","))):
            name, _, count = item.partition(":")
            _remaining[name] = int(count) if count.isdigit() else (1 if name == "generate_oom" else 1 << 30)
    return _remaining


def trip(name: str) -> bool:
    """True (and one use spent) when fault `name` is armed."""
    with _lock:
        table = _table()
        if table.get(name, 0) > 0:
            table[name] -= 1
            return True
    return False


def reset() -> None:
    global _remaining
    with _lock:
        _remaining = None
