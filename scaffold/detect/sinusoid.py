"""A sinusoidal position table read from the code that builds it: which one does it compute?

XGLM, CTRL and the original Transformer add to the token embedding a fixed table of sines and cosines of the
position times an inverse frequency. The families write it differently: XGLM as
`exp(arange(half) * -(log(10000) / (half - 1)))`, the sines then the cosines (`cat([sin, cos])`), row
`padding_idx` zeroed; CTRL as `1 / pow(10000, 2 * (i // 2) / d)` over every column, the sines of the even
columns then the cosines of the odd ones; a lab may write `pe[:, 0::2] = sin(...)`, `pe[:, 1::2] = cos(...)`
(sine and cosine interleaved) or another divisor. So the formula is not matched as text: the function that
builds the table is interpreted over numbers (a small array language: arange, exp, log, pow, sin, cos, cat,
stack, unsqueeze, view, slices, slice assignment, the `if`s of the function and the module-level helpers it
calls) at two small sizes, and the result is compared with every candidate of the family

    inv_freq[j] = base ** (-j / (d / 2 - shift)),  j < d / 2
    row p = [sin(p * inv_freq), cos(p * inv_freq)]  (concatenated)  or  [sin, cos, sin, cos, ...] (interleaved)

with `base` a number of the code and shift 0 or 1. A function that computes anything else is named, not guessed.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import numpy as np

from scaffold.detect.sourcecode import Found, _dotted, _parsed, subtree

# Two sizes (rows, width) at which the table is interpreted: an even width whose half is odd and one whose half
# is even, enough positions that frequencies and orders differ.
SAMPLES = ((11, 12), (9, 8))
PADDING_SAMPLE = 3  # the row a padding parameter is given, to see whether the function zeroes it
TOLERANCE = 1e-9
MAX_DEPTH = 4  # helper calls followed


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


class _Unknown(Exception):
    pass


_DTYPE = object()  # a dtype argument: the interpreter computes in float64 whatever the code asks


def _call_name(call: ast.Call) -> str:
    return _dotted(call.func).rsplit(".", 1)[-1]


class _Interpreter:
    """Runs one function of the table's code over numpy values; raises _Unknown at anything else."""

    def __init__(self, functions: dict[str, ast.FunctionDef], depth: int = 0):
        self.functions, self.depth = functions, depth

    def run(self, func: ast.FunctionDef, args: list) -> object:
        params = [a.arg for a in func.args.posonlyargs + func.args.args if a.arg not in ("self", "cls")]
        if len(args) > len(params):
            raise _Unknown(f"{func.name} takes {len(params)} arguments")
        env = dict(zip(params, args))
        defaults = func.args.defaults
        for name, default in zip(params[len(params) - len(defaults):], defaults):
            env.setdefault(name, self.expr(default, {}))
        missing = [p for p in params if p not in env]
        if missing:
            raise _Unknown(f"{func.name}: no value for {', '.join(missing)}")
        result = self.block(func.body, env)
        if result is None:
            raise _Unknown(f"{func.name} returns nothing")
        return result[0]

    def block(self, body: list[ast.stmt], env: dict) -> tuple | None:
        for stmt in body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and (
                    _dotted(stmt.value.func) == "self.register_buffer" and len(stmt.value.args) >= 2):
                return (self.expr(stmt.value.args[1], env),)  # a constructor that builds the table as its buffer
            if (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                    and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "__init__"):
                continue  # super().__init__()
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                    and _dotted(stmt.targets[0]).startswith("self.")):
                continue  # a module attribute (the sizes kept); the table is what the code returns or registers
            if isinstance(stmt, ast.Return):
                return (self.expr(stmt.value, env),)
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                self.assign(stmt.targets[0], self.expr(stmt.value, env), env)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                env[stmt.target.id] = self.binop(stmt.op, env[stmt.target.id], self.expr(stmt.value, env))
            elif isinstance(stmt, ast.If):
                out = self.block(stmt.body if self.expr(stmt.test, env) else stmt.orelse, env)
                if out is not None:
                    return out
            else:
                raise _Unknown(f"line {stmt.lineno}: {type(stmt).__name__}")
        return None

    def assign(self, target: ast.expr, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
            array = env[target.value.id]
            if not isinstance(array, np.ndarray):
                raise _Unknown(f"line {target.lineno}: assignment into a non-array")
            array[self.index(target.slice, env)] = value
        else:
            raise _Unknown(f"line {target.lineno}: assignment to {ast.unparse(target)}")

    def index(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Tuple):
            return tuple(self.index(e, env) for e in node.elts)
        if isinstance(node, ast.Slice):
            parts = [None if p is None else self.expr(p, env) for p in (node.lower, node.upper, node.step)]
            return slice(*parts)
        if isinstance(node, ast.Constant) and node.value is Ellipsis:
            return Ellipsis
        if isinstance(node, ast.Constant) and node.value is None:
            return None
        value = self.expr(node, env)
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return value

    def binop(self, op: ast.operator, a, b):
        ops = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
               ast.FloorDiv: np.floor_divide, ast.Pow: np.power, ast.Mod: np.mod}
        if type(op) not in ops or a is None or b is None:
            raise _Unknown(f"operator {type(op).__name__}")
        out = ops[type(op)](a, b)
        if isinstance(out, np.generic):
            out = out.item()
        return out

    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (bool, int, float)) or node.value is None:
                return node.value
            raise _Unknown(f"constant {node.value!r}")
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            raise _Unknown(f"name {node.id}")
        if isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted.rsplit(".", 1)[0] in ("torch", "np", "numpy") and node.attr.startswith(("float", "int", "bfloat")):
                return _DTYPE
            if dotted in ("math.pi", "np.pi", "torch.pi"):
                return math.pi
            raise _Unknown(f"attribute {dotted}")
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.expr(node.left, env), self.expr(node.right, env))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not)):
            value = self.expr(node.operand, env)
            return (not value) if isinstance(node.op, ast.Not) else -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            a, b = self.expr(node.left, env), self.expr(node.comparators[0], env)
            op = node.ops[0]
            if isinstance(op, ast.Is):
                return a is b
            if isinstance(op, ast.IsNot):
                return a is not b
            if isinstance(op, (ast.Eq, ast.NotEq, ast.Lt, ast.Gt, ast.LtE, ast.GtE)) and np.isscalar(a) and np.isscalar(b):
                return {ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.Gt: a > b, ast.LtE: a <= b,
                        ast.GtE: a >= b}[type(op)]
            raise _Unknown(f"line {node.lineno}: comparison")
        if isinstance(node, ast.BoolOp):
            values = [self.expr(v, env) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.expr(e, env) for e in node.elts]
        if isinstance(node, ast.Subscript):
            value = self.expr(node.value, env)
            if not isinstance(value, np.ndarray):
                raise _Unknown(f"line {node.lineno}: subscript of a non-array")
            return value[self.index(node.slice, env)]
        if isinstance(node, ast.Call):
            return self.call(node, env)
        raise _Unknown(f"line {getattr(node, 'lineno', 0)}: {type(node).__name__}")

    def call(self, node: ast.Call, env: dict):
        name = _call_name(node)
        func = node.func
        kwargs = {k.arg: self.expr(k.value, env) for k in node.keywords if k.arg is not None}
        # A method of an array: x.float(), x.unsqueeze(1), x.view(n, -1), x.to(dtype).
        if isinstance(func, ast.Attribute) and not _dotted(func.value).split(".")[0] in ("torch", "np", "numpy",
                                                                                        "math", "F", "nn"):
            receiver = self.expr(func.value, env)
            args = [self.expr(a, env) for a in node.args]
            if not isinstance(receiver, np.ndarray):
                raise _Unknown(f"line {node.lineno}: method {name} of a non-array")
            if name in ("float", "double", "to", "type", "type_as", "contiguous", "detach", "clone"):
                return receiver.astype(np.float64) if name in ("float", "double", "to", "type") else receiver
            if name == "unsqueeze":
                return np.expand_dims(receiver, args[0] if args else kwargs["dim"])
            if name in ("view", "reshape"):
                shape = args[0] if len(args) == 1 and isinstance(args[0], list) else args
                return receiver.reshape([int(s) for s in shape])
            if name == "flatten":
                start = args[0] if args else kwargs.get("start_dim", 0)
                start = start % receiver.ndim
                return receiver.reshape(*receiver.shape[:start], -1)
            if name in ("sin", "cos", "exp"):
                return getattr(np, name)(receiver)
            raise _Unknown(f"line {node.lineno}: method {name}")
        if name == "get_default_dtype":
            return _DTYPE
        args = [self.expr(a, env) for a in node.args]
        if name in ("sin", "cos", "exp", "log", "sqrt", "log2"):
            return getattr(np, name)(np.asarray(args[0], dtype=np.float64)).astype(np.float64) if isinstance(
                args[0], np.ndarray) else getattr(math, name)(args[0])
        if name in ("pow", "power"):
            return self.binop(ast.Pow(), args[0], args[1])
        if name == "arange":
            numbers = [a for a in args if a is not _DTYPE]
            return np.arange(*numbers).astype(np.float64)
        if name in ("cat", "concatenate"):
            return np.concatenate(args[0], axis=kwargs.get("dim", kwargs.get("axis", args[1] if len(args) > 1 else 0)))
        if name == "stack":
            return np.stack(args[0], axis=kwargs.get("dim", kwargs.get("axis", args[1] if len(args) > 1 else 0)))
        if name in ("zeros", "ones", "empty"):
            shape = args[0] if len(args) == 1 and isinstance(args[0], list) else args
            return (np.ones if name == "ones" else np.zeros)([int(s) for s in shape if s is not _DTYPE])
        if name in ("outer", "ger"):
            return np.outer(args[0], args[1])
        if name in ("int", "float"):
            return (int if name == "int" else float)(args[0])
        if isinstance(func, ast.Name) and name in self.functions and self.depth < MAX_DEPTH:
            return _Interpreter(self.functions, self.depth + 1).run(self.functions[name], args)
        raise _Unknown(f"line {node.lineno}: call {_dotted(func) or name}")


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
        tables = [(rows, width, np.asarray(_Interpreter(functions).run(func, [rows, width] + [_DTYPE] * len(
            required_rest)), dtype=np.float64)) for rows, width in SAMPLES]
    except (_Unknown, ValueError, TypeError, KeyError, IndexError, ZeroDivisionError) as exc:
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
            table = np.asarray(_Interpreter(functions).run(
                func, [rows, width] + [_DTYPE if p in required_rest else given[p] for p in params[2:]]))
        except (_Unknown, ValueError, TypeError, KeyError, IndexError, ZeroDivisionError):
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
