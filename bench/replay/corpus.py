"""What the replay types: a region of each file, and the default files.

The default files are real code installed on this machine, found as the benchmark finds them
(`bench.corpus`: the Python standard library, site-packages, C headers, global npm
packages), so a replay needs no network. Paths in reports are shown relative to where the file was
found (`<stdlib>/json/decoder.py`), never as this machine's absolute paths.
"""
from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from bench.corpus import (  # the benchmark's notion of installed, hand-written source
    MIN_PREFIX_CHARS, CorpusError, _prose_lines, default_roots, language_of, list_files, read_source,
)

DEFAULT_LANGUAGES = ("python", "javascript", "typescript", "c", "cpp", "go", "rust", "lua")
FILES_PER_LANGUAGE = 2
DEFAULT_FILES = 6
CODE_MARKS = set("=(){}[];:")  # a line with none of these is most likely prose
COMMENT_STARTS = ("#", "//", "/*", "*", "--", '"""', "'''")


@dataclass(frozen=True)
class TypedRegion:
    path: str  # as shown in reports
    language: str  # LSP language id
    prefix: str  # the document as opened: prefix + suffix, the cursor between them
    suffix: str
    text: str  # what the user types back at the cursor
    line: int  # 1-based line where typing starts
    source: Path | None = None  # the file itself: typed at its own place when the replay has a workspace


def shown_path(path: Path) -> str:
    """The file relative to the installed-code root it lies under, or its name."""
    path = path.resolve()
    for marker in ("site-packages", "dist-packages", "node_modules"):
        if marker in path.parts[:-1]:  # any Python environment's packages, any npm tree
            cut = len(path.parts) - 1 - path.parts[::-1].index(marker)
            return f"<{marker}>/" + "/".join(path.parts[cut + 1:])
    paths = sysconfig.get_paths()
    roots = [("<stdlib>", paths.get("stdlib")), ("<include>", paths.get("include")),
              ("<npm-global>", "/usr/lib/node_modules"), ("<npm-global>", "/usr/local/lib/node_modules"),
              ("<include>", "/usr/include"), ("<include>", "/usr/local/include"), (".", str(Path.cwd()))]
    found = [(label, Path(root).resolve()) for label, root in roots if root]
    # The most specific root first (a folder inside another).
    for label, root in sorted(found, key=lambda item: -len(item[1].parts)):
        if path.is_relative_to(root):
            return f"{label}/{path.relative_to(root).as_posix()}"
    return path.name


def _looks_like_code(line: str) -> bool:
    stripped = line.strip()
    return bool(CODE_MARKS & set(stripped)) and not stripped.startswith(COMMENT_STARTS)


def _start_lines(lines: list[str], offsets: list[int], chars: int, text_len: int) -> list[int]:
    """Lines where typing can start: indented code with enough of the file before and after it."""
    return [i for i, line in enumerate(lines)
            if len(line.strip()) >= 8 and line[:1] in " \t" and _looks_like_code(line)
            and offsets[i] >= MIN_PREFIX_CHARS and offsets[i] + chars < text_len]


def pick_region(text: str, path: str, language: str, chars: int, rng: random.Random,
                source: Path | None = None) -> TypedRegion | None:
    """Whole lines from an indented code line on, at least `chars` characters (ending at a line's
    end), at least half of them code and none of them prose; typing starts after the first line's
    indentation, which stays in the document."""
    lines = text.split("\n")
    offsets = [0]
    for line in lines[:-1]:
        offsets.append(offsets[-1] + len(line) + 1)
    prose = _prose_lines(lines, language)  # docstrings and block comments
    starts = _start_lines(lines, offsets, chars, len(text))
    rng.shuffle(starts)
    for first in starts[:50]:
        start = offsets[first] + len(lines[first]) - len(lines[first].lstrip(" \t"))
        last = first
        while offsets[last] + len(lines[last]) - start < chars and last + 1 < len(lines):
            last += 1
        typed = [line for line in lines[first:last + 1] if line.strip()]
        if not prose & set(range(first, last + 1)) and sum(map(_looks_like_code, typed)) * 2 >= len(typed):
            end = offsets[last] + len(lines[last])
            return TypedRegion(path, language, text[:start], text[end:], text[start:end], first + 1, source)
    return None


def regions_of(files: list[Path], chars: int, seed: int) -> list[TypedRegion]:
    rng = random.Random(seed)
    regions = []
    for f in files:
        text = f.read_text(encoding="utf-8").replace("\r\n", "\n")
        language = language_of(f, text)
        if language is None:
            raise CorpusError(f"{f}: not a language the replay knows (by its extension)")
        region = pick_region(text, shown_path(f), language, chars, rng, f.resolve())
        if region is None:
            raise CorpusError(f"{f}: no indented code line with {chars} characters after it and "
                              f"{MIN_PREFIX_CHARS} before it")
        regions.append(region)
    return regions


def default_regions(chars: int, seed: int = 0, count: int = DEFAULT_FILES,
                    workspace: Path | None = None) -> list[TypedRegion]:
    """Regions of `count` installed source files (or files of `workspace`), dealt round-robin over the
    languages found (up to FILES_PER_LANGUAGE each), files and regions picked with a seeded RNG."""
    found = (list_files([workspace], DEFAULT_LANGUAGES, repository=True) if workspace is not None
             else list_files(default_roots(), DEFAULT_LANGUAGES))
    rng = random.Random(seed)
    per_language = count if workspace is not None else FILES_PER_LANGUAGE  # a package is mostly one language
    chosen: dict[str, list[TypedRegion]] = {}
    for language in [lang for lang in DEFAULT_LANGUAGES if found.get(lang)]:
        candidates = [f for f, _ in found[language]]
        rng.shuffle(candidates)
        chosen[language] = []
        for f in candidates[:200]:
            text = read_source(f)
            region = (pick_region(text, shown_path(f), language, chars, rng, f.resolve())
                      if text is not None and language_of(f, text) == language else None)
            if region is not None:
                chosen[language].append(region)
            if len(chosen[language]) == per_language:
                break
    picked: list[TypedRegion] = []  # one file of each language first, then a second of each
    for i in range(per_language):
        picked += [regions[i] for regions in chosen.values() if i < len(regions)]
    if len(picked) < count:
        where = f"in {workspace}" if workspace is not None else "installed"
        raise CorpusError(f"found only {len(picked)} usable source files {where}; pass files to replay")
    return picked[:count]
