"""After a partial word the real model's suggestion continues the word: it never begins with blanks or
a line end, and never types the letters before the cursor again (token healing, decoding/healing.py;
the server's last guard, lsp_server/postprocess.py). Cursors 1-3 letters into the first word of real
statements in installed Python, C and JavaScript files, as if the user had just typed them; the rest
of the line removed."""
from __future__ import annotations

import keyword
import re
import sysconfig
from pathlib import Path

import pytest
import pytest_asyncio
from lsprotocol import types

from bench.corpus import read_source, statement_starts
from lsp_harness import client_capabilities, inline_params, lsp_session, open_document, stats, wait_for_state

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.real_model]

STDLIB = Path(sysconfig.get_paths()["stdlib"])
INCLUDE = Path(sysconfig.get_paths()["include"])
NPM = next((p for p in (Path("/usr/lib/node_modules/npm"), Path("/usr/local/lib/node_modules/npm")) if p.is_dir()), None)
FILES = {
    "python": [STDLIB / name for name in ("shlex.py", "textwrap.py", "argparse.py", "dis.py")],
    "c": [INCLUDE / name for name in ("cpython/unicodeobject.h", "cpython/abstract.h", "cpython/pyerrors.h",
                                      "object.h")],
    "javascript": sorted((NPM / "lib").rglob("*.js"))[:40] if NPM else [],
}
CURSORS_PER_LANGUAGE = 18
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def mid_word_cursors(language: str) -> list[tuple[str, str, str, int, int]]:
    """(document, the word cut, the letters typed of it, line, column): statements' first words of 4+
    letters, cut 1-3 letters in."""
    out = []
    for path in FILES[language]:
        text = read_source(path) if path.is_file() else None
        if text is None:
            continue
        lines = text.split("\n")
        starts = [(i, c) for i, c in statement_starts(text, language)
                  if (m := WORD.match(lines[i], c)) and len(m.group()) >= 4 and not keyword.iskeyword(m.group())
                  and sum(len(x) + 1 for x in lines[:i]) > 1200]
        for i, c in starts[::max(1, len(starts) // 6)][:6]:
            word = WORD.match(lines[i], c).group()
            typed = 1 + len(out) % 3
            document = "\n".join(lines[:i] + [lines[i][:c + typed]] + lines[i + 1:])
            out.append((document, word, word[:typed], i, c + typed))
        if len(out) >= CURSORS_PER_LANGUAGE:
            break
    return out[:CURSORS_PER_LANGUAGE]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(real_model, tmp_path_factory):
    async with lsp_session(["--target", real_model], workspace=tmp_path_factory.mktemp("mid-word"),
                           capabilities=client_capabilities(encodings=["utf-16"]),
                           # no time cap, so the texts are the engine's own; a short prompt keeps it quick
                           initialization_options={"contextTokens": 512, "maxTimeMs": 0, "maxTokens": 24,
                                                   "idleWork": False}) as (client, _):
        assert (await wait_for_state(client))["state"] == "ready"
        yield client


async def test_a_suggestion_after_a_partial_word_continues_the_word(server):
    shown, languages, problems = 0, set(), []
    cases = [(lang, *case) for lang in FILES for case in mid_word_cursors(lang)]
    assert len(cases) >= 50, f"only {len(cases)} cursors found"
    for n, (language, document, word, letters, line, column) in enumerate(cases):
        uri = f"file:///mid-word/{n}.{ {'python': 'py', 'c': 'h', 'javascript': 'js'}[language] }"
        open_document(server, uri, document, language=language)
        result = await server.text_document_inline_completion_async(inline_params(uri, line, column))
        server.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri)))
        if not result or not result.items:
            continue
        text = result.items[0].insert_text
        text = text if isinstance(text, str) else text.value
        shown += 1
        languages.add(language)
        if text[:1].isspace():
            problems.append(f"{language} {word!r} typed {letters!r}: begins with a blank or line end: {text[:30]!r}")
        elif text.startswith(letters) and not word.startswith(letters + letters):
            problems.append(f"{language} {word!r} typed {letters!r}: types the letters again: {text[:30]!r}")
    counts = (await stats(server))["suggestions"]
    assert not problems, "\n".join(problems)
    assert counts["brokenWords"] == 0, counts  # healing is the cure: the server's guard had nothing to hide
    assert shown >= 0.6 * len(cases) and len(languages) >= 3, (shown, languages, counts)
