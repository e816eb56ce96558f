"""Subscription filters: a small expression language over one event (docs/subscriptions.md,
"Filters"), tokenized and parsed by hand and compiled once into closures.

    expr       := and_expr ("or" and_expr)*
    and_expr   := unary ("and" unary)*
    unary      := "not" unary | "(" expr ")" | "exists" "(" pointer ")" | comparison
    comparison := operand ("==" | "!=" | "<" | "<=" | ">" | ">=" | "contains") literal
                | operand "in" "[" literal ("," literal)* "]"
    operand    := pointer | "type" | "key" | "agent" | "version"
    literal    := JSON string | JSON number | true | false | null

Bounded: at most MAX_FILTER_BYTES long and MAX_FILTER_DEPTH levels of `(` and `not`; no
regex, no loops, so one evaluation costs at most a few hundred steps. A value of the wrong type
at run time makes a comparison false (`!=`: true when the field exists), never an error."""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from broker.core.errors import MempError

MAX_FILTER_BYTES = 1024
MAX_FILTER_DEPTH = 16
MISSING: Any = object()  # what a pointer resolves to when the value has no such field


class Subject(Protocol):
    """What a filter looks at: an event's type, key, agent and version, and its value (the
    removed value for a delete or expiry), decoded on demand; MISSING for none."""

    @property
    def type(self) -> str: ...
    @property
    def key(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def version(self) -> int: ...
    def document(self) -> Any: ...


Filter = Callable[[Subject], bool]


@dataclass(frozen=True, slots=True)
class Guard:
    """An equality every change the filter accepts satisfies: `read` (the operand `operand`)
    gives one of `keys` (as `index_key` makes them). The hub indexes subscribers by it, so a
    change is offered only to those whose guard it meets; `whole`: the guard is the entire
    filter, so meeting it is accepting."""

    operand: str
    read: Callable[[Subject], Any]
    keys: frozenset[Any]
    whole: bool = False


def index_key(value: Any) -> Any:
    """A key equal for values `==` finds equal (3 and 3.0; not true and 1); None for values
    no literal equals (arrays, objects, a missing field)."""
    kind = _kind(value)
    if kind in (float, str, bool, type(None)):
        return kind.__name__, value
    return None

# Tokens: (kind, text, position). Kinds: op, punct, pointer, string, number, word, end.
_TOKEN_RE = re.compile(r"""
    (?P<space>[ \t\r\n]+)
  | (?P<op>==|!=|<=|>=|<|>)
  | (?P<punct>[()\[\],])
  | (?P<pointer>/[^\s()\[\],=!<>"]*)
  | (?P<string>"(?:[^"\\\x00-\x1f]|\\.)*")
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<word>[a-z_]+)
""", re.VERBOSE)
_FIELDS = {"type": str, "key": str, "agent": str, "version": int}
_ORDERING: dict[str, Callable[[Any, Any], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
Token = tuple[str, str, int]


def filter_error(message: str, position: int | None = None) -> MempError:
    """`400 invalid_request` about the `filter` parameter, naming the position if known."""
    where = f" at position {position}" if position is not None else ""
    details: dict[str, Any] = {"parameter": "filter"}
    if position is not None:
        details["position"] = position
    return MempError("invalid_request", f"filter: {message}{where}", details)


def compile_filter(text: str) -> Filter:
    """The filter `text` as one closure over a `Subject`; errors are `filter_error`s."""
    return compile_guarded(text)[0]


def compile_guarded(text: str) -> tuple[Filter, Guard | None]:
    """The filter, and the equality (or `in`) every change it accepts meets, if there is one:
    the whole filter, or a term of its top-level `and`."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILTER_BYTES:
        raise filter_error(f"longer than {MAX_FILTER_BYTES} bytes")
    parser = _Parser(_tokens(text))
    compiled = parser.expression(0)
    kind, word, position = parser.peek()
    if kind != "end":
        raise filter_error(f"unexpected {word!r}", position)
    if compiled in parser.guards:
        return compiled, dataclasses.replace(parser.guards[compiled], whole=True)
    terms = parser.conjunctions.get(compiled, [])
    return compiled, next((parser.guards[t] for t in terms if t in parser.guards), None)


def _tokens(text: str) -> list[Token]:
    tokens: list[Token] = []
    position = 0
    while position < len(text):
        match = _TOKEN_RE.match(text, position)
        if match is None:
            if text[position] == '"':
                raise filter_error("unterminated string, or a control character in it",
                                   position)
            raise filter_error(f"unexpected character {text[position]!r}", position)
        kind = match.lastgroup or ""
        if kind != "space":
            tokens.append((kind, match.group(), position))
        position = match.end()
    tokens.append(("end", "end of filter", len(text)))
    return tokens


def _literal(token: Token) -> Any:
    kind, text, position = token
    if kind == "string":
        try:
            return msgspec.json.decode(text)
        except msgspec.DecodeError:
            raise filter_error("invalid string", position) from None
    if kind == "number":
        value: Any = float(text) if any(c in text for c in ".eE") else int(text)
        if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > 2**1023:
            raise filter_error("number out of range", position)
        return value
    if kind == "word" and text in ("true", "false", "null"):
        return {"true": True, "false": False, "null": None}[text]
    raise filter_error(f"expected a value, not {text!r}", position)


def _pointer(text: str, position: int) -> Callable[[Any], Any]:
    """A JSON pointer (RFC 6901) as a lookup: the value it names, or MISSING."""
    parts = [p.replace("~1", "/").replace("~0", "~") for p in text[1:].split("/")]
    if any("~" in p.replace("~0", "").replace("~1", "") for p in text[1:].split("/")):
        raise filter_error("'~' in a pointer must be ~0 or ~1", position)

    def resolve(doc: Any) -> Any:
        for part in parts:
            if isinstance(doc, dict):
                doc = doc.get(part, MISSING)
            elif isinstance(doc, list) and part.isdigit() and (part == "0" or part[0] != "0"):
                index = int(part)
                doc = doc[index] if index < len(doc) else MISSING
            else:
                return MISSING
            if doc is MISSING:
                return MISSING
        return doc

    return resolve


def _kind(value: Any) -> type:
    """A JSON value's type for comparisons: int and float are one kind, bool is not a number."""
    return float if type(value) in (int, float) else type(value)


def _equal(a: Any, b: Any) -> bool:
    return _kind(a) is _kind(b) and a == b


class _Parser:
    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.at = 0
        self.operand_text = ""
        self.guards: dict[Filter, Guard] = {}  # the equalities made, by their closure
        self.conjunctions: dict[Filter, list[Filter]] = {}  # the `and`s made, with their terms

    def peek(self) -> Token:
        return self.tokens[self.at]

    def take(self) -> Token:
        token = self.tokens[self.at]
        self.at += 1
        return token

    def expect(self, text: str) -> Token:
        token = self.take()
        if token[1] != text or token[0] in ("string", "pointer"):
            raise filter_error(f"expected {text!r}, not {token[1]!r}", token[2])
        return token

    def expression(self, depth: int) -> Filter:
        terms = [self.conjunction(depth)]
        while self.peek()[:2] == ("word", "or"):
            self.take()
            terms.append(self.conjunction(depth))
        if len(terms) == 1:
            return terms[0]
        return lambda s: any(term(s) for term in terms)

    def conjunction(self, depth: int) -> Filter:
        terms = [self.unary(depth)]
        while self.peek()[:2] == ("word", "and"):
            self.take()
            terms.append(self.unary(depth))
        if len(terms) == 1:
            return terms[0]
        conjunction: Filter = lambda s: all(term(s) for term in terms)  # noqa: E731
        self.conjunctions[conjunction] = terms
        return conjunction

    def unary(self, depth: int) -> Filter:
        kind, text, position = self.peek()
        if (kind, text) in (("word", "not"), ("punct", "(")):
            if depth >= MAX_FILTER_DEPTH:
                raise filter_error(f"nested deeper than {MAX_FILTER_DEPTH} levels", position)
            self.take()
            if text == "not":
                inner = self.unary(depth + 1)
                return lambda s: not inner(s)
            inner = self.expression(depth + 1)
            self.expect(")")
            return inner
        if (kind, text) == ("word", "exists"):
            self.take()
            self.expect("(")
            kind, text, position = self.take()
            if kind != "pointer":
                raise filter_error("exists() takes a JSON pointer such as /owner", position)
            resolve = _pointer(text, position)
            self.expect(")")
            return lambda s: resolve(s.document()) is not MISSING
        return self.comparison()

    def operand(self) -> tuple[Callable[[Subject], Any], type | None]:
        """How to read the operand, and its type if fixed (None: any JSON value)."""
        kind, text, position = self.peek()
        self.operand_text = text
        self.take()
        if kind == "pointer":
            resolve = _pointer(text, position)
            return (lambda s: resolve(s.document())), None
        if kind == "word" and text in _FIELDS:
            name = text
            return (lambda s: getattr(s, name)), _FIELDS[name]
        if kind == "word":
            raise filter_error(f"unknown name {text!r} (fields: type, key, agent, version, "
                               "/pointer; function: exists)", position)
        raise filter_error(f"expected a field or a /pointer, not {text!r}", position)

    def typed_literal(self, fixed: type | None) -> Any:
        token = self.take()
        value = _literal(token)
        if fixed is not None and _kind(value) is not _kind(fixed()):
            raise filter_error(f"{token[1]} cannot be compared with a {fixed.__name__} field",
                               token[2])
        return value

    def comparison(self) -> Filter:
        read, fixed = self.operand()
        operand = self.operand_text
        kind, op, position = self.take()
        if kind == "op":
            literal = self.typed_literal(fixed)
            compared = _compare(read, op, literal, position)
            if op == "==":
                self.guards[compared] = Guard(operand, read, frozenset({index_key(literal)}))
            return compared
        if (kind, op) == ("word", "in"):
            self.expect("[")
            choices = [self.typed_literal(fixed)]
            while self.peek()[1] == "," and self.peek()[0] == "punct":
                self.take()
                choices.append(self.typed_literal(fixed))
            self.expect("]")
            member: Filter = lambda s: any(_equal(read(s), c) for c in choices)  # noqa: E731
            self.guards[member] = Guard(operand, read, frozenset(map(index_key, choices)))
            return member
        if (kind, op) == ("word", "contains"):
            if fixed is int:
                raise filter_error("contains needs a string or array field", position)
            literal = self.typed_literal(fixed)
            return lambda s: _contains(read(s), literal)
        raise filter_error(f"expected an operator (== != < <= > >= in contains), not {op!r}",
                           position)


def _compare(read: Callable[[Subject], Any], op: str, literal: Any, position: int) -> Filter:
    if op == "==":
        return lambda s: _equal(read(s), literal)
    if op == "!=":
        return lambda s: (v := read(s)) is not MISSING and not _equal(v, literal)
    if _kind(literal) not in (float, str):
        raise filter_error(f"{op} compares numbers or strings", position)
    order = _ORDERING[op]
    kind = _kind(literal)
    return lambda s: _kind(v := read(s)) is kind and order(v, literal)


def _contains(value: Any, literal: Any) -> bool:
    if isinstance(value, list):
        return any(_equal(item, literal) for item in value)
    return type(value) is str and type(literal) is str and literal in value
