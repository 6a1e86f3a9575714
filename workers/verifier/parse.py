"""Recursive-descent parser from whitelisted tokens to an answer tree (`Node`).

Grammar, loosest first: items (``,`` ``;`` and/or) > relations > ``\\cup`` > sums
> products (explicit or implicit) > unary signs > powers > postfix (``!`` ``%`` units)
> atoms (numbers, letters, commands, brackets, matrices).
"""

from __future__ import annotations

from fractions import Fraction

from workers.verifier.nodes import Node, Refused
from workers.verifier.parse_atoms import AtomParser
from workers.verifier.tokens import Token, tokenize

__all__ = ["parse_text"]

_SEPARATORS = {",", ";", "and", "or"}
_REL_OPS = {
    "=": "=", "<": "<", ">": ">", "<=": "<=", ">=": ">=", "!=": "!=", "le": "<=",
    "leq": "<=", "leqslant": "<=", "ge": ">=", "geq": ">=", "geqslant": ">=",
    "ne": "!=", "neq": "!=", "lt": "<", "gt": ">", "approx": "~", "in": "in",
}  # fmt: skip
_FLIP = {">": "<", ">=": "<="}
_COPULAS = frozenset({"is", "are", "be", "equals"})
_MUL_OPS = {"*", "times", "cdot"}
_DIV_OPS = {"/", "div"}
_IMPLICIT_START = {"num", "id", "cmd"}
# Operators a text answer may hold: brackets, separators, connectors (`A and B`).
_TEXT_PUNCTUATION = frozenset({"(", ")", "[", "]", "{", "}", ",", ";", ":", "'"})
_TEXT_PUNCTUATION |= {"and", "or"}
_WORDISH = frozenset({"word", "id"})


def parse_text(text: str) -> Node:
    """Parse normalized answer text into a tree.

    Args:
        text: output of `normalize`.

    Returns:
        The answer tree.

    Raises:
        Refused: the text is outside the supported grammar or bounds.
    """
    tokens = _prepass(tokenize(text))
    if _is_text_answer(tokens):
        words = [t.text.lower() for t in tokens if t.kind in {"word", "id"}]
        return Node("text", text=" ".join(words))
    parser = Parser(tokens)
    node = parser.items(frozenset({"end"}))
    if parser.peek().kind != "end":
        raise Refused(f"unexpected {parser.peek().text!r}")
    return node


def _prepass(tokens: list[Token]) -> list[Token]:
    """Unwrap ``{words}`` groups (``\\text{ cm}``; a lone letter only right after a
    number, ``5\\text{ m}``), map connector words, and keep only what follows a final
    "is"/"are" (``The largest n is 34``)."""
    flat: list[Token] = []
    i = 0
    while i < len(tokens):
        end = _unit_group_end(tokens, i, flat)
        if end is None:
            flat.append(tokens[i])
            i += 1
        else:
            flat.extend(Token("word", t.text.lower()) for t in tokens[i + 1 : end])
            i = end + 1
    copulas = [k for k, t in enumerate(flat) if t.kind == "word" and t.text in _COPULAS]
    if copulas and copulas[-1] + 2 < len(flat):
        flat = flat[copulas[-1] + 1 :]
    return [_map_word(t) for t in flat]


def _unit_group_end(tokens: list[Token], i: int, flat: list[Token]) -> int | None:
    """Index of the ``}`` closing a letters-only group at `i` that reads as words."""
    if tokens[i] != Token("op", "{"):
        return None
    if flat and flat[-1].text in {"begin", "end", "_", "^"}:
        return None
    j = i + 1
    while tokens[j].kind in {"word", "id"}:
        j += 1
    group = tokens[i + 1 : j]
    if tokens[j].text != "}" or not group:
        return None
    if any(t.kind == "word" for t in group):
        return j
    after_value = bool(flat) and (flat[-1].kind == "num" or flat[-1].text == ")")
    constants = any(t.text in {"e", "i"} for t in group)
    return j if after_value and not constants else None


def _map_word(tok: Token) -> Token:
    if tok.kind == "word" and tok.text in {"and", "or"}:
        return Token("op", tok.text)
    if tok.kind == "word" and tok.text in {"percent", "percentage", "pct"}:
        return Token("op", "%")
    return tok


def _is_text_answer(tokens: list[Token]) -> bool:
    """Words with punctuation only: a sign or operator (``-\text{odd}``) is math."""
    kinds = [t.kind for t in tokens]
    if "num" in kinds or "cmd" in kinds or "word" not in kinds:
        return False
    for k, tok in enumerate(tokens):
        if tok.kind == "op" and tok.text not in _TEXT_PUNCTUATION:
            hyphen = tok.text == "-" and 0 < k < len(tokens) - 1
            words = hyphen and {tokens[k - 1].kind, tokens[k + 1].kind} <= _WORDISH
            if not words:  # `non-negative`, `x-axis` are words; `-odd` is not
                return False
    return kinds.count("word") >= kinds.count("id")


class Parser(AtomParser):
    """Operator-precedence levels on top of `AtomParser`'s atoms."""

    def items(self, closers: frozenset[str]) -> Node:
        """Comma/semicolon/and/or separated items up to one of `closers`."""
        parts = self.item_list(closers)
        return parts[0] if len(parts) == 1 else Node("list", tuple(parts))

    def item_list(self, closers: frozenset[str]) -> list[Node]:
        parts = [self.relation()]
        while self.peek().text in _SEPARATORS and self.peek().kind == "op":
            self.advance()
            while self.peek().text in _SEPARATORS and self.peek().kind == "op":
                self.advance()
            if self.peek().text in closers or self.peek().kind in closers:
                break
            parts.append(self.relation())
        return parts

    def relation(self) -> Node:
        terms = [self.union()]
        ops: list[str] = []
        while (op := self._rel_op()) is not None:
            ops.append(op)
            terms.append(self.union())
        if not ops:
            return terms[0]
        if all(o in _FLIP for o in ops):
            terms.reverse()
            ops = [_FLIP[o] for o in reversed(ops)]
        return Node("rel", tuple(terms), text=",".join(ops))

    def _rel_op(self) -> str | None:
        tok = self.peek()
        if tok.kind in {"op", "cmd"} and tok.text in _REL_OPS:
            self.advance()
            return _REL_OPS[tok.text]
        return None

    def union(self) -> Node:
        parts = [self.sum()]
        while self.peek() == Token("cmd", "cup"):
            self.advance()
            parts.append(self.sum())
        return parts[0] if len(parts) == 1 else Node("union", tuple(parts))

    def sum(self) -> Node:
        self.enter()
        terms: list[Node] = []
        first = True
        while True:
            tok = self.peek()
            sign = tok.text if tok.kind in {"op", "cmd"} else ""
            if sign in {"+", "-", "pm", "mp"}:
                self.advance()
                term = self.product()
                terms.append(self._signed(sign, term, terms))
            elif first:
                terms.append(self.product())
            else:
                break
            first = False
        self.leave()
        return terms[0] if len(terms) == 1 else Node("add", tuple(terms))

    @staticmethod
    def _signed(sign: str, term: Node, terms: list[Node]) -> Node:
        if sign == "-":
            return Node("neg", (term,))
        if sign in {"pm", "mp"}:
            if terms:
                left = terms.pop()
                return Node("pm", (left, term))
            return Node("pm", (term,))
        return term

    def product(self) -> Node:
        left = self.power()
        while True:
            tok = self.peek()
            if tok.kind in {"op", "cmd"} and tok.text in _MUL_OPS:
                self.advance()
                left = _mul(left, self.power())
            elif tok.kind in {"op", "cmd"} and tok.text in _DIV_OPS:
                self.advance()
                left = Node("div", (left, self.power()))
            elif tok == Token("op", ":"):
                self.advance()
                left = Node("ratio", (left, self.power()))
            elif self._implicit_start(tok, left):
                left = self._implicit(left)
            else:
                return left

    def _implicit_start(self, tok: Token, left: Node) -> bool:
        if tok.kind == "num":
            return left.kind != "num" or self._slash_fraction_ahead(left)
        if tok.kind == "cmd":
            return tok.text not in _REL_OPS and tok.text not in {
                "cup", "pm", "mp", "end", "}", "cdot", "times", "div", "|", "mid",
                "rceil", "rfloor",
            }  # fmt: skip
        return tok.kind == "id" or (tok.text in {"(", "{"} and tok.kind == "op")

    def _slash_fraction_ahead(self, left: Node) -> bool:
        """`3127 + 1 1/2`: a whole number, then `p/q` (a mixed number)."""
        top, slash, bottom = self.peek(), self.peek(1), self.peek(2)
        return (
            _is_int_literal(left)
            and top.text.isdigit()
            and slash == Token("op", "/")
            and bottom.text.isdigit()
        )

    def _implicit(self, left: Node) -> Node:
        if self.peek().kind == "num" and self._slash_fraction_ahead(left):
            top = self.atom()
            self.advance()
            fraction = Node("div", (top, self.postfix()))
            if not _is_proper_fraction(fraction):
                raise Refused("a whole number before an improper fraction")
            return Node("add", (left, fraction))
        mixed = self.peek() == Token("cmd", "frac") and _is_int_literal(left)
        right = self.power()
        if mixed and _is_proper_fraction(right):
            return Node("add", (left, right))
        return _mul(left, right)

    def power(self) -> Node:
        tok = self.peek()
        if tok.kind == "op" and tok.text in {"-", "+"}:
            self.advance()
            self.enter()
            inner = self.power()
            self.leave()
            return Node("neg", (inner,)) if tok.text == "-" else inner
        base = self.postfix()
        if self.peek() == Token("op", "^"):
            self.advance()
            self.enter()
            exponent = self.exponent()
            self.leave()
            return self.postfix_ops(Node("pow", (base, exponent)))
        return base


def _mul(left: Node, right: Node) -> Node:
    if left.kind == "mul":
        return Node("mul", (*left.kids, right))
    return Node("mul", (left, right))


def _is_int_literal(node: Node) -> bool:
    return node.kind == "num" and not node.text and node.value is not None


def _is_proper_fraction(node: Node) -> bool:
    if node.kind != "div" or any(k.kind != "num" or k.text for k in node.kids):
        return False
    top, bottom = (k.value or Fraction(0) for k in node.kids)
    return bottom != 0 and 0 < top < bottom
