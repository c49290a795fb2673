"""Cross-file cases: the removed line uses a name defined in *another* file of the same package, and
the file's imports say so (Python and JavaScript import the name from that module; C and C++ include
the header defining it), as CrossCodeEval finds cross-file uses by static analysis; the code above the
cursor names it (an import or an earlier use). The whole package is the workspace. Scored with and
without the repository context (decoding/repository/), and the lookup drafter's acceptance with and
without the repository's text.

Packages come from code installed on the machine (corpus.default_roots(): site-packages, C headers,
global npm packages) or from `--corpus`: a package is a directory directly under a root (a Python
distribution, a header directory, an npm package) with at least MIN_PACKAGE_FILES files of one
language.
"""
from __future__ import annotations

import random
import re
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from bench.corpus import (KEEP_PREFIX_CHARS, KEEP_SUFFIX_CHARS, MIN_PREFIX_CHARS, Case, default_roots,
                                   language_of, list_files, read_source, sample_cases)
from bench.metrics import RunRecord, paired_difference
from decoding.repository.files import FileLimits
from decoding.repository.index import WorkspaceIndex, family
from decoding.repository.imports import parse_imports
from decoding.repository.selection import imported_definition, select

MIN_PACKAGE_FILES = 4
CASES_PER_PACKAGE = 2
MIN_NAME_CHARS = 4
REPO_CONTEXT_TOKENS = 512  # the server's default share of the prompt budget (lsp_server/config.py)
_INDEX_LIMITS = FileLimits(max_files=1500, max_total_bytes=24 * 1024 * 1024)


@dataclass(frozen=True)
class CrossFileCase:
    case: Case
    package: Path  # the workspace
    name: str  # the name the removed line uses, defined in another file of the package
    defined_in: str
    # the whole text before the cursor, which the server's context selection reads (its imports may lie
    # above the prompt's prefix, which keeps the last KEEP_PREFIX_CHARS)
    before: str = ""


def _deepest_first(roots: Sequence[Path]) -> list[Path]:
    return sorted({r.resolve() for r in roots}, key=lambda p: -len(p.parts))


def _package_of(path: Path, roots: Sequence[Path]) -> Path | None:
    """The package directory holding `path`: the top folder under the deepest root containing it (roots
    deepest first); None for a file outside the roots or lying directly in one."""
    root = next((r for r in roots if r in path.parents), None)
    if root is None:
        return None
    top = root / path.relative_to(root).parts[0]
    return top if top.is_dir() else None


def _index_of(package: Path, indexes: dict[Path, WorkspaceIndex]) -> WorkspaceIndex:
    """The package's workspace index, built once (and waited for) per benchmark run."""
    index = indexes.get(package)
    if index is None:
        index = indexes[package] = WorkspaceIndex(_INDEX_LIMITS)
        index.start([str(package)])
        index.built.wait()
    return index


def packages(roots: Sequence[Path], languages: Sequence[str] | None) -> dict[str, list[Path]]:
    """language -> package directories with enough files of it, sorted."""
    files = list_files(roots, languages, repository=True)
    roots = _deepest_first(roots)
    counts: dict[tuple[str, Path], int] = {}
    for language, entries in files.items():
        for path, _ in entries:
            top = _package_of(path, roots)
            if top is not None:
                counts[(language, top)] = counts.get((language, top), 0) + 1
    out: dict[str, list[Path]] = {}
    for (language, top), n in sorted(counts.items(), key=lambda kv: str(kv[0][1])):
        if n >= MIN_PACKAGE_FILES:
            out.setdefault(language, []).append(top)
    return out


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_USED = re.compile(r"(?<![\w.])[A-Za-z_]\w*")


_COMMENT = re.compile(r"/\*.*?(?:\*/|$)|//.*|#(?!\s*(?:include|define|if|endif|else|elif|undef|pragma)\b).*")


def _names_used(line: str) -> list[str]:
    """Names a line uses as names: not inside a string literal or a comment, not an attribute after a dot."""
    return _USED.findall(_COMMENT.sub("", _STRING.sub('""', line)))


def _cases_in(index: WorkspaceIndex, package: Path, language: str, rng: random.Random,
              want: int) -> list[CrossFileCase]:
    files = [f for f in index.files.values() if family(f.language) == family(language)]
    rng.shuffle(files)
    out: list[CrossFileCase] = []
    for f in files:
        if len(out) >= want:
            break
        text = read_source(package / f.path)
        if text is None or language_of(package / f.path, text) != language:
            continue
        defined_here = {d.name for d in f.definitions}
        lines = text.split("\n")
        offsets = [0]
        for line in lines[:-1]:
            offsets.append(offsets[-1] + len(line) + 1)
        candidates = []
        imports = None
        for i, line in enumerate(lines):
            above = None  # the imports above this line, read once it has a name the whole file imports
            stripped = line.strip()
            if offsets[i] < MIN_PREFIX_CHARS or not stripped or stripped.startswith(("#", "//", "*", "/*")):
                continue
            before = text[max(0, offsets[i] - 4000):offsets[i]]
            if before.rfind("/*") > before.rfind("*/") or before.count('"""') % 2:
                continue  # inside a block comment or a docstring: prose, not a use of the name
            for name in _names_used(stripped):
                if len(name) < MIN_NAME_CHARS or name in defined_here or not index.defined(name):
                    continue
                # the file's imports reach the name's definition in another file: a cross-file use, not a
                # namesake (a keyword argument, a local, a builtin that some other file also defines);
                # and the code above the cursor names it (an import or an earlier use), as code using it does
                imports = imports or parse_imports(text, language)
                if imported_definition(index, name, f.path, language, imports) is None:
                    continue  # (cheap: the whole file's imports; then those above the cursor)
                above = above or parse_imports(text[:offsets[i]], language)
                d = imported_definition(index, name, f.path, language, above)
                if d is not None and re.search(rf"\b{re.escape(name)}\b",
                                               text[max(0, offsets[i] - KEEP_PREFIX_CHARS):offsets[i]]):
                    candidates.append((i, name, d.path))
                    break
        if not candidates:
            continue
        i, name, defined_in = candidates[rng.randrange(len(candidates))]
        indent = len(lines[i]) - len(lines[i].lstrip())
        cursor, end = offsets[i] + indent, offsets[i] + len(lines[i].rstrip())
        prefix = text[:cursor][-KEEP_PREFIX_CHARS:]
        case = Case(id=f"{language}:{package.name}/{f.path}:{i + 1}:crossfile", language=language,
                    kind="crossfile", path=f.path, source=str(package / f.path), line=i + 1,
                    prefix=prefix, suffix=text[end:end + KEEP_SUFFIX_CHARS], expected=text[cursor:end])
        out.append(CrossFileCase(case, package, name, defined_in, text[:cursor]))
    return out


def crossfile_cases(limit: int, seed: int = 0, languages: Sequence[str] | None = None,
                    corpus: str | None = None) -> tuple[list[CrossFileCase], dict[Path, WorkspaceIndex]]:
    """`limit` cases dealt round-robin over the languages, at most CASES_PER_PACKAGE per package; with
    the index of each package used (the workspace the server would have)."""
    roots = [Path(corpus).expanduser().resolve()] if corpus else default_roots()
    found = packages(roots, languages)
    rng = random.Random(seed)
    for dirs in found.values():
        rng.shuffle(dirs)
    indexes: dict[Path, WorkspaceIndex] = {}
    cases: list[CrossFileCase] = []
    order = sorted(found)
    cursors = {language: 0 for language in order}
    while len(cases) < limit and any(cursors[lang] < len(found[lang]) for lang in order):
        for language in order:
            if len(cases) >= limit or cursors[language] >= len(found[language]):
                continue
            package = found[language][cursors[language]]
            cursors[language] += 1
            cases += _cases_in(_index_of(package, indexes), package, language, rng, min(CASES_PER_PACKAGE, limit - len(cases)))
    return cases, indexes


def corpus_cases_in_workspaces(limit: int, seed: int = 0, languages: Sequence[str] | None = None,
                               corpus: str | None = None) -> tuple[list[CrossFileCase], dict[Path, WorkspaceIndex]]:
    """`limit` cases of the ordinary bench corpus (bench/corpus.py: not chosen for using another
    file), each with its package as the workspace, as the cross-file cases have: what the repository
    context does to completions in general. A case whose file is not inside a package (a module lying
    directly in a root) has no workspace and is passed over."""
    roots = _deepest_first([Path(corpus).expanduser()] if corpus else default_roots())
    indexes: dict[Path, WorkspaceIndex] = {}
    out: list[CrossFileCase] = []
    for c in sample_cases(limit * 2, seed=seed, languages=languages, corpus=corpus):
        if len(out) >= limit:
            break
        source = Path(c.source).resolve()
        package = _package_of(source, roots)
        text = read_source(source) if package is not None else None
        if text is None:
            continue
        # the whole text above the cursor (the case keeps only the prompt's tail): the selection reads its imports
        cursor = sum(len(line) + 1 for line in text.split("\n")[:c.line - 1]) + len(c.prefix.split("\n")[-1])
        before = text[:cursor] if text[:cursor].endswith(c.prefix) else c.prefix
        _index_of(package, indexes)
        relative = source.relative_to(package).as_posix()  # the selection leaves the case's own file out
        out.append(CrossFileCase(replace(c, path=relative), package, "", "", before))
    return out, indexes


def _record(result, mode: str, case: Case, total_ms: float) -> RunRecord:
    s = result.stats
    return RunRecord(mode=mode, case_id=case.id, language=case.language, text=result.text,
                     prompt_tokens=s.prompt_tokens, generated_tokens=s.generated_tokens,
                     decode_tokens=s.generated_tokens, prefill_ms=s.prefill_ms, first_token_ms=s.first_token_ms,
                     decode_ms=s.decode_ms, total_ms=total_ms, target_forwards=s.target_forwards,
                     drafted_tokens=s.drafted_tokens, accepted_tokens=s.accepted_tokens,
                     drafted_by=dict(s.drafted_by), stopped=s.stopped).score(case.expected)


def run_plan(fmt: str, contexts: Sequence[str], lookup: bool = True) -> list[tuple[str, str, bool, bool]]:
    """(row, drafter, with the repository context, with the repository index) for each run of a case.
    Rows are MODE@FORMAT, MODE@FORMAT+context (lookup with the index, as the server runs it) and,
    to tell the index's share apart, lookup@FORMAT+context-index. lookup=False: the plain rows only
    (quality alone: the lookup rows write the same text)."""
    plan = []
    if "off" in contexts:
        plan += [(f"none@{fmt}", "none", False, False)]
        if lookup:
            plan += [(f"lookup@{fmt}", "lookup", False, False)]
    if "on" in contexts:
        plan += [(f"none@{fmt}+context", "none", True, False)]
        if lookup:
            plan += [(f"lookup@{fmt}+context", "lookup", True, True), (f"lookup@{fmt}+context-index", "lookup", True, False)]
    return plan


def run_crossfile(engine, cases: Sequence[CrossFileCase], indexes: dict[Path, WorkspaceIndex],
                  max_tokens: int = 48, progress: Callable[[str], None] = lambda _: None,
                  contexts: Sequence[str] = ("off", "on"), lookup: bool = True) -> dict:
    """Each case once per row of run_plan, each from a cold cache (greedy: the lookup rows write the
    text of their plain row; they differ in time, acceptance and tokens per forward)."""
    from decoding.api import CompletionRequest

    plan = run_plan(engine.info()["weights"], contexts, lookup)
    runs: dict[str, dict[str, RunRecord]] = {row: {} for row, *_ in plan}
    shown = {}
    for x in cases:
        c = x.case
        selection = select(indexes[x.package], c.path, c.language, x.before or c.prefix, REPO_CONTEXT_TOKENS)
        shown[c.id] = {"sections": selection.describe(), "defines": x.name, "defined_in": x.defined_in,
                       "shown": any(s["why"] == f"defines {x.name}" for s in selection.describe())}
        for row, drafter, context, index in plan:
            extra = dict(context=tuple(selection.context_files()), context_reserve_tokens=REPO_CONTEXT_TOKENS,
                         repo=x.package.name) if context else {}
            if index:
                extra["lookup_texts"] = selection.lookup_texts
            progress(f"{row} {c.language}")
            engine.clear_caches()
            started = time.perf_counter()
            result = engine.complete(CompletionRequest(
                document=f"crossfile-{row}-{c.id}", prefix=c.prefix, suffix=c.suffix, path=c.path,
                language=c.language, max_tokens=max_tokens, scope="full", temperature=0.0, drafter=drafter, **extra))
            runs[row][c.id] = _record(result, row, c, (time.perf_counter() - started) * 1000)
    return {"cases": [dict(x.case.to_dict(), package=x.package.name, **shown[x.case.id]) for x in cases],
            "rows": [row for row, *_ in plan], "summary": summarize_crossfile(runs),
            "runs": {row: [r.to_dict() for r in rs.values()] for row, rs in runs.items()}}


def summarize_crossfile(runs: dict[str, dict[str, RunRecord]]) -> dict:
    out = {}
    for mode, records in runs.items():
        ok = [r for r in records.values() if r.ok]
        if not ok:
            continue
        drafted = sum(r.drafted_tokens or 0 for r in ok)
        accepted = sum(r.accepted_tokens or 0 for r in ok)
        forwards = sum(r.target_forwards for r in ok)
        out[mode] = {
            "cases": len(ok),
            "first_line_exact": round(sum(bool(r.first_line_exact) for r in ok) / len(ok), 3),
            "similarity_median": round(statistics.median(r.similarity or 0 for r in ok), 3),
            "prompt_tokens_median": statistics.median(r.prompt_tokens for r in ok),
            "total_ms_median": round(statistics.median(r.total_ms for r in ok), 1),
            "drafted": drafted, "accepted": accepted,
            "acceptance": round(accepted / drafted, 3) if drafted else None,
            "tokens_per_forward": round(sum(r.generated_tokens for r in ok) / forwards, 3) if forwards else None,
            "repo_drafted": sum(r.drafted_by.get("repo", 0) for r in ok),
            "by_language": {lang: round(sum(bool(r.first_line_exact) for r in ok if r.language == lang) /
                                        max(1, sum(r.language == lang for r in ok)), 3)
                            for lang in sorted({r.language for r in ok})},
        }
    plain = next((rs for row, rs in runs.items() if row.startswith("none@") and "+" not in row), {})
    repo = next((rs for row, rs in runs.items() if row.startswith("none@") and row.endswith("+context")), {})
    both = [k for k in plain if k in repo and plain[k].ok and repo[k].ok]
    if both:
        out["paired"] = {"cases": len(both),
                         "repo_right_plain_wrong": sum(bool(repo[k].first_line_exact) and not plain[k].first_line_exact
                                                       for k in both),
                         "plain_right_repo_wrong": sum(bool(plain[k].first_line_exact) and not repo[k].first_line_exact
                                                       for k in both),
                         # the context's gain in first-line exact, points, with a 95% interval and McNemar's p
                         "difference": paired_difference({k: repo[k] for k in both}, {k: plain[k] for k in both})}
    def plain_of(row: str) -> str:  # lookup@int8+context-index -> none@int8+context
        return "none@" + row.split("@", 1)[1].removesuffix("-index")

    # Greedy: every drafter writes its plain row's text, the repository index included.
    out["lookup_identical_text"] = all(
        runs[row][k].text == runs[plain_of(row)][k].text for row in runs
        if row.startswith("lookup@") and plain_of(row) in runs for k in runs[row] if k in runs[plain_of(row)])
    return out

