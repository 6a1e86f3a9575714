"""Atoms of the answer grammar: numbers, letters, commands, brackets and matrices."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from fractions import Fraction

from workers.verifier.nodes import Node, Refused, num, render
from workers.verifier.tokens import FUNCTIONS, Token

__all__ = ["DEGREES", "NOT_UNITS", "AtomParser"]

MAX_DEPTH = 150
MAX_MATRIX_CELLS = 100
MAX_SUBSCRIPT_TOKENS = 20
MAX_PRIMES = 3
_CALLABLE_LETTERS = frozenset("fghFGHPQ")
_CONSTANTS = {"pi": "pi", "infty": "oo", "infin": "oo", "emptyset": "EmptySet"}
_DEGREE = Node("div", (Node("sym", text="pi"), num(180)))
# The text of a `mul` node that is an angle written in degrees (`30^\circ`).
DEGREES = "deg"
_GREEK = frozenset(
    {"alpha", "beta", "gamma", "theta", "lambda", "mu", "phi", "omega", "sigma",
     "tau", "rho", "delta", "epsilon"}
)  # fmt: skip
_MATRIX_ENVS = frozenset(
    {"pmatrix", "bmatrix", "matrix", "array", "vmatrix", "Bmatrix"}
)
# Negations, hedges and directions: never dropped like a unit after a number.
NOT_UNITS = frozenset(
    {"not", "no", "never", "maybe", "perhaps", "possibly", "probably", "excluded",
     "except", "excluding", "wrong", "false", "incorrect", "impossible", "undefined",
     "invalid", "none", "neither", "nor", "either", "than", "about", "around",
     "roughly", "approximately", "nearly", "almost", "over", "under", "above", "below",
     "plus", "minus", "unknown", "cannot", "isnt"}
)  # fmt: skip
_ROUNDING = {"lceil": "rceil", "lfloor": "rfloor"}
_SUCH_THAT = frozenset({"mid", "|", ":", "vert"})
# `\sin^{-1}` is the inverse function, never 1 / sin.
_INVERSES = {"sin": "arcsin", "cos": "arccos", "tan": "arctan"}
_UNIT_FOLLOWERS = frozenset({"end", ",", ";", ")", "]", "}", "and", "or", "=", "%"})


class AtomParser:
    """Token cursor with depth bookkeeping and the atom-level productions."""

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0

    # -- cursor ---------------------------------------------------------------
    def peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        tok = self.peek()
        self.pos = min(self.pos + 1, len(self.tokens) - 1)
        return tok

    def expect(self, text: str) -> None:
        tok = self.advance()
        if tok.text != text:
            raise Refused(f"expected {text!r}, found {tok.text!r}")

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Refused(f"nesting deeper than {MAX_DEPTH}")

    def leave(self) -> None:
        self.depth -= 1

    # -- hooks provided by the full parser --------------------------------------
    def items(self, closers: frozenset[str]) -> Node:
        raise NotImplementedError

    def item_list(self, closers: frozenset[str]) -> list[Node]:
        raise NotImplementedError

    def sum(self) -> Node:
        raise NotImplementedError

    def power(self) -> Node:
        raise NotImplementedError

    def relation(self) -> Node:
        raise NotImplementedError

    # -- postfix and exponents --------------------------------------------------
    def postfix(self) -> Node:
        return self.postfix_ops(self.atom())

    def postfix_ops(self, node: Node) -> Node:
        while True:
            tok = self.peek()
            if tok == Token("op", "!"):
                self.advance()
                node = Node("fact", (node,))
            elif tok == Token("op", "%"):
                self.advance()
                node = Node("pct", (node,))
            elif tok == Token("cmd", "circ"):  # an angle in degrees (`compare`)
                self.advance()
                node = Node("mul", (node, _DEGREE), text=DEGREES)
            elif tok.kind == "word":
                self._skip_unit()
            else:
                return node

    def _skip_unit(self) -> None:
        """Drop a trailing unit word (``cm``, ``inches^2``) that ends an item.

        Words that change what the value means (``12 not``, ``5 maybe``, ``3 below
        zero``) are not units: the answer is refused, never read as the bare number.
        """
        word = self.advance().text
        if word in NOT_UNITS:
            raise Refused(f"{word!r} after a value")
        if self.peek() == Token("op", "^"):
            self.advance()
            self.exponent()
        nxt = self.peek()
        if nxt.kind != "word" and nxt.kind != "end" and nxt.text not in _UNIT_FOLLOWERS:
            raise Refused("word inside an expression")

    def exponent(self) -> Node:
        """An exponent; ``x^10`` reads as x^{10} (LaTeX's x^1 0 is never meant)."""
        tok = self.peek()
        if tok.kind == "op" and tok.text in {"-", "+"}:
            return self.power()
        return self.atom()

    # -- atoms ------------------------------------------------------------------
    def atom(self) -> Node:
        tok = self.peek()
        if tok.kind == "num":
            self.advance()
            return self._subscripted(_number(tok.text), numeric=True)
        if tok.kind == "id":
            self.advance()
            return self._letter(tok.text)
        if tok.kind == "cmd":
            return self._command()
        if tok.kind == "op" and tok.text in {"(", "["}:
            return self._bracket()
        if tok == Token("op", "{"):
            return self._brace()
        if tok == Token("op", "|") or tok.text in {"|", "vert", "lvert"}:
            self.advance()
            inner = self.sum()
            if self.advance().text not in {"|", "vert", "rvert"}:
                raise Refused("unclosed |")
            return Node("abs", (inner,))
        raise Refused(f"unexpected {tok.text or tok.kind!r}")

    def _letter(self, letter: str) -> Node:
        node = self._subscripted(Node("sym", text=letter), numeric=False)
        primes = 0
        while self.peek() == Token("op", "'") and primes < MAX_PRIMES:
            self.advance()
            primes += 1  # `f'`, `f''(x)`: a derivative's name
        if primes:
            node = Node("sym", text=node.text + "'" * primes)
        if letter in _CALLABLE_LETTERS and self.peek() == Token("op", "("):
            self.advance()
            self.enter()
            args = self.item_list(frozenset({")"}))
            self.leave()
            self.expect(")")
            return Node("call", tuple(args), text=node.text)
        return node

    def _subscripted(self, node: Node, *, numeric: bool) -> Node:
        if self.peek() != Token("op", "_"):
            return node
        self.advance()
        sub = self._raw_group()
        if numeric:
            return Node("based", (node, Node("sym", text=sub)))
        return Node("sym", text=f"{node.text}_{sub}")

    def _raw_group(self) -> str:
        """A subscript as written: ``_3``, ``_{37}``, ``_{MBCN}`` (never evaluated)."""
        tok = self.advance()
        if tok.text != "{":
            if tok.kind == "num" and len(tok.text) > 1 and tok.text[:2].isdigit():
                self.pos -= 1
                return render(self._first_digit())
            if tok.kind not in {"num", "id", "word"}:
                raise Refused("bad subscript")
            return tok.text
        parts: list[str] = []
        depth = 0
        while (inner := self.advance()).text != "}" or depth > 0:
            if inner.kind == "end" or len(parts) > MAX_SUBSCRIPT_TOKENS:
                raise Refused("bad subscript")
            if inner.kind == "op" and inner.text in {"{", "}"}:
                depth += 1 if inner.text == "{" else -1
            parts.append(inner.text)
        return "".join(parts)

    def _first_digit(self) -> Node:
        """Split ``34`` into 3 and ``4`` (callers check it starts with two digits)."""
        tok = self.tokens[self.pos]
        self.tokens[self.pos] = Token("num", tok.text[1:])
        return num(int(tok.text[0]))

    def group_arg(self) -> Node:
        """A command argument: ``{...}`` or one token (``\\frac34`` reads 3 then 4)."""
        tok = self.peek()
        if tok == Token("op", "{"):
            self.advance()
            self.enter()
            inner = self.items(frozenset({"}"}))
            self.leave()
            self.expect("}")
            return inner
        if tok.kind == "num" and len(tok.text) > 1 and tok.text[:2].isdigit():
            return self._first_digit()
        if tok.kind in {"num", "id"} or (tok.kind == "cmd" and tok.text in _CONSTANTS):
            return self.atom()
        raise Refused("missing argument")

    def _command(self) -> Node:
        name = self.advance().text
        if name in _CONSTANTS:
            return Node("sym", text=_CONSTANTS[name])
        if name in _GREEK:
            return self._subscripted(Node("sym", text=name), numeric=False)
        if name == "frac":
            return Node("div", (self.group_arg(), self.group_arg()))
        if name == "binom":
            return Node("binom", (self.group_arg(), self.group_arg()))
        if name == "sqrt":
            return self._sqrt()
        if name in FUNCTIONS:
            return self._function(name)
        if name == "{":
            return self._set()
        if name == "begin":
            return self._matrix()
        if name in _ROUNDING:
            return self._rounding(name)
        if name in {"|", "vert", "lvert"}:
            self.pos -= 1
            return self.atom()
        raise Refused(f"\\{name} here")

    def _rounding(self, name: str) -> Node:
        """`\\lceil x \\rceil` and `\\lfloor x \\rfloor` (a function of one sum)."""
        self.enter()
        inner = self.sum()
        self.leave()
        closer = _ROUNDING[name]
        if self.advance() != Token("cmd", closer):
            raise Refused(f"unclosed \\{name}")
        return Node("fn", (inner,), text=name[1:])

    def _sqrt(self) -> Node:
        index: Node | None = None
        if self.peek() == Token("op", "["):
            self.advance()
            index = self.sum()
            self.expect("]")
        # ``\sqrt 19`` reads as the root of 19, like ``x^10`` above; ``\frac34`` keeps
        # LaTeX's one-digit arguments because that form is written on purpose.
        arg = self.atom() if self.peek().kind == "num" else self.group_arg()
        return Node("root", (arg,) if index is None else (arg, index))

    def _function(self, name: str) -> Node:
        name = {"lg": "log"}.get(name, name)
        base: Node | None = None
        power: Node | None = None
        for _ in range(2):
            if self.peek() == Token("op", "_") and name == "log" and base is None:
                self.advance()
                base = self.group_arg()
            elif self.peek() == Token("op", "^") and power is None:
                self.advance()
                power = self.exponent()
        if power is not None and name in _INVERSES and render(power) == "(neg 1)":
            name, power = _INVERSES[name], None
        arg = self._bracket() if self.peek() == Token("op", "(") else self.power()
        kids = (arg,) if base is None else (arg, base)
        node = Node("fn", kids, text=name)
        return node if power is None else Node("pow", (node, power))

    def _bracket(self) -> Node:
        opener = self.advance().text
        self.enter()
        parts = self.item_list(frozenset({")", "]"}))
        self.leave()
        closer = self.advance().text
        if closer not in {")", "]"}:
            raise Refused("unclosed bracket")
        shape = opener + closer
        if len(parts) == 1 and shape in {"()", "[]"}:
            return parts[0]
        if len(parts) == 2 and shape != "()":
            return Node("interval", tuple(parts), text=shape)
        if len(parts) == 2:
            return Node("pair", tuple(parts))
        return Node("tuple", tuple(parts), text=shape)

    def _brace(self) -> Node:
        self.advance()
        self.enter()
        parts = self.item_list(frozenset({"}"}))
        self.leave()
        self.expect("}")
        return parts[0] if len(parts) == 1 else Node("set", tuple(parts))

    def _set(self) -> Node:
        if self.peek().kind == "id" and self.peek(1).text in _SUCH_THAT:
            return self._set_builder()
        self.enter()
        parts = [] if self.peek().text == "}" else self.item_list(frozenset({"}"}))
        self.leave()
        if self.advance() != Token("cmd", "}"):
            raise Refused("unclosed \\{")
        return Node("set", tuple(parts))

    def _set_builder(self) -> Node:
        """`\\{x \\mid -2 < x < 3\\}`: the condition, read as the set it describes
        (an interval when it is one; a condition not on `x` is refused)."""
        variable = self.advance().text
        self.advance()
        self.enter()
        condition = self.relation()
        self.leave()
        if self.advance() != Token("cmd", "}"):
            raise Refused("unclosed \\{")
        if condition.kind != "rel" or not _mentions(condition, variable):
            raise Refused("set-builder condition")
        return condition

    def _matrix(self) -> Node:
        env = self._env_name()
        if env not in _MATRIX_ENVS:
            raise Refused(f"environment {env}")
        if env == "array" and self.peek() == Token("op", "{"):
            while self.advance().text not in {"}", ""}:
                pass
        rows: list[Node] = []
        cells: list[Node] = []
        while True:
            cells.append(self.sum())
            sep = self.advance()
            if len(cells) + sum(len(r.kids) for r in rows) > MAX_MATRIX_CELLS:
                raise Refused("matrix too large")
            if sep.text == "&":
                continue
            if sep.kind == "end" or sep.text not in {"\\\\", "end"}:
                raise Refused("bad matrix separator")
            rows.append(Node("row", tuple(cells)))
            cells = []
            if sep.text == "end":
                break
            if self.peek() == Token("cmd", "end"):
                self.advance()
                break
        if self._env_name() != env:
            raise Refused("mismatched environment")
        matrix = Node("matrix", tuple(rows))
        return Node("abs", (matrix,)) if env == "vmatrix" else matrix  # a determinant

    def _env_name(self) -> str:
        self.expect("{")
        name = ""
        while (tok := self.advance()).text != "}":
            if tok.kind == "end":
                raise Refused("unclosed environment name")
            name += tok.text
        return name


def _number(literal: str) -> Node:
    low = literal.lower()
    if "e" in low:
        mantissa, _, power = low.partition("e")
        if abs(int(power)) > 400:
            raise Refused("exponent too large")
        return num(Fraction(Decimal(mantissa)) * Fraction(10) ** int(power))
    try:
        value = Fraction(Decimal(literal))
    except (InvalidOperation, ValueError) as exc:
        raise Refused(f"bad number {literal[:20]!r}") from exc
    if "." in literal:
        stripped = literal.rstrip(".")
        if stripped.startswith("."):
            stripped = "0" + stripped
        return num(value, stripped if "." in stripped else "")
    return num(value)


def _mentions(node: Node, name: str) -> bool:
    """Whether the symbol `name` occurs in `node`."""
    if node.kind == "sym":
        return node.text == name
    return any(_mentions(kid, name) for kid in node.kids)
