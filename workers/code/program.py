"""The program a code rollout submits: found in the response text, never run here.

Rules, in order:
1. The last fenced block of the response whose info string names Python (python, py,
   Python3, ...); when there is none, the last bare block that parses as Python (a
   bare block after the code is often the sample output), else the last bare block.
   Blocks of other languages are skipped. A final fence left open (a cut-off
   response) counts when its text parses. A fence may be indented (a list item):
   its body is dedented.
2. Without a fenced block: the response itself, when it parses as Python.
3. HumanEval completion style: when `prompt` is given and the program does not define
   `entry_point` (a top-level def, class, assignment or import, read with `ast`), the
   program is `prompt + code`. When it does define it, the program is the prompt, a
   blank line, then the code (when that parses): the prompt's imports and helpers
   (HumanEval/10's `is_palindrome`) stay available, and the code's own def, coming
   later, is the one called. MBPP's bodies in HumanEval format are indented two spaces
   under a four-space docstring, so when `prompt + code` does not parse, the code is
   re-indented to the docstring's level (`textwrap.indent(textwrap.dedent(code),
   "    ")`) and that is taken when it parses; failing that, a rougher re-indent
   (`_reindent_head`: tabs, an odd first line, helper defs after the body); failing
   that, the completion cut before its trailing text (`_cut_tail`: prose, a closing
   fence, a `__main__` block that does not parse), as HumanEval's stop sequences do.
4. None (`no_answer`) when there is no code: no block and the response does not parse
   (neither alone nor after the prompt), or the program is larger than
   `MAX_PROGRAM_CHARS`. Fenced code that does not parse is still returned: the model
   wrote code, and running it gives its SyntaxError as the verdict's failure.

Only `ast.parse` ever looks at the code (it compiles nothing and runs nothing). Inputs
are bounded: responses past `MAX_RESPONSE_CHARS` are read from their last
`MAX_RESPONSE_CHARS` characters, and nothing larger than `MAX_PROGRAM_CHARS` is parsed.
"""

from __future__ import annotations

import ast
import re
import textwrap
import warnings

__all__ = [
    "MAX_PROGRAM_CHARS",
    "MAX_RESPONSE_CHARS",
    "extract_program",
    "parse_tree",
    "parses",
]

MAX_PROGRAM_CHARS = 256 * 1024
MAX_RESPONSE_CHARS = 4 * 1024 * 1024
_MAX_BLOCKS = 64
_MAX_CUTS = 32  # bounded: each try is a parse

_PYTHON_INFO = frozenset({"python", "py", "python3", "py3", "python2", "ipython"})
# An opening or closing fence: indentation (a block in a list item is indented, and
# so is its body), three or more backticks, an info string (only on an opening fence).
_FENCE = re.compile(r"^([ \t]*)(`{3,})[ \t]*([^`\s]*)[^`]*$")


def parses(source: str) -> bool:
    """Whether `source` is Python the parser accepts (bounded; nothing is run)."""
    return parse_tree(source) is not None


def parse_tree(source: str, max_chars: int = MAX_PROGRAM_CHARS) -> ast.Module | None:
    """`ast.parse(source)`, or None when it does not parse or is over `max_chars`."""
    if len(source) > max_chars:
        return None
    try:
        # The parser warns about code it accepts (`"\d"`, `x is 1`); under an
        # "error" warnings filter that would turn into a SyntaxError.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # ValueError: a null byte; the others: absurd nesting


def _blocks(text: str) -> list[tuple[str, str, bool]]:
    """(info string lower-cased, body, closed) of every fenced block, in order."""
    found: list[tuple[str, str, bool]] = []
    lines = text.split("\n")
    opening: tuple[int, str, str, bool] | None = None  # line, ticks, info, indented
    for index, line in enumerate(lines):
        match = _FENCE.match(line.rstrip("\r"))
        if match is None:
            continue
        indent, ticks, info = match.group(1), match.group(2), match.group(3).lower()
        if opening is None:
            opening = (index, ticks, info, bool(indent))
        elif not info and len(ticks) >= len(opening[1]):
            found.append(
                (opening[2], _body(lines[opening[0] + 1 : index], opening[3]), True)
            )
            opening = None
    if opening is not None:  # a fence left open: the rest of the text
        found.append((opening[2], _body(lines[opening[0] + 1 :], opening[3]), False))
    return found


def _body(lines: list[str], indented: bool) -> str:
    body = "\n".join(lines) + "\n"
    return textwrap.dedent(body) if indented else body


def _fenced_code(text: str) -> str | None:
    # The last blocks only: the rule picks from the end, and a response of a million
    # fences must not cost a million parses.
    blocks = [b for b in _blocks(text)[-_MAX_BLOCKS:] if b[2] or parses(b[1])]
    python = [body for info, body, _closed in blocks if info in _PYTHON_INFO]
    if python:
        return python[-1]
    bare = [body for info, body, _closed in blocks if not info]
    if not bare:
        return None
    parsing = [body for body in bare if parses(body)]
    return (parsing or bare)[-1]


def _defines(source: str, name: str) -> bool:
    """Whether `source` parses and binds `name` at top level (def, class, assignment,
    import)."""
    tree = parse_tree(source)
    for node in tree.body if tree is not None else ():
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Import | ast.ImportFrom):
            if any((a.asname or a.name) == name for a in node.names):
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def _completion(prompt: str, code: str) -> str | None:
    """`prompt + code` (HumanEval), re-indented MBPP-style when only that parses;
    failing both, the completion cut before trailing text (`_cut_tail`)."""
    for body in (code, _reindent(code), _reindent_head(code)):
        if parses(prompt + body):
            return prompt + body
    return _cut_tail(prompt, code)


def _cut_tail(prompt: str, code: str) -> str | None:
    """`prompt` + the longest head of `code` that parses after it, cut where a line
    starts at column 0: an untruncated completion runs on into prose, a closing
    fence or a test harness (HumanEval's samplers cut at such lines with stop
    sequences; this does the same when the whole does not parse)."""
    lines = code.split("\n")
    cuts = [i for i, line in enumerate(lines) if i and line[:1] not in ("", " ", "\t")]
    for cut in reversed(cuts[-_MAX_CUTS:]):
        head = "\n".join(lines[:cut]).rstrip("\n") + "\n"
        if head.strip() and parses(prompt + head):
            return prompt + head
    return None


def _reindent(code: str) -> str:
    """The body at the docstring's level (MBPP: 2-space bodies, 4-space prompts)."""
    return textwrap.indent(textwrap.dedent(code), "    ")


def _reindent_head(code: str) -> str:
    """A rougher re-indent for MBPP bodies that also fail `_reindent`: tabs expanded,
    a first line indented unlike the rest (`"   k = 0\n  flag = 1"`), and top-level
    helper defs after the body (`"  ...\ndef helper():"`) kept at top level."""
    lines = code.expandtabs(4).split("\n")
    cut = next(
        (i for i, line in enumerate(lines) if i and line[:1].strip()),
        len(lines),
    )
    head = [lines[0].lstrip(), *textwrap.dedent("\n".join(lines[1:cut])).split("\n")]
    return textwrap.indent("\n".join(head), "    ") + "\n" + "\n".join(lines[cut:])


def extract_program(
    response: str, prompt: str | None, entry_point: str | None
) -> str | None:
    """The program to run for `response` (see the module docstring), or None."""
    text = response[-MAX_RESPONSE_CHARS:]
    fenced = _fenced_code(text)
    code = fenced if fenced is not None else text
    program: str | None = code if (fenced is not None or parses(code)) else None
    if prompt and entry_point and _defines(code, entry_point):
        # The prompt's imports and helpers stay available; the program's own def of
        # the entry point comes later, so it is the one called.
        with_prompt = f"{prompt.rstrip()}\n\n{code}"
        program = with_prompt if parses(with_prompt) else code
    elif prompt and entry_point:
        # Else the code stays as it is (a chat prompt in `prompt` is not code).
        program = _completion(prompt, code) or program
    if program is None or not program.strip() or len(program) > MAX_PROGRAM_CHARS:
        return None
    return program
