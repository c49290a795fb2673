"""Stop rules: where a completion ends, in the shapes editors actually produce."""
from __future__ import annotations

import copy
import random
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decoding import code_lines
from decoding.languages import facts_for, known_languages, language_from_path, normalize_language
from decoding.stop_rules import StopRules, resolve_scope


def complete(prefix: str, suffix: str, language: str, generated: str, scope: str = "auto",
             chunk_sizes=(1,)) -> str:
    """What the engine keeps when the model writes `generated` a few characters per step (the
    sizes cycle through `chunk_sizes`) and then ends its sequence."""
    rules = StopRules.for_request(prefix, suffix, language, scope)
    position, step = 0, 0
    while position < len(generated):
        position = min(len(generated), position + chunk_sizes[step % len(chunk_sizes)])
        step += 1
        kept = rules.check(generated[:position])
        if kept is not None:
            return generated[:kept]
    return generated[: rules.finish(generated)]


GOLDEN = [
    # --- Python ---
    pytest.param(
        "python", "def add(a, b):", "\n\n\ndef sub(a, b):\n    return a - b\n",
        "\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n",
        "\n    return a + b", id="py-body-ends-at-dedent",
    ),
    pytest.param(
        "python", "class Stack:\n    def push(self, item):\n        ", "\n\n    def pop(self):\n",
        "self.items.append(item)\n        return self\n\n    def pop(self):\n        pass\n",
        "self.items.append(item)\n        return self", id="py-method-ends-before-next-method",
    ),
    pytest.param(
        "python", "def total(xs):\n    result = 0\n", "\n    return result\n",
        "    for x in xs:\n        result += x\n    return result\n",
        "    for x in xs:\n        result += x", id="py-suffix-line-repeated",
    ),
    pytest.param(
        "python", "def f(x):\n    y = 1\n", "    return y\n",
        "    y += 2\n    return y\n",
        "    y += 2\n", id="py-cursor-before-existing-line-keeps-newline",
    ),
    pytest.param(
        "python", "value = compute(", ")\n", "a, b)\nprint(value)\n",
        "a, b", id="py-rest-of-line-repeated",
    ),
    pytest.param(
        "python", "value = compute(", ")\n", "round(a, b)\nprint(value)\n",
        "round(a, b)", id="py-rest-of-line-needed-for-own-bracket",
    ),
    pytest.param(
        "python", "value = compute(", ")\n", "a, b)",
        "a, b", id="py-rest-of-line-repeated-at-end-of-sequence",
    ),
    pytest.param(
        "python", "total = price * ", " + shipping\n", "quantity + shipping\nprint(total)",
        "quantity", id="py-line-scope-mid-line",
    ),
    pytest.param(
        "python", "@app.route('/')", "",
        "\ndef index():\n    return 'home'\n\n\n"
        "# The about page.\n@app.route('/about')\ndef about():\n",
        "\ndef index():\n    return 'home'", id="py-decorator-then-new-definition",
    ),
    pytest.param(
        "python", "def area(r):\n    ", "\n",
        '"""Area of a circle.\n\nExample at column 0 inside the docstring.\n    """\n'
        "    return 3.14159 * r * r\n\nprint(area(2))\n",
        '"""Area of a circle.\n\nExample at column 0 inside the docstring.\n    """\n'
        "    return 3.14159 * r * r",
        id="py-docstring-lines-are-not-dedents",
    ),
    pytest.param(
        "python", "COLORS = {", "", "\n    'red': 1,\n    'blue': 2,\n}\n\nprint(COLORS)\n",
        "\n    'red': 1,\n    'blue': 2,\n}", id="py-closing-bracket-kept-when-missing",
    ),
    pytest.param(
        "python", "COLORS = {", "\n}\n", "\n    'red': 1,\n    'blue': 2,\n}\n\nprint(COLORS)\n",
        "\n    'red': 1,\n    'blue': 2,", id="py-closing-bracket-dropped-when-present",
    ),
    pytest.param(
        "python", "import os\n", "", "import sys\n\n\ndef main():\n    pass\n",
        "import sys", id="py-full-scope-stops-at-top-level-def",
    ),
    # --- JavaScript / TypeScript ---
    pytest.param(
        "javascript", "function add(a, b) {", "\n}\n",
        "\n  return a + b;\n}\n\nfunction sub(a, b) {\n",
        "\n  return a + b;", id="js-closing-brace-in-document",
    ),
    pytest.param(
        "typescript", "fetchUser(id).then(function (user) {", "",
        "\n  console.log(user.name);\n  return user;\n});\n\nexport function other() {}\n",
        "\n  console.log(user.name);\n  return user;\n});", id="ts-callback-closer-kept",
    ),
    pytest.param(
        "typescript", "fetchUser(id).then(function (user) {", "\n});\n",
        "\n  console.log(user.name);\n  return user;\n});\n",
        "\n  console.log(user.name);\n  return user;", id="ts-callback-closer-in-document",
    ),
    pytest.param(
        "javascript", "const total = items.", ".length;\n",
        "filter((item) => item.ok).length;\nconsole.log(total);\n",
        "filter((item) => item.ok)", id="js-line-scope-rest-of-line",
    ),
    pytest.param(
        "typescript", "import { a } from './a';\n", "",
        "import { b } from './b';\n\nexport function f(): number {\n  return 1;\n}\n",
        "import { b } from './b';", id="ts-full-scope-stops-at-export",
    ),
    pytest.param(
        "javascript", "function page() {\n  return `", "\n}\n",
        "\n<main>\n  <h1>Title</h1>\n</main>`;\n}\n",
        "\n<main>\n  <h1>Title</h1>\n</main>`;", id="js-template-literal-lines-are-not-dedents",
    ),
    pytest.param(
        "typescriptreact", "export function App() {\n  if (loading) {", "\n  return <Main />;\n}\n",
        "\n    return <Spinner />;\n  } else {\n    return null;\n  }\n",
        "\n    return <Spinner />;\n  }", id="tsx-if-closer-kept-else-cut",
    ),
    pytest.param(
        "javascript", "const points = [\n  {", "\n];\n",
        "\n    x: 1,\n  }, {\n    x: 2,\n  },\n];\n",
        "\n    x: 1,\n  },", id="js-array-element-closer-kept",
    ),
    # --- Go ---
    pytest.param(
        "go", "type Point struct {", "",
        "\n\tX int\n\tY int\n}\n\nfunc (p Point) Norm() float64 {\n",
        "\n\tX int\n\tY int\n}", id="go-struct-with-tabs",
    ),
    pytest.param(
        "go", "func add(a, b int) int {\n\tsum := a + b\n", "\treturn sum\n}\n",
        "\tsum *= 2\n\treturn sum\n}\n",
        "\tsum *= 2\n", id="go-insert-before-existing-line",
    ),
    pytest.param(
        "go", "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hi\")\n}\n", "",
        "\nfunc helper() int {\n\treturn 1\n}\n\nfunc other() {\n",
        "\nfunc helper() int {\n\treturn 1\n}", id="go-full-scope-stops-at-next-func",
    ),
    pytest.param(
        "go", "func sign(x int) int {\n\tswitch {\n\tcase x > 0:", "\n\t}\n\treturn 0\n}\n",
        "\n\t\treturn 1\n\tcase x < 0:\n\t\treturn -1\n\t}\n",
        "\n\t\treturn 1", id="go-case-body",
    ),
    # --- Rust ---
    pytest.param(
        "rust", "impl Stack {\n    pub fn push(&mut self, x: i32) {", "\n}\n",
        "\n        self.items.push(x);\n    }\n\n    pub fn pop(&mut self) -> Option<i32> {\n",
        "\n        self.items.push(x);\n    }", id="rust-method-closer-kept",
    ),
    pytest.param(
        "rust", "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n", "",
        "\n#[test]\nfn adds() {\n    assert_eq!(add(1, 2), 3);\n}\n\n"
        "#[test]\nfn adds_negative() {\n",
        "\n#[test]\nfn adds() {\n    assert_eq!(add(1, 2), 3);\n}",
        id="rust-attribute-moves-with-next-fn",
    ),
    pytest.param(
        "rust", "fn main() {\n    let v = vec![1, 2, 3];\n    let total: i32 = v.iter().", ";\n}\n",
        "sum();\n    println!(\"{}\", total);\n",
        "sum()", id="rust-rest-of-line",
    ),
    # --- C ---
    pytest.param(
        "c", "int main(void) {\n    int x = 1;\n", "    return 0;\n}\n",
        "    x += 2;\n#ifdef DEBUG\n    printf(\"%d\\n\", x);\n#endif\n    return 0;\n}\n",
        "    x += 2;\n#ifdef DEBUG\n    printf(\"%d\\n\", x);\n#endif\n",
        id="c-preprocessor-lines-are-not-dedents",
    ),
    pytest.param(
        "c", "#include <stdio.h>\n\nstatic int square(int x) {", "",
        "\n    return x * x; /* { */\n}\n\nint main(void) {\n",
        "\n    return x * x; /* { */\n}", id="c-function-closer-kept",
    ),
    pytest.param(
        "c", "#include <stdio.h>\n", "",
        "#include <stdlib.h>\n\nint main(void) {\n    return 0;\n}\n",
        "#include <stdlib.h>", id="c-full-scope-stops-at-int-main",
    ),
    # --- Lua ---
    pytest.param(
        "lua", "local function add(a, b)", "",
        "\n  return a + b\nend\n\nlocal function sub(a, b)\n",
        "\n  return a + b\nend", id="lua-function-end-kept",
    ),
    pytest.param(
        "lua", "local function add(a, b)", "\nend\n",
        "\n  return a + b\nend\n\nreturn M\n",
        "\n  return a + b", id="lua-function-end-in-document",
    ),
    pytest.param(
        "lua", "local function abs(x)\n  if x < 0 then", "\nend\n",
        "\n    return -x\n  else\n    return x\n  end\nend\n",
        "\n    return -x", id="lua-else-ends-then-branch",
    ),
    pytest.param(
        "lua", "local i = 0\nrepeat", "",
        "\n  i = i + 1\nuntil i >= 10\nprint(i)\n",
        "\n  i = i + 1\nuntil i >= 10", id="lua-repeat-until-kept",
    ),
    pytest.param(
        "lua", "local handlers = {\n  on_open = function(event)", "\n}\n",
        "\n    log(event)\n  end,\n  on_close = function(event)\n",
        "\n    log(event)\n  end,", id="lua-anonymous-function-end-comma",
    ),
    # --- Ruby / shell ---
    pytest.param(
        "ruby", "class Greeter\n  def greet(name)", "\nend\n",
        "\n    \"Hello, #{name}\"\n  end\n\n  def bye\n",
        "\n    \"Hello, #{name}\"\n  end", id="ruby-method-end-kept",
    ),
    pytest.param(
        "shellscript", "for f in *.txt; do", "",
        "\n  echo \"$f # not a comment\"\ndone\necho finished\n",
        "\n  echo \"$f # not a comment\"\ndone", id="sh-done-kept",
    ),
]


@pytest.mark.parametrize(("language", "prefix", "suffix", "generated", "expected"), GOLDEN)
def test_golden(language, prefix, suffix, generated, expected):
    assert complete(prefix, suffix, language, generated) == expected


@pytest.mark.parametrize(("language", "prefix", "suffix", "generated", "expected"), GOLDEN)
def test_golden_is_the_same_with_speculative_steps(language, prefix, suffix, generated, expected):
    for sizes in ((3,), (7, 1, 4), (64,)):
        assert complete(prefix, suffix, language, generated, chunk_sizes=sizes) == expected


def test_explicit_line_scope_stops_at_first_newline_after_content():
    rules = StopRules.for_request("x = ", "", "python", "line")
    assert rules.check("\n") is None  # a leading newline is not the end of a line of content
    assert rules.check("\n  1 + 2  ") is None
    assert rules.check("\n  1 + 2  \ny = 3") == len("\n  1 + 2")


def test_dedent_is_decided_at_the_first_character_of_the_line():
    rules = StopRules.for_request("def f():", "", "python", "block")
    assert rules.check("\n    return 1\n\n") is None  # a blank line may still be inside the body
    assert rules.check("\n    return 1\n\n   ") is None
    assert rules.check("\n    return 1\n\nx") == len("\n    return 1")


def test_closing_line_waits_until_it_is_known_to_be_one():
    rules = StopRules.for_request("function f() {", "", "javascript", "block")
    assert rules.keep_closing_line  # nothing in the document closes the block
    assert rules.check("\n  g();\n}") is None  # `}` could still become `} else {`
    assert rules.check("\n  g();\n} e") == len("\n  g();\n}")  # keep what balances the block
    assert rules.check("\n  g();\n}\n") == len("\n  g();\n}")
    # When the document already closes the block, the closing line is not kept.
    rules = StopRules.for_request("function f() {", "\n}", "javascript", "block")
    assert rules.check("\n  g();\n}") == len("\n  g();")


def test_finish_drops_trailing_whitespace_and_applies_line_end_rules():
    rules = StopRules.for_request("def f(x):", "", "python", "block")
    assert rules.finish("\n    return x\n\n  ") == len("\n    return x")
    rules = StopRules.for_request("items = [", "]\n", "python", "block")
    assert rules.finish("1, 2, 3]") == len("1, 2, 3")


def test_tabs_are_expanded_consistently():
    prefix = "func f() {\n\tif ok {\n\t\tx := 1\n"
    rules = StopRules.for_request(prefix, "\n\t}\n}\n", "go", "block")
    assert rules.min_indent == 8
    # The cursor at the start of the closing line is still inside the block it closes.
    assert StopRules.for_request(prefix, "\t}\n}\n", "go", "block").min_indent == 8
    # A line indented with spaces to the same column is still inside the block.
    assert rules.check("        y := 2\n\t\tz := 3\n") is None
    assert rules.check("        y := 2\n\t}\n") == len("        y := 2")


def test_top_level_stop_needs_column_zero():
    rules = StopRules.for_request("class A:\n    x = 1\n", "", "python", "full")
    assert rules.check("    def m(self):\n        pass\n    def n(self):\n") is None
    body = "    def m(self):\n        pass"
    assert rules.check(body + "\ndef g():") == len(body)


@pytest.mark.parametrize(
    ("language", "prefix", "suffix", "expected"),
    [
        ("python", "x = foo(a, ", "b)\n", "line"),
        ("python", "def f():", "", "block"),
        ("python", "def f():\n", "", "block"),
        ("python", "def f():\n    x = 1\n    ", "\n    return x\n", "block"),
        ("python", "def f():\n    x = 1\n", "\n    return x\n", "block"),
        ("python", "import os\n", "", "full"),
        ("python", "x = 1", "\n\n", "full"),
        ("python", "x = 1", "\ny = 2\n", "block"),
        ("python", "def f():\n    x = 1\n", "    return x\n", "block"),  # before an existing line
        ("python", "print(", ")", "block"),  # only an auto-closed bracket to the right
        ("python", "print('hi", "')", "block"),
        ("javascript", "foo(", ");", "block"),
        ("javascript", "const x = [1, 2", "];\nconsole.log(x);", "block"),
        ("javascript", "if (ready) {", "\n}", "block"),
        ("javascript", "const y = ", "", "full"),
        ("typescript", "const n: number = ", " * 2;", "line"),
        ("go", "func main() {\n\t", "\n}\n", "block"),
        ("rust", "let v = ", ".len();", "line"),
        ("lua", "if x > 0 then", "\nend", "block"),
        ("lua", "for i = 1, n do", "", "block"),
        ("lua", "local f = function(a)", "", "block"),
        ("c", "int main(void) {\n    return ", ";\n}\n", "block"),
        ("", "something ", "", "full"),
    ],
)
def test_resolve_scope(language, prefix, suffix, expected):
    assert resolve_scope(prefix, suffix, language) == expected
    assert StopRules.for_request(prefix, suffix, language, "auto").scope == expected


def test_requested_scope_is_kept_and_bad_scope_is_rejected():
    assert resolve_scope("x = foo(a, ", "b)", "python", "full") == "full"
    with pytest.raises(ValueError, match="unknown scope 'paragraph'"):
        resolve_scope("", "", "python", "paragraph")
    with pytest.raises(ValueError, match="unknown scope"):
        StopRules.for_request("", "", "python", "lines")


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("src/app.py", "python"),
        ("stubs/mod.pyi", "python"),
        ("web/index.js", "javascript"),
        ("web/lib.mjs", "javascript"),
        ("web/App.jsx", "javascriptreact"),
        ("web/api.ts", "typescript"),
        ("types/global.d.ts", "typescript"),
        ("web/App.tsx", "typescriptreact"),
        ("cmd/main.go", "go"),
        ("src/lib.rs", "rust"),
        ("src/main.c", "c"),
        ("include/util.h", "c"),
        ("src/main.cpp", "cpp"),
        ("src/vec.hpp", "cpp"),
        ("src/thing.cc", "cpp"),
        ("init.lua", "lua"),
        ("Main.java", "java"),
        ("app/models/user.rb", "ruby"),
        ("Gemfile", "ruby"),
        ("scripts/build.sh", "shellscript"),
        ("scripts/deploy.bash", "shellscript"),
        ("Program.cs", "csharp"),
        ("Main.kt", "kotlin"),
        ("index.php", "php"),
        ("config.yml", "yaml"),
        ("Makefile", "makefile"),
        ("Dockerfile", "dockerfile"),
        ("file:///home/u/proj/src/app.py", "python"),
        ("C:\\proj\\src\\main.rs", "rust"),
        ("README", ""),
        (".env", ""),
        ("archive.unknownext", ""),
        ("", ""),
        ("src/APP.PY", "python"),
    ],
)
def test_language_from_path(path, expected):
    assert language_from_path(path) == expected


def test_language_aliases_and_unknown_languages():
    assert normalize_language("Py") == "python"
    assert normalize_language("bash") == "shellscript"
    assert normalize_language("c++") == "cpp"
    assert facts_for("golang").language == "go"
    assert facts_for("no-such-language").language == ""
    # Unknown languages still get indentation and overlap rules.
    rules = StopRules.for_request("block {", "", "no-such-language", "block")
    assert rules.check("\n  a\n  b\nc") == len("\n  a\n  b")


@pytest.mark.parametrize(
    ("language", "line", "opens"),
    [
        ("python", "def f(x):", True),
        ("python", "if x == '#':  # compare", True),
        ("python", "x = 1  # note:", False),
        ("python", "return x", False),
        ("javascript", "const f = (a) =>", True),
        ("javascript", "if (a) {  // comment", True),
        ("javascript", "const s = '{';", False),
        ("go", "\tcase x > 0:", True),
        ("c", "switch (c) {", True),
        ("lua", "local f = function(a, b)", True),
        ("lua", "function M.setup(opts)", True),
        ("lua", "if a then", True),
        ("lua", "for i = 1, 3 do", True),
        ("lua", "local x = f(a) -- call(", False),
        ("lua", "local g = function(a) return a end", False),
        ("ruby", "items.each do |item|", True),
        ("ruby", "def greet(name)", True),
        ("ruby", "def greet(name) = 1 end", False),
        ("shellscript", "if [ -f x ]; then", True),
        ("shellscript", "echo $# items", False),
    ],
)
def test_opens_block(language, line, opens):
    assert code_lines.opens_block(facts_for(language), line) is opens


def test_language_facts_cover_the_documented_stops():
    assert "\ndef " in facts_for("python").top_level_stops
    assert "\nif __name__" in facts_for("python").top_level_stops
    assert {"\nfunction ", "\nexport ", "\nclass "} <= set(facts_for("typescript").top_level_stops)
    assert "\nfunc " in facts_for("go").top_level_stops
    assert {"\nfn ", "\nimpl ", "\npub fn "} <= set(facts_for("rust").top_level_stops)
    assert "\nint main" in facts_for("c").top_level_stops
    assert {"\nlocal function ", "\nfunction "} <= set(facts_for("lua").top_level_stops)
    assert facts_for("python").line_comment == "#"
    assert facts_for("lua").line_comment == "--"
    assert facts_for("python").indentation_delimited
    assert facts_for("rust").brace_delimited
    for language in known_languages():
        assert all(stop.startswith("\n") for stop in facts_for(language).top_level_stops)


@pytest.mark.parametrize(
    ("language", "line", "status"),
    [
        ("javascript", "}", "closer"),
        ("javascript", "});", "closer"),
        ("javascript", "} else {", "no"),
        ("lua", "end", "closer"),
        ("lua", "end)", "closer"),
        ("lua", "en", "maybe"),
        ("lua", "endpoint = 1", "no"),
        ("lua", "else", "no"),
        ("lua", "until done", "closer"),
        ("shellscript", "fi", "closer"),
        ("python", ")", "closer"),
        ("python", "x", "no"),
    ],
)
def test_closing_line_status(language, line, status):
    assert code_lines.closing_line_status(facts_for(language), line)[0] == status


# --- The monotone property --------------------------------------------------------------------

GENERIC_CONTEXTS = [
    ("", ""),
    ("x = foo(", ")\n"),
    ("total = a * ", " + b\n"),
    ("block {", "\n}\n"),
    ("block {\n  ", ""),
    ("    nested\n", "    after\n"),
]
LANGUAGE_CONTEXTS = {
    "python": [
        ("def f(x):", ""),
        ("def f(x):\n    y = 1\n", "\n    return y\n"),
        ("def f(x):\n    y = 1\n", "    return y\n"),
        ("import os\n", ""),
        ("@decorator", "\n\nclass A:\n    pass\n"),
        ('s = """doc\n', '\n"""\n'),
        ("class A:\n    def m(self):\n        ", "\n\n    def n(self):\n        pass\n"),
        ("COLORS = {", ""),
    ],
    "javascript": [
        ("function f() {", "\n}\n"),
        ("function f() {", ""),
        ("if (x) {\n  ", "\n}\nreturn 1;"),
        ("const s = `", ""),
        ("/* open comment\n", ""),
        ("items.map((x) => {", "\n});"),
    ],
    "go": [("func f() {\n\t", "\n\tx := 1\n}"), ("func f() {", ""), ("switch {\ncase x:", "")],
    "rust": [("impl A {\n    fn f(&self) {", "\n}\n"), ("fn main() {\n    let s = \"", "")],
    "c": [
        ("int main(void) {\n    int x = 1;\n", "    return 0;\n}\n"),
        ("#include <stdio.h>\n", ""),
        ("static int f(void) {", ""),
    ],
    "lua": [
        ("local function f(a)", "\nend\n"),
        ("local function f(a)", ""),
        ("for i = 1, n do\n  ", ""),
        ("repeat", ""),
        ("local t = {\n  f = function()", "\n}"),
    ],
    "ruby": [("def greet(name)", ""), ("items.each do |x|", "\nend")],
    "shellscript": [("if [ -f x ]; then", ""), ("for f in *; do", "\ndone")],
}
CASES = [
    (language, context)
    for language in list(known_languages()) + ["", "haskell"]
    for context in GENERIC_CONTEXTS + LANGUAGE_CONTEXTS.get(language, [])
] + [
    (language, context)  # each language's own contexts again, so they are drawn more often
    for language, contexts in LANGUAGE_CONTEXTS.items()
    for context in contexts
] * 3

INDENTS = ["", "", "", " ", "  ", "    ", "\t", "\t\t", "        "]
LINE_STARTS = [
    "x", "y = 1", "return x", "pass", "}", ")", "]", "});", "},", "} else {", "else", "do",
    "#ifdef X", "# c", "// c", "-- c", "@d", "#[t]", '"""', "'''", "`", "/*", "*/", " * c", '"',
    "'", "return y", "return 0;", "if x:", "if x then", "{", "(", "[", "+ b", "after", "nested",
    ":",
]


def line_starts_for(language: str) -> list[str]:
    """Generic line starts plus the ones this language's rules react to: closing words and their
    beginnings (`e`, `en`, `end`, `endx`), and top-level stop strings."""
    facts = facts_for(language)
    words = facts.close_keywords + facts.close_keywords_with_tail
    closing = [word[:i] for word in words for i in range(1, len(word) + 1)]
    closing += [word + tail for word in words for tail in ("x", ")", ",", " x", ";")]
    stops = [stop[1:] for stop in facts.top_level_stops]
    return LINE_STARTS + closing * 2 + stops


def generated_texts(language: str):
    line = st.tuples(
        st.sampled_from(INDENTS),
        st.sampled_from(line_starts_for(language)),
        st.text(alphabet=" x}{)(:#/*\'\"`e;,", max_size=3),
    ).map("".join)
    return st.tuples(
        st.text(alphabet=" x)(:\n", max_size=3),  # the rest of the cursor's line
        st.lists(line, max_size=8),
        st.sampled_from(["", "\n", "\n\n"]),
    ).map(lambda parts: parts[0] + "\n".join(parts[1]) + parts[2])


def assert_monotone(rules: StopRules, text: str, seed: int) -> None:
    """What the engine relies on, for every way of splitting `text` into decode steps."""
    # Plain decoding: one character at a time, each check on a copy that remembers nothing.
    first = None
    for end in range(len(text) + 1):
        kept = copy.copy(rules).check(text[:end])
        if first is None and kept is not None:
            first = (end, kept)
        if first is not None:
            assert kept == first[1], f"check({text[:end]!r}) = {kept}, earlier {first}"
    full = copy.copy(rules).check(text)
    assert full == (first[1] if first else None)
    if full is not None:
        assert 0 <= full <= first[0] <= len(text)
        assert copy.copy(rules).finish(text) == full

    # Speculative decoding: random step sizes on one object (with its remembered scan state).
    speculative_rules = copy.copy(rules)
    rng = random.Random(seed)
    position = 0
    while True:
        speculative = speculative_rules.check(text[:position])
        if speculative is not None or position == len(text):
            break
        position = min(len(text), position + rng.randint(1, 8))
    assert speculative == full
    # The remembered state never leaks into texts that are not extensions of earlier ones.
    for other in (text[: len(text) // 2], text[1:] + text[:1], "x\n" + text):
        assert speculative_rules.check(other) == copy.copy(rules).check(other)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    scope=st.sampled_from(["auto", "line", "block", "full"]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_check_is_monotone(case, scope, seed, data):
    language, (prefix, suffix) = case
    text = data.draw(generated_texts(language), label="text")
    assert_monotone(StopRules.for_request(prefix, suffix, language, scope), text, seed)


@pytest.mark.parametrize(("language", "prefix", "suffix", "generated", "expected"), GOLDEN)
def test_golden_texts_are_monotone_in_every_scope(language, prefix, suffix, generated, expected):
    for scope in ("auto", "line", "block", "full"):
        assert_monotone(StopRules.for_request(prefix, suffix, language, scope), generated, seed=0)


# --- Speed ---------------------------------------------------------------------------------------

def test_check_is_fast_on_two_kilobytes():
    body = "".join(
        f"    value_{i} = compute(value_{i - 1}, 'x#y', \"/*\")  # step {i}\n" for i in range(36)
    )
    text = "\n" + body
    assert 1900 <= len(text) <= 2600
    best_fresh = float("inf")
    for _ in range(20):
        rules = StopRules.for_request("def f(x):", "\n\ndef g():\n    pass\n", "python", "block")
        started = time.perf_counter()
        assert rules.check(text) is None
        best_fresh = min(best_fresh, time.perf_counter() - started)
    assert best_fresh < 1e-3, f"{best_fresh * 1e3:.2f} ms for a 2 KB text"

    # Called after every step, the remembered scan state makes each call cheaper still.
    rules = StopRules.for_request("def f(x):", "\n\ndef g():\n    pass\n", "python", "block")
    started = time.perf_counter()
    calls = 0
    for end in range(0, len(text) + 1, 5):
        rules.check(text[:end])
        calls += 1
    assert (time.perf_counter() - started) / calls < 1e-3


def test_a_request_plans_the_scope_resolve_scope_gives_even_past_a_blank_suffix_head():
    """completion_rules resolves `auto` from the cursor's context it reads once; a suffix whose first
    stretch is blank still has its code further down counted, as resolve_scope counts it."""
    from decoding.stop_rules import _SUFFIX_HEAD_CHARS, StopRules, resolve_scope

    prefix = "x = 1\n"
    for suffix in (" " * _SUFFIX_HEAD_CHARS + "\ny = 2\n", "\n" * _SUFFIX_HEAD_CHARS + "y = 2\n", "", "\n\n"):
        assert StopRules.for_request(prefix, suffix, "python", "auto").scope == resolve_scope(prefix, suffix, "python")
