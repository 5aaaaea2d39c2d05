"""The shared interpreter of module code (scaffold/detect/evaluate.py): what it computes, and its bounds.

Code that would run forever, build a huge tensor, or reach outside the whitelist (a module that is not torch's,
numpy's or math's, a builtin that opens, imports or evaluates) is refused by name, in bounded time and memory,
and nothing of the code read is ever imported or called: the tests write a real module file whose import or call
would leave a mark, and check that none is left."""

from __future__ import annotations

import ast
import math
import sys
import time
import tracemalloc

import numpy as np
import pytest

from scaffold.detect.differential import evaluate_init
from scaffold.detect.evaluate import CannotEvaluate, Interpreter, Limits, Obj


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


def _run(text: str, name: str = "f", args=(), limits: Limits | None = None):
    functions = _functions(text)
    return Interpreter(functions, limits=limits or Limits()).call_function(functions[name], None, list(args))


def _refused(text: str, args=(), limits: Limits | None = None) -> str:
    """The refusal of running f(*args), checked to come within 20 s and 64 MiB of Python allocations."""
    tracemalloc.start()
    start = time.monotonic()
    try:
        with pytest.raises(CannotEvaluate) as info:
            _run(text, "f", args, limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - start < 20
    assert peak < 64 << 20, peak
    return str(info.value)


def test_a_table_builder_is_computed_as_numpy_computes_it():
    text = '''
import math
import torch

def inv(dim, base=10000):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))

def f(rows, dim):
    freqs = torch.outer(torch.arange(rows), inv(dim))
    table = torch.zeros(rows, dim)
    table[:, 0::2] = torch.sin(freqs)
    table[:, 1::2] = torch.cos(freqs)
    scale = [math.sqrt(i + 1) for i in range(rows) if i % 2 == 0]
    total = 0
    for i in range(3):
        if i == 1:
            continue
        total += i
    return table, sum(scale), total
'''
    table, scale, total = _run(text, args=(7, 8))
    angles = np.arange(7)[:, None] * (1.0 / 10000 ** (np.arange(0, 8, 2) / 8))
    expected = np.stack([np.sin(angles), np.cos(angles)], -1).reshape(7, 8)
    assert np.allclose(table, expected, atol=1e-12, rtol=0)
    assert scale == pytest.approx(sum(math.sqrt(i + 1) for i in range(7) if i % 2 == 0))
    assert total == 2


def test_a_method_reads_and_sets_its_objects_attributes():
    text = '''
class M:
    def __init__(self, config):
        self.dim = config.head_dim // 2
        setattr(self, "base", config.rope_parameters["rope_theta"])

    def scaled(self, x):
        return x * self.base ** 0 + self.dim
'''
    cls = next(n for n in ast.parse(text).body if isinstance(n, ast.ClassDef))
    methods = {n.name: n for n in cls.body}
    interp = Interpreter({}, methods)
    me = Obj(name="self")
    interp.call_function(methods["__init__"], me, [Obj({"head_dim": 8, "rope_parameters": {"rope_theta": 5.0}})])
    assert me.attrs == {"dim": 4, "base": 5.0}
    assert interp.call_function(methods["scaled"], me, [np.ones(3)]).tolist() == [5.0, 5.0, 5.0]


@pytest.mark.parametrize("body", [
    "while True:\n        x = x + 1",
    "for i in range(10 ** 12):\n        x = x + i",
    "while x < 10:\n        x = x - 1",
    "return [i for i in range(10 ** 12)]",
    "return g(x)",
])
def test_a_loop_that_would_run_forever_is_refused_in_bounded_time(body):
    text = f"def g(x):\n    return g(x + 1)\n\n\ndef f(x):\n    {body}\n"
    reason = _refused(text, [0])
    assert "too many steps" in reason or "nested too deep" in reason or "numbers (over" in reason, reason


@pytest.mark.parametrize("expr", [
    "torch.zeros(10 ** 6, 10 ** 6)",
    "torch.ones((100000, 100000))",
    "torch.arange(10 ** 12)",
    "torch.arange(0, 1, 1e-12)",
    "torch.outer(torch.arange(10 ** 5), torch.arange(10 ** 5))",
    "torch.arange(1000).unsqueeze(0).expand(10 ** 6, -1)",
    "torch.arange(1000).repeat(10 ** 6)",
    "torch.arange(1000)[:, None] + torch.arange(10 ** 5)[None, :]",
    "torch.einsum('i,j->ij', torch.arange(10 ** 5), torch.arange(10 ** 5))",
    "[0] * 10 ** 12",
    "'x' * 10 ** 12",
    "2 ** 10 ** 9",
])
def test_a_huge_value_is_refused_before_it_is_built(expr):
    reason = _refused(f"import torch\n\ndef f():\n    return {expr}\n")
    assert "over" in reason or "bits" in reason, reason


def test_a_value_doubling_in_a_loop_is_refused_at_the_bound():
    reason = _refused("def f():\n    x = [0]\n    while True:\n        x = x + x\n")
    assert "a sequence of" in reason and "over" in reason, reason
    reason = _refused("def f():\n    x = 3\n    while True:\n        x = x * x\n")
    assert "bits" in reason, reason


@pytest.mark.parametrize(("statement", "named"), [
    ("import os", "Import"),
    ("from os import system", "ImportFrom"),
    ("return __import__('os')", "name __import__"),
    ("return os.getcwd()", "name os"),
    ("return open('/tmp/x', 'w')", "name open"),
    ("return eval('1 + 1')", "name eval"),
    ("return exec('x = 1')", "name exec"),
    ("return compile('1', 'f', 'eval')", "name compile"),
    ("return torch.load('weights.pt')", "call torch.load"),
    ("return getattr(torch, 'load')('weights.pt')", "getattr: no load"),
    ("return torch.arange(3).numpy()", "attribute or method numpy of an array"),
    ("return torch.arange(3).__class__", "attribute or method __class__ of an array"),
    ("return {}.__class__.__mro__", "attribute __class__ of dict"),
    ("return ().__class__", "attribute __class__ of tuple"),
    ("return [].append(1)", "attribute append of list"),
    ("return isinstance(1, int)", "isinstance"),
    ("return lambda: 1", "Lambda"),
    ("del x", "Delete"),
    ("global x", "Global"),
    ("try:\n        pass\n    finally:\n        pass", "Try"),
])
def test_what_is_outside_the_whitelist_is_refused_by_name(statement, named):
    reason = _refused(f"import torch\n\ndef f():\n    x = 1\n    {statement}\n")
    assert named in reason, reason


def test_no_import_or_call_of_the_code_read_happens(tmp_path):
    """A real module whose import writes one mark and whose function writes another: reading it leaves neither,
    and the module is never imported."""
    marks = tmp_path / "marks"
    marks.mkdir()
    name = "scaffold_lab_untouchable"
    text = f'''
import pathlib
pathlib.Path({str(marks / "imported")!r}).write_text("imported")


def touch(x):
    pathlib.Path({str(marks / "called")!r}).write_text("called")
    return x


def helper(x):
    return x * 2


def f(x):
    y = helper(x)
    return touch(y)
'''
    (tmp_path / f"{name}.py").write_text(text)
    sys.path.insert(0, str(tmp_path))
    try:
        functions = _functions(text)
        with pytest.raises(CannotEvaluate, match="name pathlib"):
            Interpreter(functions).call_function(functions["f"], None, [3])
        assert Interpreter(functions).call_function(functions["helper"], None, [3]) == 6
    finally:
        sys.path.remove(str(tmp_path))
    assert list(marks.iterdir()) == []
    assert name not in sys.modules


def test_errors_of_the_values_are_refusals_not_crashes():
    assert "division by zero" in _refused("def f():\n    return 1 / 0\n")
    assert "no key 'b'" in _refused("def f():\n    return {'a': 1}['b']\n")
    assert "broadcast" in _refused("import torch\n\ndef f():\n    return torch.ones(3) + torch.ones(4)\n")
    assert "no value for x" in _refused("def f(x):\n    return x\n")


def test_the_limits_are_the_callers():
    text = "def f(n):\n    total = 0\n    for i in range(n):\n        total = total + i\n    return total\n"
    assert _run(text, args=[100], limits=Limits(steps=1000)) == 4950
    assert "too many steps (over 100)" in _refused(text, [100], Limits(steps=100))
    assert "over 50" in _refused("import torch\n\ndef f():\n    return torch.zeros(60)\n", (), Limits(elements=50))


def test_differential_init_is_evaluated_without_eval():
    """diff_lambda_init, the port's expression of the layer index, computed by the shared interpreter: Python's
    numbers (a division by zero or a domain error is a refusal naming the layer)."""
    assert evaluate_init("0.8 - 0.6 * math.exp(-0.3 * layer_idx)", 2) == pytest.approx(0.8 - 0.6 * math.exp(-0.6))
    assert evaluate_init("2 ** layer_idx / 3", 3) == pytest.approx(8 / 3)
    with pytest.raises(CannotEvaluate, match=r"1 / layer_idx at layer 0: float division by zero"):
        evaluate_init("1 / layer_idx", 0)
    with pytest.raises(CannotEvaluate, match=r"at layer 0: math domain error"):
        evaluate_init("math.log(layer_idx)", 0)
    with pytest.raises(CannotEvaluate, match="not plain arithmetic"):
        evaluate_init("__import__('os').getcwd()", 0)
