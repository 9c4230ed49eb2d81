"""The flow language's two pieces of logic, neither of which can run code.

- **Conditions** (`branch` cases, `set` values): comparisons, `and`/`or`/`not`, `in`/`not in`, numbers,
  strings, lists of them and variable names, e.g. `hour >= 18 or weekday in ['sat', 'sun']`. They are
  parsed with Python's own grammar and then walked by a tiny interpreter that knows only those node
  kinds: no calls, no attributes, no subscripts, no imports — nothing that could reach Python.
- **Templates** (prompts, webhook URLs and bodies): `{name}` puts a variable in, `{name|digits}` reads a
  number out digit by digit ("4 7 2 1"), `{{` and `}}` are literal braces. Nothing else.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from typing import Any

from callcenter.dialog.redact import Masked
from callcenter.errors import CallcenterError

TRUE_WORDS = {"true": True, "false": False, "none": None, "null": None}
FILTERS = ("digits", "upper", "lower", "date")
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_COMPARE = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


MAX_SOURCE_CHARS = 2000
MAX_DEPTH = 60  # syntax-tree depth: far beyond any real condition, well within Python's recursion limit


class ExprError(CallcenterError, ValueError):
    pass


@dataclass(frozen=True)
class Expr:
    """A checked condition or value expression."""

    source: str
    tree: ast.Expression
    names: frozenset[str]

    def eval(self, variables: dict[str, Any]) -> Any:
        """The value; TypeError for values of the wrong kind (a missing value compared with a number),
        ExprError for anything else that goes wrong (a number too large for a float)."""
        try:
            return _eval(self.tree.body, variables)
        except (OverflowError, ZeroDivisionError) as exc:
            raise ExprError(f"{self.source!r}: {exc}") from None
        except (RecursionError, MemoryError):
            raise ExprError(f"{self.source!r}: too deeply nested") from None

    def truth(self, variables: dict[str, Any]) -> bool:
        try:
            return bool(self.eval(variables))
        except (TypeError, ExprError):  # comparing a missing (None) value with a number: not true
            return False


# what people write out of habit from other languages, and what this language spells instead
_HABITS = ((re.compile(r"&&"), "`and` instead of `&&`"), (re.compile(r"\|\|"), "`or` instead of `||`"),
           (re.compile(r"!(?!=)"), "`not` instead of `!`"), (re.compile(r"={3}"), "`==` instead of `===`"),
           (re.compile(r"=>"), "`>=` instead of `=>`"), (re.compile(r"=<"), "`<=` instead of `=<`"),
           (re.compile(r"(?<![=!<>])=(?![=<>])"), "`==` to compare (`=` assigns, and expressions never assign)"))
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _usual_mistakes(text: str) -> str:
    bare = _QUOTED.sub("''", text)  # never hint at what is inside a quoted string
    hints = [hint for rx, hint in _HABITS if rx.search(bare)]
    return "; write " + ", ".join(hints) if hints else ""


def parse_expr(source: str) -> Expr:
    """Parse and check an expression; ExprError names what is not allowed."""
    text = str(source).strip()
    if not text:
        raise ExprError("empty expression")
    if len(text) > MAX_SOURCE_CHARS:
        raise ExprError(f"expression longer than {MAX_SOURCE_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        at = f" at column {exc.offset} of the expression" if exc.offset else ""
        raise ExprError(f"cannot parse {text!r}{at}: {exc.msg}{_usual_mistakes(text)}") from None
    except (RecursionError, MemoryError):
        raise ExprError(f"{text[:40]!r}...: too deeply nested") from None
    if _depth(tree) > MAX_DEPTH:
        raise ExprError(f"{text[:40]!r}...: nested more than {MAX_DEPTH} deep")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub,
                             ast.Compare, ast.Load, ast.List, ast.Tuple, ast.BinOp)) or type(node) in _COMPARE \
                or type(node) in _ARITH:
            continue
        if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float, bool))):
            continue
        if isinstance(node, ast.Name):
            if node.id.lower() not in TRUE_WORDS:
                names.add(node.id)
            continue
        what = type(node).__name__.lower()
        raise ExprError(f"{text!r}: {what} is not allowed (only comparisons, and/or/not, in, + - *, "
                        f"numbers, strings, lists and variable names)")
    return Expr(text, tree, frozenset(names))


def _depth(tree: ast.AST) -> int:
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


def _eval(node: ast.AST, v: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id.lower() in TRUE_WORDS and node.id not in v:
            return TRUE_WORDS[node.id.lower()]
        return v.get(node.id)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, v) for e in node.elts]
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            result: Any = True
            for e in node.values:
                result = _eval(e, v)
                if not result:
                    return result
            return result
        result = False
        for e in node.values:
            result = _eval(e, v)
            if result:
                return result
        return result
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, v)
        return (not value) if isinstance(node.op, ast.Not) else -value
    if isinstance(node, ast.BinOp):  # numbers only: "'x' * 10**9" must not build a gigabyte string
        left, right = _number(_eval(node.left, v)), _number(_eval(node.right, v))
        return _ARITH[type(node.op)](left, right)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, v)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, v)
            if isinstance(op, (ast.In, ast.NotIn)) and right is None:
                right = []
            if not _COMPARE[type(op)](_coerce(left, right), _coerce(right, left)):
                return False
            left = right
        return True
    raise ExprError(f"cannot evaluate {type(node).__name__}")  # parse_expr lets nothing else through


def _number(x: Any) -> float | int:
    if isinstance(x, bool) or not isinstance(x, (int, float, str)):
        raise TypeError(f"not a number: {x!r}")
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            raise TypeError(f"not a number: {x!r}") from None
    return x


def _coerce(a: Any, b: Any) -> Any:
    """Slot values arrive as text ("42"); compare them with numbers as numbers."""
    if isinstance(a, str) and isinstance(b, (int, float)) and not isinstance(b, bool):
        try:
            return float(a)
        except ValueError:
            return a
    return a


# ------------------------------------------------------------------ templates
@dataclass(frozen=True)
class Placeholder:
    name: str
    filter: str | None


def template_names(text: str) -> list[Placeholder]:
    """The placeholders of a template; ExprError for a malformed one."""
    out = []
    for m in _PLACEHOLDER.finditer(text):
        token = m.group(0)
        if token in ("{{", "}}"):
            continue
        if m.group(1) is None:
            raise ExprError(f"unbalanced {token!r} in {text!r} (write {token * 2} for a literal brace)")
        name, _, filt = m.group(1).strip().partition("|")
        name, filt = name.strip(), filt.strip() or None
        if not _NAME.match(name):
            raise ExprError(f"{{{m.group(1)}}}: a placeholder is a variable name, optionally |digits")
        if filt is not None and filt not in FILTERS:
            raise ExprError(f"{{{m.group(1)}}}: unknown filter {filt!r} (known: {', '.join(FILTERS)})")
        out.append(Placeholder(name, filt))
    return out


def render(text: str, variables: dict[str, Any], encode=None, raw: frozenset[str] | set[str] = frozenset()) -> str:
    """Fill a template. A variable with no value reads as nothing. `encode` (URL quoting) applies to
    every value except one the template starts with whose name is in `raw` (a base URL kept in a
    variable the flow's author sets)."""

    def sub(m: re.Match) -> str:
        token = m.group(0)
        if token in ("{{", "}}"):
            return token[0]
        if m.group(1) is None:
            return token
        name, _, filt = m.group(1).strip().partition("|")
        value = variables.get(name.strip())
        filt = filt.strip()
        if isinstance(value, Masked):  # a sensitive value this prompt may not say in full
            text = " ".join(value.last) if filt == "digits" else f"ending in {' '.join(value.last)}"
            return encode(text) if encode else text
        text = "" if value is None else _spoken(value)
        if filt == "digits":
            text = " ".join(ch for ch in text if ch.isalnum())
        elif filt == "date":
            text = spoken_date(text)
        elif filt == "upper":
            text = text.upper()
        elif filt == "lower":
            text = text.lower()
        return encode(text) if encode and (m.start() > 0 or name.strip() not in raw) else text

    filled = _PLACEHOLDER.sub(sub, text)
    return filled.strip() if encode else " ".join(filled.split())


MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
               "November", "December")


def spoken_date(text: str) -> str:
    """`1985-03-04` → `4 March 1985` (`{born|date}`): how a date is read back to a caller. Anything
    else is left as it is."""
    m = re.fullmatch(r"(\d{4})-(\d{2})-(\d{2})", text.strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        return text
    return f"{int(m.group(3))} {MONTH_NAMES[int(m.group(2)) - 1]} {int(m.group(1))}"


def _spoken(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
