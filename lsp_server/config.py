"""Server settings: what editors may configure, read from `initializationOptions` and
`workspace/didChangeConfiguration`.

Editors send these keys (camelCase, as in editor settings files), either at the top level or under a
`draftwise` section:

    target, draft, drafter, maxTokens, device, dtype, weights, draftWeights, temperature, contextTokens,
    languages, scope, alternatives, idleWork, maxTimeMs, repoContext, repoContextTokens

A bad value never takes the server down: that key keeps its previous value and the problem comes back
as one clear sentence for the user. Unknown keys are ignored (and logged by the caller).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from decoding.api import DRAFTERS, SCOPES, SUFFIXES, WEIGHT_FORMATS, EngineConfig

SECTION = "draftwise"
DTYPES = ("auto", "float32", "bfloat16", "float16")
_DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
MAX_TOKENS_LIMIT = 4096
CONTEXT_TOKENS_RANGE = (64, 131072)
TEMPERATURE_RANGE = (0.0, 2.0)
ALTERNATIVES_RANGE = (1, 10)
MAX_TIME_MS_RANGE = (0, 600_000)
REPO_CONTEXT_TOKENS_RANGE = (0, 65536)

# Changing any of these means other weights or another prompt builder (suffix): the engine reloads.
# (The prompt budget, drafter, max tokens and temperature travel with each request.)
ENGINE_FIELDS = ("target", "draft", "device", "dtype", "weights", "draft_weights", "suffix")


@dataclass(frozen=True)
class Settings:
    engine: EngineConfig = field(default_factory=EngineConfig)
    temperature: float = 0.0
    languages: tuple[str, ...] | None = None  # LSP language ids to complete in; None: all
    scope: str = "auto"  # passed to the engine with each request
    alternatives: int = 3  # most items for an explicitly invoked completion (the greedy one included)
    idle_work: bool = True  # start suggestions at pauses, read prompts ahead, prefetch after a shown one
    # Past this long a suggestion ends at its next line end (so a block shows its first lines fast;
    # prefetch brings the rest when they are taken); 0: no cap. The typing replay chose the value
    # (docs/performance.md, "Typing it back").
    max_time_ms: int = 150
    # The repository as context (decoding/repository/): definitions of the names near the cursor and
    # the most similar code of other files, in this many tokens of the prompt budget (at most half);
    # and the repository lookup drafter. False: other open files only, as context. None ("auto"): on
    # for the models where the bench measured that it pays (decoding/models/quality_gate.py).
    repo_context: bool | None = None
    repo_context_tokens: int = 512

    def repo_context_on(self, pays: bool) -> bool:
        """Whether requests get the repository as context: as set, or with "auto" where it pays for the
        loaded model (`pays`: the engine's verdict)."""
        return pays if self.repo_context is None else self.repo_context

    def serves_language(self, language_id: str) -> bool:
        return self.languages is None or language_id in self.languages

    def needs_reload(self, other: "Settings") -> bool:
        """Whether going from self to other needs a new engine (other models)."""
        return any(getattr(self.engine, f) != getattr(other.engine, f) for f in ENGINE_FIELDS)


@dataclass
class SettingsUpdate:
    settings: Settings
    problems: list[str] = field(default_factory=list)  # user-facing sentences, one per bad key
    ignored: list[str] = field(default_factory=list)  # unknown keys


class _Bad(ValueError):
    pass


def _text(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Bad(f"must be a non-empty string, got {value!r}")
    return value.strip()


def _draft(key: str, value: Any) -> str | None:
    if value is None:
        return None
    text = _text(key, value)
    return None if text.lower() == "none" else text


def _choice(options: tuple[str, ...]) -> Callable[[str, Any], str]:
    def parse(key: str, value: Any) -> str:
        if value not in options:
            raise _Bad(f"must be one of {', '.join(options)}; got {value!r}")
        return value
    return parse


def _int_range(low: int, high: int) -> Callable[[str, Any], int]:
    def parse(key: str, value: Any) -> int:
        # JSON has one number type; accept 64.0 but not 64.5, and never a bool (True == 1 in Python).
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or value != int(value):
            raise _Bad(f"must be a whole number from {low} to {high}, got {value!r}")
        if not low <= int(value) <= high:
            raise _Bad(f"must be a whole number from {low} to {high}, got {value!r}")
        return int(value)
    return parse


def _temperature(key: str, value: Any) -> float:
    low, high = TEMPERATURE_RANGE
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise _Bad(f"must be a number from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _device(key: str, value: Any) -> str:
    if not isinstance(value, str) or not _DEVICE.match(value.strip()):
        raise _Bad(f"must be auto, cpu, mps, cuda or cuda:N; got {value!r}")
    return value.strip()


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise _Bad(f"must be true or false, got {value!r}")
    return value


def _bool_or_auto(key: str, value: Any) -> bool | None:
    if value is None or value == "auto":
        return None
    if not isinstance(value, bool):
        raise _Bad(f"must be true, false or \"auto\", got {value!r}")
    return value


def _languages(key: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise _Bad(f"must be a list of language ids such as [\"python\", \"rust\"] (or null for all), got {value!r}")
    ids = tuple(v.strip() for v in value)
    return None if "*" in ids else ids


# key -> (parser, where the value goes: "engine.<field>" or a Settings field)
_KEYS: dict[str, tuple[Callable[[str, Any], Any], str]] = {
    "target": (_text, "engine.target"),
    "draft": (_draft, "engine.draft"),
    "drafter": (_choice(DRAFTERS), "engine.drafter"),
    "maxTokens": (_int_range(1, MAX_TOKENS_LIMIT), "engine.max_tokens"),
    "device": (_device, "engine.device"),
    "dtype": (_choice(DTYPES), "engine.dtype"),
    "weights": (_choice(WEIGHT_FORMATS), "engine.weights"),
    "draftWeights": (_choice(WEIGHT_FORMATS), "engine.draft_weights"),
    "contextTokens": (_int_range(*CONTEXT_TOKENS_RANGE), "engine.context_tokens"),
    "suffix": (_choice(SUFFIXES), "engine.suffix"),
    "temperature": (_temperature, "temperature"),
    "languages": (_languages, "languages"),
    "scope": (_choice(SCOPES), "scope"),
    "alternatives": (_int_range(*ALTERNATIVES_RANGE), "alternatives"),
    "idleWork": (_bool, "idle_work"),
    "maxTimeMs": (_int_range(*MAX_TIME_MS_RANGE), "max_time_ms"),
    "repoContext": (_bool_or_auto, "repo_context"),
    "repoContextTokens": (_int_range(*REPO_CONTEXT_TOKENS_RANGE), "repo_context_tokens"),
}
KNOWN_KEYS = tuple(_KEYS)


def section_of(raw: Any) -> Mapping[str, Any]:
    """The draftwise settings inside what an editor sent (top level or a `draftwise` section)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise TypeError(f"draftwise settings must be an object, got {type(raw).__name__}")
    inner = raw.get(SECTION)
    return inner if isinstance(inner, Mapping) else raw


def apply_settings(current: Settings, raw: Any) -> SettingsUpdate:
    """Apply the keys present in raw on top of current; bad or unknown keys leave current alone."""
    try:
        values = section_of(raw)
    except TypeError as err:
        return SettingsUpdate(current, problems=[str(err)])
    engine_changes: dict[str, Any] = {}
    server_changes: dict[str, Any] = {}
    update = SettingsUpdate(current)
    for key, value in values.items():
        if key not in _KEYS:
            update.ignored.append(key)
            continue
        parse, target = _KEYS[key]
        try:
            parsed = parse(key, value)
        except _Bad as err:
            update.problems.append(f"draftwise setting '{key}' {err}; keeping the previous value.")
            continue
        if target.startswith("engine."):
            engine_changes[target.removeprefix("engine.")] = parsed
        else:
            server_changes[target] = parsed
    update.settings = replace(current, engine=replace(current.engine, **engine_changes), **server_changes)
    return update
