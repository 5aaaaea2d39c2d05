"""Hostile inputs to the per-layer heads/widths code and the carried helpers (scaffold.purecode, detect.purefuncs,
detect.conditions._value, render._helpers_stand_alone): each is refused or left unread, quickly, without raising."""

from __future__ import annotations

import ast
import time
from types import SimpleNamespace

import pytest

from scaffold.checkpoint import _short_list
from scaffold.detect import conditions, purefuncs
from scaffold.errors import SpecError
from scaffold.purecode import source_problem
from scaffold.render import _helpers_stand_alone

UNKNOWN = conditions._value(ast.parse("config.absent", mode="eval").body, {})


def _value(expr: str, config: dict):
    return conditions._value(ast.parse(expr, mode="eval").body, config, {"layer_idx": 0})


@pytest.mark.parametrize("expr, config", [
    ("config.m[layer_idx] * config.d", {"m": [10**1300], "d": 128}),  # math.isfinite raised OverflowError
    ("int(config.m[layer_idx] * 2.0)", {"m": [10**4000]}),
    ("config.d / config.m[layer_idx]", {"m": [10**1300], "d": 1}),
    ("round(config.d, config.n)", {"d": 5, "n": -10**9}),               # 10 ** 10**9: a hang
    ("round(config.d, config.n)", {"d": 5, "n": 1.5}),
])
def test_huge_or_odd_numbers_are_not_followed(expr, config):
    start = time.process_time()
    assert _value(expr, config) is UNKNOWN
    assert time.process_time() - start < 1


def test_ordinary_arithmetic_is_still_followed():
    assert _value("round(config.d * config.m[layer_idx], 0)", {"d": 128, "m": [1.25]}) == 160.0
    assert _value("config.m[layer_idx] * config.d", {"m": [10**400], "d": 2}) == 2 * 10**400
    assert _value("max(config.d, 7)", {"d": 3}) == 7


@pytest.mark.parametrize("body, problem", [
    ("return x ** x ** x", "Pow"),
    ("return 1 << x", "LShift"),
    ("x **= 10\n    return x", "Pow"),
    ("return x | 1", "BitOr"),
])
def test_operators_that_grow_numbers_without_bound_are_refused(body, problem):
    assert problem in source_problem(f"def f(x):\n    {body}\n")


def test_an_enormous_helper_text_is_refused_before_parsing():
    text = "def f(x):\n" + "    x = x + 1\n" * 200_000 + "    return x\n"
    start = time.process_time()
    assert "longer than" in source_problem(text)
    assert time.process_time() - start < 0.5


HELPER = "def round_up(v, m):\n    return (int(v) + m - 1) // m * m\n"
OTHER = "def round_up(v, m):\n    return v * 1000\n"


def test_a_helper_two_files_define_differently_is_not_written_out():
    call = ast.parse("round_up(config.x, config.k)", mode="eval").body
    assert ast.unparse(purefuncs.inline(call, {"modeling_a.py": HELPER, "modeling_z.py": OTHER})) == \
        "round_up(config.x, config.k)"
    assert purefuncs.called(call, {"modeling_a.py": HELPER, "modeling_z.py": OTHER}) == []
    # The same helper copied into two files is still the one function.
    assert "round_up" not in ast.unparse(purefuncs.inline(call, {"modeling_a.py": HELPER, "modeling_z.py": HELPER}))


def _spec(*helpers: str):
    return SimpleNamespace(code_helpers=list(helpers), source=lambda field: SimpleNamespace(detail="spec.toml"))


MODEL = """import torch


def round_up(v, m):
    return v


class MLP(torch.nn.Module):
    def __init__(self, config, layer_idx):
        width = int(round_up(config.m[layer_idx], 8))
"""


@pytest.mark.parametrize("name", ["layer_idx", "config", "width", "torch", "max"])
def test_a_carried_helper_named_as_a_parameter_or_local_of_the_model_file_is_refused(name):
    model = MODEL.replace("round_up", name)
    with pytest.raises(SpecError, match=f"defines '{name}'"):
        _helpers_stand_alone(_spec(f"def {name}(v, m):\n    return v\n"), model)


def test_a_carried_helper_of_its_own_name_stands():
    _helpers_stand_alone(_spec(HELPER), MODEL)


def test_a_refusal_lists_a_huge_number_shortly():
    text = _short_list([1, 10**4000, 2])
    assert len(text) < 60 and text.startswith("[1, 1000") and text.endswith("..., 2]")
    assert _short_list([1, 2, 3]) == "[1, 2, 3]" and _short_list(["a"]) == "['a']"
