from __future__ import annotations

from fractions import Fraction

import pytest

from augmentations.base import Augmentation, CallContext
from augmentations.calculator import Calculator, evaluate, format_number
from augmentations.registry import Registry, UnknownTool


@pytest.mark.parametrize(
    "expr, value",
    [
        ("29*13", "377"),
        (" 120 - 45 ", "75"),
        ("64/60 * 100", "106.6666667"),
        ("1,000 + 2,500", "3500"),
        ("2^10", "1024"),
        ("-(3 + 4) * 2", "-14"),
        ("7 // 2 + 7 % 2", "4"),
        ("0.1 + 0.2", "0.3"),  # exact rationals: no 0.30000000000000004
        ("12×7", "84"),
        ("10**40", "1" + "0" * 40),  # integers stay exact
    ],
)
def test_evaluates_exactly(expr: str, value: str) -> None:
    assert format_number(evaluate(expr)) == value


@pytest.mark.parametrize(
    "expr, message",
    [
        ("__import__('os').system('x')", "unsupported"),
        ("9**9**9", "exponent too large"),
        ("1/0", "division by zero"),
        ("2**0.5", "whole-number exponents"),
        ("abc", "unsupported"),
        ("1 +", "cannot parse"),
        ("", "empty"),
        ("1+" * 400 + "1", "longer than"),
    ],
)
async def test_rejects_bad_input_with_a_message(expr: str, message: str) -> None:
    result = await Calculator().run(expr, CallContext())
    assert result.error and message in result.content


def test_fractions_print_compactly() -> None:
    assert format_number(Fraction(1, 3)) == "0.3333333333"
    assert format_number(Fraction(10, 2)) == "5"


async def test_registry_lookup_and_hints() -> None:
    reg = Registry([Calculator()])
    assert isinstance(Calculator(), Augmentation)
    assert reg.get("calculator").name == "Calculator" and "CALCULATOR" in reg
    with pytest.raises(UnknownTool, match="unknown tool 'Search'; available: Calculator"):
        reg.get("Search")
    hints = reg.hints()
    # Type from the executor, expected duration = the Table 1 mean for math (9e-5 s).
    assert hints["Calculator"].aug_type == "math" and hints["Calculator"].expected_s == pytest.approx(9e-5)
    assert hints["calculator"] == hints["Calculator"]
    with pytest.raises(ValueError, match="twice"):
        reg.add(Calculator())
    await reg.close()
