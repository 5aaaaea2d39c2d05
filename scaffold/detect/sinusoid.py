"""A sinusoidal position table read from the code that builds it: which one does it compute?

XGLM, CTRL and the original Transformer add to the token embedding a fixed table of sines and cosines of the
position times an inverse frequency. The families write it differently: XGLM as
`exp(arange(half) * -(log(10000) / (half - 1)))`, the sines then the cosines (`cat([sin, cos])`), row
`padding_idx` zeroed; CTRL as `1 / pow(10000, 2 * (i // 2) / d)` over every column, the sines of the even
columns then the cosines of the odd ones; a lab may write `pe[:, 0::2] = sin(...)`, `pe[:, 1::2] = cos(...)`
(sine and cosine interleaved) or another divisor. So the formula is not matched as text: the function that
builds the table is interpreted over numbers (the shared interpreter of evaluate.py: arange, exp, log, pow, sin,
cos, cat, stack, unsqueeze, view, slices, slice assignment, the function's statements and the helpers it calls)
at two small sizes, and the result is compared with every candidate of the family

    inv_freq[j] = base ** (-j / (d / 2 - shift)),  j < d / 2
    row p = [sin(p * inv_freq), cos(p * inv_freq)]  (concatenated)  or  [sin, cos, sin, cos, ...] (interleaved)

with `base` a number of the code and shift 0 or 1. A function that computes anything else is named, not guessed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from scaffold.detect.evaluate import DTYPE, CannotEvaluate, Interpreter, Limits, Obj, is_static, params_of
from scaffold.detect.sourcecode import Found, _dotted, _parsed, subtree

# Two sizes (rows, width) at which the table is interpreted: an even width whose half is odd and one whose half
# is even, enough positions that frequencies and orders differ.
SAMPLES = ((11, 12), (9, 8))
PADDING_SAMPLE = 3  # the row a padding parameter is given, to see whether the function zeroes it
TOLERANCE = 1e-9
MAX_DEPTH = 4  # helper calls followed
LIMITS = Limits(depth=MAX_DEPTH + 1)  # the table's function and the helpers it calls


@dataclass(frozen=True)
class SinusoidTable:
    """What a table-building function computes (see the module's docstring)."""

    base: float
    shift: int  # the inverse frequencies' exponent divisor is d / 2 - shift
    interleaved: bool  # sin, cos alternate along the row; False: all sines, then all cosines
    padding_param: str | None  # the parameter whose row the function zeroes (XGLM's padding_idx); None: none
    function: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def describe(self) -> str:
        divisor = "d/2" if self.shift == 0 else f"d/2 - {self.shift}"
        order = "sin and cos interleaved" if self.interleaved else "all sines, then all cosines"
        zero = f", row {self.padding_param} zeroed" if self.padding_param else ""
        return f"{self.function}: sin/cos of position x {self.base:g} ** (-j / ({divisor})), {order}{zero}"


def _call_name(call: ast.Call) -> str:
    return _dotted(call.func).rsplit(".", 1)[-1]


class _TableInterpreter(Interpreter):
    """The shared interpreter (evaluate.py), reading a table's builder: a constructor's `self.X = ...` (the sizes
    kept) and `super().__init__()` are passed over, and `self.register_buffer(name, table)` returns the table.
    Its constants are numbers (and None): a string (an einsum's subscripts, a device) is refused, as the reader
    has always refused it."""

    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Constant) and not (isinstance(node.value, (bool, int, float)) or node.value is None):
            raise CannotEvaluate(f"constant {node.value!r}")
        return super().expr(node, env)

    def stmt(self, stmt: ast.stmt, env: dict) -> tuple | None:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and (
                _dotted(stmt.value.func) == "self.register_buffer" and len(stmt.value.args) >= 2):
            return (self.expr(stmt.value.args[1], env),)  # a constructor that builds the table as its buffer
        if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "__init__"):
            return None  # super().__init__()
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0]).startswith("self.")):
            return None  # a module attribute (the sizes kept); the table is what the code returns or registers
        return super().stmt(stmt, env)


def _run(functions: dict[str, ast.FunctionDef], func: ast.FunctionDef, args: list):
    """What `func` returns (or registers) on `args` (after self, where it takes one)."""
    params = params_of(func)
    receiver = Obj(name="self") if params and params[0] in ("self", "cls") and not is_static(func) else None
    result = _TableInterpreter(functions, limits=LIMITS).call_function(func, receiver, args)
    if result is None:
        raise CannotEvaluate(f"{func.name} returns nothing")
    return result


def _candidate(rows: int, width: int, base: float, shift: int, interleaved: bool) -> np.ndarray:
    half = width // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) / (half - shift))
    angles = np.arange(rows, dtype=np.float64)[:, None] * inv_freq[None, :]
    if interleaved:
        return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(rows, width)
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)


def _functions(sources: dict[str, str]) -> dict[str, tuple[str, ast.FunctionDef]]:
    """Every function of the sources by name (module level and methods), with its file."""
    out: dict[str, tuple[str, ast.FunctionDef]] = {}
    for file, tree in _parsed(sources):
        for node in subtree(tree):
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, (file, node))
    return out


def table_functions(sources: dict[str, str]) -> list[tuple[str, ast.FunctionDef]]:
    """(file, function) of every function that computes both a sine and a cosine (a table's builder), helpers
    it calls left to the interpreter."""
    out = []
    for file, func in ((f, n) for f, tree in _parsed(sources) for n in subtree(tree) if isinstance(n, ast.FunctionDef)):
        names = {_call_name(n) for n in subtree(func) if isinstance(n, ast.Call)}
        if {"sin", "cos"} <= names:
            out.append((file, func))
    return out


def read_table(sources: dict[str, str], file: str, func: ast.FunctionDef) -> SinusoidTable | str:
    """What `func` (its first two parameters: the rows and the width) computes, or why it is not read."""
    functions = {name: f for name, (_file, f) in _functions(sources).items()}
    params = [a.arg for a in func.args.posonlyargs + func.args.args if a.arg not in ("self", "cls")]
    if len(params) < 2:
        return f"{file}:{func.lineno}: {func.name} does not take the rows and the width"
    optional = params[len(params) - len(func.args.defaults):] if func.args.defaults else []
    required_rest = [p for p in params[2:] if p not in optional]
    bases = sorted({n.value for n in subtree(func) if isinstance(n, ast.Constant)
                    and isinstance(n.value, (int, float)) and not isinstance(n.value, bool) and n.value >= 100}
                   | {n.value for name in _called(func, functions) for n in subtree(functions[name])
                      if isinstance(n, ast.Constant) and isinstance(n.value, (int, float))
                      and not isinstance(n.value, bool) and n.value >= 100})
    found = None
    try:
        tables = [(rows, width, np.asarray(_run(functions, func, [rows, width] + [DTYPE] * len(required_rest)),
                                           dtype=np.float64)) for rows, width in SAMPLES]
    except CannotEvaluate as exc:
        return f"{file}:{func.lineno}: {func.name} computes what the reader does not follow ({exc})"
    for base in bases:
        for shift in (0, 1):
            for interleaved in (False, True):
                if all(t.shape == (r, w) and np.allclose(t, _candidate(r, w, base, shift, interleaved),
                                                         atol=TOLERANCE, rtol=0) for r, w, t in tables):
                    found = (float(base), shift, interleaved)
    if found is None:
        return (f"{file}:{func.lineno}: {func.name} computes a table of sines and cosines that is none of "
                "sin/cos(position x base ** (-j / (d/2 - shift))), concatenated or interleaved, for a base among "
                f"the code's numbers {bases or '(none)'}")
    padding = None
    for name in optional:
        rows, width = SAMPLES[0]
        try:
            given = {p: PADDING_SAMPLE if p == name else None for p in optional}
            table = np.asarray(_run(functions, func,
                                    [rows, width] + [DTYPE if p in required_rest else given[p] for p in params[2:]]))
        except CannotEvaluate:
            continue
        expected = _candidate(rows, width, found[0], found[1], found[2])
        expected[PADDING_SAMPLE] = 0.0
        if table.shape == expected.shape and np.allclose(table, expected, atol=TOLERANCE, rtol=0):
            padding = name
    return SinusoidTable(found[0], found[1], found[2], padding, func.name, file, func.lineno)


def _called(func: ast.FunctionDef, functions: dict[str, ast.FunctionDef], depth: int = 0) -> set[str]:
    """Names of the sources' functions `func` calls, transitively."""
    out = set()
    for node in subtree(func):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in functions:
            out.add(node.func.id)
            if depth < MAX_DEPTH:
                out |= _called(functions[node.func.id], functions, depth + 1)
    return out


def sinusoid_table(sources: dict[str, str], within: ast.AST | None = None,
                   named: str = "") -> SinusoidTable | str | None:
    """The table-building function of the positions: the one named `named` or inside `within` (the module that
    holds the table) where the sources have several, read; a reason where it is not read; None where the code
    builds no such table."""
    found = table_functions(sources)
    if len(found) > 1:
        inner = {id(n) for n in subtree(within)} if within is not None else set()
        found = [(f, fn) for f, fn in found if id(fn) in inner or fn.name == named] or found
    if not found:
        return None
    if len(found) > 1:
        return "several functions build sine and cosine tables: " + ", ".join(
            f"{f}:{fn.lineno} {fn.name}" for f, fn in found)
    return read_table(sources, *found[0])


def found_at(table: SinusoidTable) -> Found:
    return Found(table.function, table.file, table.line)
