"""Calculator (augmentation type `math`): exact arithmetic on untrusted text, without `eval`.

Parses the argument with Python's `ast` and evaluates only numbers, + - * / // % ** and parentheses,
with bounds on exponents and result size so that "9**9**9" cannot stall the server. Integers stay
exact; "1,000" is read as 1000; a result that is a whole number prints without ".0".
"""

from __future__ import annotations

import ast
import math
import operator
import re
from fractions import Fraction

from augmentations.base import CallContext, ToolError, ToolResult

MAX_EXPONENT = 1000
MAX_DIGITS = 300
MAX_INPUT_CHARS = 500

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _check_size(x: Fraction) -> Fraction:
    if abs(x.numerator) >= 10**MAX_DIGITS or x.denominator >= 10**MAX_DIGITS:
        raise ToolError("result too large")
    return x


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ToolError("not a finite number")
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            if right.denominator != 1:
                raise ToolError("only whole-number exponents are supported")
            if abs(right) > MAX_EXPONENT or (abs(left) > 1 and abs(right) * math.log10(abs(left)) > MAX_DIGITS):
                raise ToolError("exponent too large")
            return _check_size(left ** int(right))
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        return _check_size(_BIN[type(node.op)](left, right))
    raise ToolError(f"unsupported expression: {ast.unparse(node)}")


def evaluate(expression: str) -> Fraction:
    text = expression.strip().replace("×", "*").replace("÷", "/").replace("^", "**")
    # Thousands separators ("1,000") but not argument lists: only digit,3-digit groups.
    text = re.sub(r"(?<=\d),(?=\d{3}(\D|$))", "", text)
    if not text:
        raise ToolError("empty expression")
    if len(text) > MAX_INPUT_CHARS:
        raise ToolError(f"expression longer than {MAX_INPUT_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {expression!r}") from e
    return _eval(tree)


def format_number(x: Fraction) -> str:
    if x.denominator == 1:
        return str(x.numerator)
    value = x.numerator / x.denominator
    return f"{value:.10g}"


class Calculator:
    name = "Calculator"
    aug_type = "math"
    description = "Calculator[expression]: evaluates arithmetic, e.g. Calculator[29*13] -> 377"

    async def run(self, args: str, ctx: CallContext) -> ToolResult:
        try:
            return ToolResult(format_number(evaluate(args)))
        except ToolError as e:
            return ToolResult(f"error: {e}", error=True)

    async def close(self) -> None:
        return None
