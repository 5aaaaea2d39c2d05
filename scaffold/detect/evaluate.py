"""A bounded interpreter of module code over numbers: the one the detectors that run a checkpoint's code share.

Some forms are read by what the code computes rather than by how it is written (a sinusoid table, the order of
the rotary frequencies, differential attention): the functions are interpreted over numpy values (float64) from
their syntax tree. Nothing of the checkpoint's code is imported, compiled or called: the tree is walked, and
every operation is one of this module's, on values of its own kinds (numbers, strings, lists, tuples, dicts,
numpy arrays, `Obj` for `self` and the config, `Func` for a function of the sources).

What it runs (a whitelist; anything else raises `CannotEvaluate` naming the line and what is not followed):
- statements: expressions, return, assignment (names, tuples, attributes of an `Obj`, items of a dict or an
  array), augmented and annotated assignment, if, for, while, with (its body), break, continue, pass;
- expressions: numbers, strings, names, arithmetic and comparisons, and/or/not, conditional expressions, lists,
  tuples, sets, dicts, subscripts and slices, f-strings, comprehensions, calls of the sources' own functions and
  of `self`'s methods;
- the builtins of `BUILTINS`, the torch/numpy/math functions of `LIBRARY` (under `torch.`, `np.`, `math.`,
  `F.`, `nn.`, or bare), the array methods of `method`, getattr/setattr/hasattr on an `Obj`.

Bounds, each a `CannotEvaluate` when passed, checked before the work or the memory is spent:
- `Limits.steps` statements, loop iterations and comprehension items per top-level call;
- `Limits.depth` nested calls of the sources' functions;
- `Limits.elements` numbers in one array, items in one list, tuple, string or iteration;
- `Limits.work` multiply-adds of one matrix product or einsum;
- `Limits.int_bits` bits of one integer (2 ** 10 ** 9 is refused before it is computed).
A detector subclasses `Interpreter` for the values of its own (a linear layer, an attention call) and calls
`Interpreter.call_function`, which turns any error of the values (a shape that does not broadcast, a missing key)
into `CannotEvaluate` too: code the reader cannot run is a reason, never a crash.
"""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass

import numpy as np

from scaffold.detect.sourcecode import _dotted


class CannotEvaluate(Exception):
    """The code does something the interpreter does not run (the message names the line and what), or passes
    one of its bounds."""


class NotInLibrary(CannotEvaluate):
    """A call of torch/numpy/math that the library does not compute."""


class _Continue(Exception):
    pass


class _Break(Exception):
    pass


@dataclass(frozen=True)
class Limits:
    steps: int = 20000
    depth: int = 7  # functions of the sources running at once (the first call's included)
    elements: int = 1 << 20
    work: int = 1 << 27
    int_bits: int = 4096


class Sentinel:
    """A value the interpreter passes along without computing with it (a dtype, a device, a module)."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


DTYPE = Sentinel("dtype")  # a dtype or device: the interpreter computes in float64 whatever the code asks
# The low-precision dtypes, told apart from the others so that a test of them (`if self.precision ==
# torch.bfloat16:`) is decided; `.half()` rounds to float16, the one the interpreter follows.
HALF = Sentinel("float16")
BFLOAT16 = Sentinel("bfloat16")
DTYPES = (DTYPE, HALF, BFLOAT16)
LOW_PRECISION = {"half": HALF, "float16": HALF, "bfloat16": BFLOAT16}


def _is_dtype(value) -> bool:
    return any(value is d for d in DTYPES)
MODULE = Sentinel("module")  # torch, np, nn, math, F: their functions are the interpreter's library
MODULES = ("torch", "np", "numpy", "nn", "math", "F")
CONSTANTS = {"math.pi": math.pi, "np.pi": math.pi, "torch.pi": math.pi, "math.e": math.e}


class Obj:
    """self, or the config: attributes by name."""

    def __init__(self, attrs: dict | None = None, name: str = "object"):
        self.attrs = dict(attrs or {})
        self.name = name


@dataclass
class Func:
    node: ast.FunctionDef
    bound: object = None  # the receiver of a method, None for a function or a staticmethod


def is_static(func: ast.FunctionDef) -> bool:
    return any(_dotted(d).rsplit(".", 1)[-1] == "staticmethod" for d in func.decorator_list)


def params_of(func: ast.FunctionDef) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args]


OPERATORS = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
             ast.FloorDiv: np.floor_divide, ast.Pow: np.power, ast.Mod: np.mod, ast.MatMult: np.matmul}

PYTHON_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
                    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}

# Errors of the values themselves (numpy's shape errors, a missing key, a division by zero, an overflow): at the
# entry point they become CannotEvaluate with their message.
VALUE_ERRORS = (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, OverflowError, FloatingPointError,
                AttributeError, RecursionError, MemoryError)


class Interpreter:
    """Runs functions of the sources over numbers (see the module's docstring)."""

    def __init__(self, functions: dict[str, ast.FunctionDef], methods: dict[str, ast.FunctionDef] | None = None,
                 limits: Limits = Limits()):
        self.functions, self.methods, self.limits = functions, dict(methods or {}), limits
        self.rounding = True  # `.half()` rounds; off, it keeps float64 (to read what is rounded)
        self.steps = 0
        self.depth = 0

    # ------------------------------------------------------------------ entry point and bounds
    def call_function(self, func: ast.FunctionDef, receiver, args: list, kwargs: dict | None = None):
        """`func` run on `args`, a fresh step budget; CannotEvaluate for whatever it cannot run."""
        return self._refusing(lambda: self.run(func, receiver, list(args), dict(kwargs or {})))

    def call_block(self, body: list[ast.stmt], env: dict) -> tuple | None:
        """`body` run in `env` (a method's body, its parameters bound by the caller), a fresh step budget: the
        returned value in a 1-tuple, None where it returns nothing; CannotEvaluate for whatever it cannot run."""
        return self._refusing(lambda: self.block(body, env))

    def evaluate(self, node: ast.expr, env: dict):
        """The value of one expression in `env`; CannotEvaluate for whatever it cannot compute."""
        return self._refusing(lambda: self.expr(node, env))

    def _refusing(self, work):
        """work() on a fresh step budget, any error of the values (VALUE_ERRORS) turned into CannotEvaluate."""
        self.steps = 0
        try:
            return work()
        except CannotEvaluate:
            raise
        except VALUE_ERRORS as exc:
            raise CannotEvaluate(str(exc) or type(exc).__name__) from None

    def step(self, node: ast.AST | None = None) -> None:
        self.steps += 1
        if self.steps > self.limits.steps:
            where = f"line {node.lineno}: " if getattr(node, "lineno", None) else ""
            raise CannotEvaluate(f"{where}too many steps (over {self.limits.steps})")

    def sized(self, count: int, node: ast.AST | None, what: str = "an array") -> None:
        if count > self.limits.elements:
            where = f"line {node.lineno}: " if getattr(node, "lineno", None) else ""
            raise CannotEvaluate(f"{where}{what} of {count} numbers (over {self.limits.elements})")

    def shape_sized(self, shape, node) -> list[int]:
        shape = [int(s) for s in shape]
        if any(s < 0 for s in shape):
            raise CannotEvaluate(f"line {getattr(node, 'lineno', 0)}: a negative size in {shape}")
        self.sized(math.prod(shape), node)
        return shape

    def worked(self, count: int, node) -> None:
        if count > self.limits.work:
            raise CannotEvaluate(f"line {getattr(node, 'lineno', 0)}: a product of {count} multiply-adds "
                                 f"(over {self.limits.work})")

    def checked(self, value, node):
        """`value` where it is within the bounds of one value."""
        if isinstance(value, np.ndarray):
            self.sized(value.size, node)
        elif isinstance(value, (list, tuple, str, dict, set)):
            self.sized(len(value), node, "a sequence")
        elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > self.limits.int_bits:
            raise CannotEvaluate(f"line {getattr(node, 'lineno', 0)}: an integer of {value.bit_length()} bits")
        return value

    # ------------------------------------------------------------------ statements
    def run(self, func: ast.FunctionDef, receiver, args: list, kwargs: dict) -> object:
        if self.depth >= self.limits.depth:
            raise CannotEvaluate(f"{func.name}: calls nested too deep")
        params = params_of(func)
        env: dict = {}
        if receiver is not None and not is_static(func):
            env[params[0]] = receiver
            params = params[1:]
        if len(args) > len(params):
            raise CannotEvaluate(f"{func.name} takes {len(params)} arguments")
        env.update(zip(params, args))
        for key, value in kwargs.items():
            if key in params:
                env[key] = value
        defaults = func.args.defaults
        for name, default in zip(params[len(params) - len(defaults):], defaults):
            env.setdefault(name, self.expr(default, {}))
        for arg, default in zip(func.args.kwonlyargs, func.args.kw_defaults):
            env[arg.arg] = kwargs.get(arg.arg, self.expr(default, {}) if default is not None else None)
        if func.args.kwarg is not None:
            env[func.args.kwarg.arg] = {k: v for k, v in kwargs.items() if k not in params}
        missing = [p for p in params if p not in env]
        if missing:
            raise CannotEvaluate(f"{func.name}: no value for {', '.join(missing)}")
        self.depth += 1
        try:
            out = self.block(func.body, env)
        finally:
            self.depth -= 1
        return None if out is None else out[0]

    def block(self, body: list[ast.stmt], env: dict) -> tuple | None:
        for stmt in body:
            self.step(stmt)
            out = self.stmt(stmt, env)
            if out is not None:
                return out
        return None

    def stmt(self, stmt: ast.stmt, env: dict) -> tuple | None:
        if isinstance(stmt, ast.Expr):
            if not isinstance(stmt.value, ast.Constant):
                self.expr(stmt.value, env)
            return None
        if isinstance(stmt, ast.Return):
            return (None if stmt.value is None else self.expr(stmt.value, env),)
        if isinstance(stmt, ast.Assign):
            value = self.expr(stmt.value, env)
            for target in stmt.targets:
                self.assign(target, value, env)
            return None
        if isinstance(stmt, ast.AnnAssign):
            if stmt.value is not None:
                self.assign(stmt.target, self.expr(stmt.value, env), env)
            return None
        if isinstance(stmt, ast.AugAssign):
            load = ast.copy_location(ast.BinOp(left=_load(stmt.target), op=stmt.op, right=stmt.value), stmt)
            self.assign(stmt.target, self.expr(load, env), env)
            return None
        if isinstance(stmt, ast.If):
            return self.block(stmt.body if self.truth(self.expr(stmt.test, env)) else stmt.orelse, env)
        if isinstance(stmt, (ast.For, ast.While)):
            return self.loop(stmt, env)
        if isinstance(stmt, ast.With):
            return self.block(stmt.body, env)  # autocast and no_grad contexts: the interpreter is float64
        if isinstance(stmt, ast.Continue):
            raise _Continue
        if isinstance(stmt, ast.Break):
            raise _Break
        if isinstance(stmt, ast.Pass):
            return None
        raise CannotEvaluate(f"line {stmt.lineno}: {type(stmt).__name__}")

    def loop(self, stmt: ast.For | ast.While, env: dict) -> tuple | None:
        if isinstance(stmt, ast.For):
            items = iter(self.iterate(self.expr(stmt.iter, env), stmt))
        while True:
            self.step(stmt)
            if isinstance(stmt, ast.For):
                item = next(items, _Break)
                if item is _Break:
                    break
                self.assign(stmt.target, item, env)
            elif not self.truth(self.expr(stmt.test, env)):
                break
            try:
                out = self.block(stmt.body, env)
            except _Continue:
                continue
            except _Break:
                return None
            if out is not None:
                return out
        return self.block(stmt.orelse, env) if stmt.orelse else None

    def assign(self, target: ast.expr, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = list(self.iterate(value, target))
            if len(items) != len(target.elts):
                raise CannotEvaluate(f"line {target.lineno}: {len(items)} values for {len(target.elts)} names")
            for t, v in zip(target.elts, items):
                self.assign(t, v, env)
        elif isinstance(target, ast.Attribute):
            owner = self.expr(target.value, env)
            if not isinstance(owner, Obj):
                raise CannotEvaluate(f"line {target.lineno}: attribute of a non-object")
            owner.attrs[target.attr] = value
        elif isinstance(target, ast.Subscript):
            owner = self.expr(target.value, env)
            if isinstance(owner, dict):
                owner[self.expr(target.slice, env)] = value
            elif isinstance(owner, np.ndarray):
                owner[self.index(target.slice, env)] = value
            else:
                raise CannotEvaluate(f"line {target.lineno}: assignment into {type(owner).__name__}")
        else:
            raise CannotEvaluate(f"line {target.lineno}: assignment to {type(target).__name__}")

    # ------------------------------------------------------------------ values
    @staticmethod
    def truth(value) -> bool:
        if isinstance(value, np.ndarray):
            if value.size != 1:
                raise CannotEvaluate("the truth of an array")
            return bool(value.item())
        return bool(value)

    def iterate(self, value, node: ast.AST | None = None):
        """The items of `value`: a range lazily (a loop's steps bound it), anything else within the size bound."""
        if isinstance(value, range):
            return value
        if isinstance(value, (list, tuple, str, dict, np.ndarray, set, frozenset)):
            self.sized(len(value), node, "an iteration")
            if isinstance(value, (set, frozenset)):
                return sorted(value, key=repr)
            return list(value)
        raise CannotEvaluate(f"iteration over {type(value).__name__}")

    def listed(self, value, node=None) -> list:
        """Every item of `value`, a range included, within the size bound."""
        if isinstance(value, range):
            self.sized(len(value), node, "an iteration")
        return list(self.iterate(value, node))

    def index(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Tuple):
            return tuple(self.index(e, env) for e in node.elts)
        if isinstance(node, ast.Slice):
            return slice(*[None if p is None else self.integer(self.expr(p, env))
                           for p in (node.lower, node.upper, node.step)])
        if isinstance(node, ast.Constant) and (node.value is Ellipsis or node.value is None):
            return node.value
        value = self.expr(node, env)
        return self.integer(value) if isinstance(value, (int, float, np.ndarray)) else value

    @staticmethod
    def integer(value):
        if value is None:
            return None
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.ndim > 0:
            if not np.all(np.mod(value, 1) == 0):
                raise CannotEvaluate("an index array of fractions")
            return value.astype(np.int64)  # arange's numbers used as indices (inv_freq[perm])
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, np.ndarray) and value.ndim == 0:
            return int(value.item())
        return value

    def name(self, node: ast.Name, env: dict):
        if node.id in env:
            return env[node.id]
        if node.id in self.functions:
            return Func(self.functions[node.id])
        if node.id in MODULES:
            return MODULE
        if node.id in BUILTINS:
            return BUILTINS[node.id]
        if node.id in LIBRARY:
            return ("library", node.id)  # `from math import exp`: the library's function
        raise CannotEvaluate(f"line {node.lineno}: name {node.id}")

    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.name(node, env)
        if isinstance(node, ast.Attribute):
            return self.attribute(node, env)
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.expr(node.left, env), self.expr(node.right, env), node)
        if isinstance(node, ast.UnaryOp):
            value = self.expr(node.operand, env)
            if isinstance(node.op, ast.Not):
                return not self.truth(value)
            if isinstance(node.op, ast.USub):
                return -value
            if isinstance(node.op, ast.UAdd):
                return value
            raise CannotEvaluate(f"line {node.lineno}: unary operator")
        if isinstance(node, ast.BoolOp):
            value = None
            for sub in node.values:
                value = self.expr(sub, env)
                if isinstance(node.op, ast.And) and not self.truth(value):
                    return value
                if isinstance(node.op, ast.Or) and self.truth(value):
                    return value
            return value
        if isinstance(node, ast.Compare):
            left = self.expr(node.left, env)
            for op, comp in zip(node.ops, node.comparators):
                right = self.expr(comp, env)
                if not self.compare(op, left, right, node):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.expr(node.body if self.truth(self.expr(node.test, env)) else node.orelse, env)
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = self.items(node.elts, env, node)
            self.sized(len(items), node, "a sequence")
            return tuple(items) if isinstance(node, ast.Tuple) else set(items) if isinstance(node, ast.Set) else items
        if isinstance(node, ast.Dict):
            out = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    out.update(self.expr(v, env))
                else:
                    out[self.expr(k, env)] = self.expr(v, env)
            return out
        if isinstance(node, ast.Subscript):
            return self.subscript(node, env)
        if isinstance(node, ast.JoinedStr):
            return self.checked("".join(str(self.expr(v.value, env)) if isinstance(v, ast.FormattedValue)
                                        else str(v.value) for v in node.values), node)
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            return self.comprehension(node, env)
        if isinstance(node, ast.Call):
            return self.checked(self.call(node, env), node)
        raise CannotEvaluate(f"line {getattr(node, 'lineno', 0)}: {type(node).__name__}")

    def subscript(self, node: ast.Subscript, env: dict):
        value = self.expr(node.value, env)
        if isinstance(value, dict):
            key = self.expr(node.slice, env)
            if key not in value:
                raise CannotEvaluate(f"line {node.lineno}: no key {key!r}")
            return value[key]
        if isinstance(value, (list, tuple, str, np.ndarray)):
            try:
                return value[self.index(node.slice, env)]
            except (IndexError, TypeError) as exc:
                raise CannotEvaluate(f"line {node.lineno}: {exc}") from None
        raise CannotEvaluate(f"line {node.lineno}: subscript of {type(value).__name__}")

    def comprehension(self, node, env: dict) -> list:
        out = []

        def loop(level: int, scope: dict) -> None:
            if level == len(node.generators):
                out.append(self.expr(node.elt, scope))
                self.sized(len(out), node, "a comprehension")
                return
            gen = node.generators[level]
            for item in self.iterate(self.expr(gen.iter, scope), node):
                self.step(node)
                inner = dict(scope)
                self.assign(gen.target, item, inner)
                if all(self.truth(self.expr(cond, inner)) for cond in gen.ifs):
                    loop(level + 1, inner)

        loop(0, dict(env))
        return out

    def compare(self, op, a, b, node) -> bool:
        if isinstance(op, ast.Is):
            return a is b
        if isinstance(op, ast.IsNot):
            return a is not b
        if isinstance(op, ast.In):
            return a in b
        if isinstance(op, ast.NotIn):
            return a not in b
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            raise CannotEvaluate(f"line {node.lineno}: comparison of arrays")
        try:
            return {ast.Eq: lambda: a == b, ast.NotEq: lambda: a != b, ast.Lt: lambda: a < b, ast.Gt: lambda: a > b,
                    ast.LtE: lambda: a <= b, ast.GtE: lambda: a >= b}[type(op)]()
        except TypeError:
            raise CannotEvaluate(f"line {node.lineno}: comparison") from None

    def binop(self, op, a, b, node):
        if isinstance(a, (list, tuple, str)) and isinstance(op, (ast.Add, ast.Mult)) and not isinstance(
                b, np.ndarray):
            if isinstance(op, ast.Mult):
                if not isinstance(b, (int, np.integer)) or isinstance(b, bool):
                    raise CannotEvaluate(f"line {node.lineno}: a sequence times {type(b).__name__}")
                self.sized(len(a) * max(int(b), 0), node, "a sequence")
                return a * b
            self.sized(len(a) + len(b), node, "a sequence")
            return a + b
        if type(op) not in OPERATORS or a is None or b is None or not all(
                isinstance(v, (int, float, np.ndarray, np.generic)) for v in (a, b)):
            raise CannotEvaluate(f"line {node.lineno}: operator {type(op).__name__}")
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            shape_a, shape_b = np.shape(a), np.shape(b)
            if isinstance(op, ast.MatMult):
                self.worked(int(np.size(a)) * (shape_b[-1] if len(shape_b) > 1 else 1), node)
            else:
                self.sized(math.prod(np.broadcast_shapes(shape_a, shape_b)), node)
        if isinstance(op, ast.Pow) and not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
            if isinstance(a, float) or isinstance(b, float) or b < 0:
                return float(a) ** b
            if abs(a) > 1 and int(a).bit_length() * int(b) > self.limits.int_bits:
                raise CannotEvaluate(f"line {node.lineno}: {a} ** {b}, an integer over {self.limits.int_bits} bits")
            return a ** b
        if type(a) in (int, float) and type(b) in (int, float) and type(op) in PYTHON_OPERATORS:
            return self.checked(PYTHON_OPERATORS[type(op)](a, b), node)  # Python's numbers, as Python computes
        out = OPERATORS[type(op)](np.asarray(a, dtype=np.float64) if isinstance(op, ast.Pow) else a, b)
        return self.checked(out.item() if isinstance(out, np.generic) else out, node)

    def attribute(self, node: ast.Attribute, env: dict):
        dotted = _dotted(node)
        head = dotted.split(".")[0]
        if head in MODULES and head not in env:
            if dotted in CONSTANTS:
                return CONSTANTS[dotted]
            if node.attr in LIBRARY:
                return ("library", node.attr)
            if head == "torch" and node.attr in LOW_PRECISION:
                return LOW_PRECISION[node.attr]
            return DTYPE  # torch.float32, torch.nn.Module...: a type, a dtype (calling one is refused)
        owner = self.expr(node.value, env)
        if isinstance(owner, Obj):
            if node.attr in owner.attrs:
                return owner.attrs[node.attr]
            if owner.name == "self" and node.attr in self.methods:
                return Func(self.methods[node.attr], owner)
            if owner.name == "self" and node.attr == "register_buffer":
                return lambda _interp, args, kwargs: owner.attrs.__setitem__(args[0], args[1])
            raise CannotEvaluate(f"line {node.lineno}: {owner.name} has no {node.attr}")
        if isinstance(owner, np.ndarray):
            if node.attr in ("device", "dtype"):
                return DTYPE
            if node.attr == "shape":
                return tuple(owner.shape)
            if node.attr == "ndim":
                return owner.ndim
            if node.attr == "T":
                return owner.T
            if node.attr in ARRAY_METHODS:
                return ("method", owner, node.attr)
            raise CannotEvaluate(f"line {node.lineno}: attribute or method {node.attr} of an array")
        if isinstance(owner, dict) and node.attr in ("get", "keys", "values", "items") or isinstance(
                owner, list) and node.attr == "index":
            return ("method", owner, node.attr)
        if _is_dtype(owner):
            return DTYPE
        raise CannotEvaluate(f"line {node.lineno}: attribute {node.attr} of {type(owner).__name__}")

    def items(self, elts: list[ast.expr], env: dict, node: ast.AST) -> list:
        """The values of a display's or a call's elements, `*x` unpacked."""
        out = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.iterate(self.expr(e.value, env), node))
            else:
                out.append(self.expr(e, env))
        return out

    def call_args(self, node: ast.Call, env: dict) -> tuple[list, dict]:
        args = self.items(node.args, env, node)
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                value = self.expr(k.value, env)
                if not isinstance(value, dict):
                    raise CannotEvaluate(f"line {node.lineno}: **{ast.unparse(k.value)}")
                kwargs.update(value)
            else:
                kwargs[k.arg] = self.expr(k.value, env)
        return args, kwargs

    def call(self, node: ast.Call, env: dict):
        if (isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                or isinstance(node.func, ast.Name) and node.func.id == "super"):
            return Obj(name="super")
        func = self.expr(node.func, env)
        args, kwargs = self.call_args(node, env)
        return self.apply(func, args, kwargs, node)

    def apply(self, func, args: list, kwargs: dict, node: ast.Call):
        if isinstance(func, Func):
            return self.run(func.node, func.bound, args, kwargs)
        if callable(func) and not isinstance(func, type) and getattr(func, "__module__", None) == __name__:
            return func(self, args, kwargs)  # a builtin of this module's (BUILTINS, register_buffer)
        if isinstance(func, tuple) and func and func[0] == "library":
            return self.library(func[1], args, kwargs, node)
        if isinstance(func, tuple) and func and func[0] == "method":
            return self.method(func[1], func[2], args, kwargs, node)
        raise CannotEvaluate(f"line {node.lineno}: call {ast.unparse(node.func)[:40]}")

    # ------------------------------------------------------------------ the library: torch/numpy/math calls
    def library(self, name: str, args: list, kwargs: dict, node: ast.Call):
        args = [a for a in args if not _is_dtype(a)]
        if name == "get_default_dtype":
            return DTYPE
        if name in ("Buffer", "Parameter", "tensor", "as_tensor"):
            return np.asarray(args[0], dtype=np.float64)
        if name == "log" and len(args) == 2 and not isinstance(args[0], np.ndarray):  # math.log(x, base)
            return math.log(args[0], args[1])
        if name in ("exp", "log", "sin", "cos", "sqrt", "floor", "log2", "ceil"):
            x = args[0]
            return getattr(np, name)(np.asarray(x, dtype=np.float64)) if isinstance(x, np.ndarray) else getattr(
                math, name)(x)
        if name in ("pow", "power"):
            return np.power(np.asarray(args[0], dtype=np.float64), args[1])
        if name == "arange":
            numbers = [a for a in args if not isinstance(a, str)]
            self.sized(_arange_count(numbers, node), node)
            return np.arange(*numbers).astype(np.float64)
        if name in ("cat", "concat", "concatenate"):
            return np.concatenate([np.asarray(a) for a in args[0]], axis=_dims(args[1:], kwargs))
        if name == "stack":
            return np.stack(args[0], axis=_dims(args[1:], kwargs))
        if name in ("empty_like", "zeros_like"):
            return np.zeros_like(np.asarray(args[0], dtype=np.float64))
        if name == "ones_like":
            return np.ones_like(np.asarray(args[0], dtype=np.float64))
        if name in ("zeros", "ones", "empty"):
            shape = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            return (np.ones if name == "ones" else np.zeros)(self.shape_sized(shape, node))
        if name in ("mul", "multiply"):
            return np.multiply(args[0], args[1])
        if name in ("outer", "ger"):
            self.sized(int(np.size(args[0])) * int(np.size(args[1])), node)
            return np.outer(args[0], args[1])
        if name == "einsum":
            spec = args[0].replace(" ", "")
            self.worked(_einsum_work(spec, args[1:]), node)
            return np.einsum(spec, *args[1:])
        if name == "flip":
            return np.flip(args[0], axis=tuple(kwargs.get("dims", args[1] if len(args) > 1 else ())))
        if name == "float":
            return float(args[0])
        if name == "int":
            return int(args[0])
        if name in ("chunk", "split", "softmax"):
            return self.method(np.asarray(args[0]), name, args[1:], kwargs, node)
        if name == "rsqrt":
            return 1.0 / np.sqrt(args[0])
        if name == "sigmoid":
            return 1.0 / (1.0 + np.exp(-args[0]))
        if name in ("sum", "mean"):
            return np.asarray(getattr(np, name)(args[0], axis=_dims(args[1:], kwargs, default=None),
                                                keepdims=bool(kwargs.get("keepdim"))))
        if name in ("matmul", "bmm"):
            self.worked(int(np.size(args[0])) * (np.shape(args[1])[-1] if np.ndim(args[1]) > 1 else 1), node)
            return np.matmul(args[0], args[1])
        if name == "dropout":
            return args[0]  # evaluation: the identity
        raise NotInLibrary(f"line {node.lineno}: torch.{name}")

    def method(self, owner, name: str, args: list, kwargs: dict, node: ast.Call):
        if isinstance(owner, dict):
            if name == "get":
                return owner.get(args[0], args[1] if len(args) > 1 else None)
            if name in ("keys", "values", "items"):
                return list({"keys": owner.keys, "values": owner.values, "items": owner.items}[name]())
            raise CannotEvaluate(f"line {node.lineno}: dict.{name}")
        if isinstance(owner, list) and name == "index":
            return owner.index(args[0])
        if not isinstance(owner, np.ndarray):
            raise CannotEvaluate(f"line {node.lineno}: method {name} of {type(owner).__name__}")
        args = [a for a in args if not _is_dtype(a)]
        if name == "half":  # float16: the values rounded to its precision (unless rounding is off)
            return owner.astype(np.float16).astype(np.float64) if self.rounding else owner
        if name in ("float", "double", "to", "type", "type_as", "contiguous", "detach", "clone", "cpu", "long",
                    "int"):
            out = owner.astype(np.float64) if name in ("float", "double", "to", "type", "type_as", "clone") else owner
            return np.floor(out) if name in ("long", "int") else out
        if name in ("cos", "sin", "exp", "log", "sqrt"):
            return getattr(np, name)(owner)
        if name == "unsqueeze":
            return np.expand_dims(owner, _dims(args, kwargs))
        if name in ("view", "reshape"):
            shape = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
            return owner.reshape([int(s) for s in shape])
        if name == "expand":
            shape = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
            lead = len(shape) - owner.ndim
            full = [owner.shape[i - lead] if s == -1 else int(s) for i, s in enumerate(shape)]
            return np.broadcast_to(owner, self.shape_sized(full, node)).copy()
        if name == "repeat":
            reps = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
            self.sized(owner.size * math.prod(int(r) for r in reps), node)
            return np.tile(owner, [int(r) for r in reps])
        if name == "transpose":
            return np.swapaxes(owner, args[0], args[1])
        if name == "permute":
            return np.transpose(owner, [int(a) for a in (args[0] if len(args) == 1 and isinstance(
                args[0], (list, tuple)) else args)])
        if name == "flatten":
            start = (args[0] if args else kwargs.get("start_dim", 0)) % owner.ndim
            end = (args[1] if len(args) > 1 else kwargs.get("end_dim", -1)) % owner.ndim
            return owner.reshape(*owner.shape[:start], -1, *owner.shape[end + 1:])
        if name == "unflatten":
            dim = args[0] % owner.ndim
            return owner.reshape(*owner.shape[:dim], *args[1], *owner.shape[dim + 1:])
        if name == "unbind":
            return list(np.moveaxis(owner, _dims(args, kwargs), 0))
        if name in ("sum", "mean"):
            return np.asarray(getattr(np, name)(owner, axis=_dims(args, kwargs, default=None),
                                                keepdims=bool(kwargs.get("keepdim", False))))
        if name in ("sigmoid", "rsqrt"):
            return self.library(name, [owner], {}, node)
        if name == "pow":
            return owner ** args[0]
        if name == "softmax":
            dim = _dims(args, kwargs, default=-1)
            e = np.exp(owner - np.max(owner, axis=dim, keepdims=True))
            return e / e.sum(axis=dim, keepdims=True)
        if name == "split":
            sizes, dim = args[0] if args else kwargs["split_size_or_sections"], _dims(args[1:], kwargs, default=0)
            size = owner.shape[dim]
            if isinstance(sizes, (int, float)):
                if int(sizes) <= 0:
                    raise CannotEvaluate(f"line {node.lineno}: split into parts of {sizes}")
                sizes = [int(sizes)] * (size // int(sizes)) + ([size % int(sizes)] if size % int(sizes) else [])
            if sum(sizes) != size:
                raise CannotEvaluate(f"line {node.lineno}: split of {size} into {sizes}")
            return list(np.split(owner, np.cumsum(sizes)[:-1], axis=dim))
        if name == "chunk":
            parts, dim = int(args[0] if args else kwargs["chunks"]), _dims(args[1:], kwargs)
            if parts <= 0 or owner.shape[dim] % parts:
                raise CannotEvaluate(f"line {node.lineno}: chunk of {owner.shape[dim]} into {parts}")
            return list(np.split(owner, parts, axis=dim))
        if name == "squeeze":
            return np.squeeze(owner, axis=_dims(args, kwargs, default=None))
        if name == "size":
            return owner.shape[args[0]] if args else tuple(owner.shape)
        if name == "dim":
            return owner.ndim
        raise CannotEvaluate(f"line {node.lineno}: method {name}")


def _load(target: ast.expr) -> ast.expr:
    out = ast.parse(ast.unparse(target), mode="eval").body
    return ast.copy_location(out, target)


def _dims(args, kwargs, name="dim", default=0):
    return kwargs.get(name, kwargs.get("axis", args[0] if args else default))


def _arange_count(numbers: list, node) -> int:
    """How many numbers arange(*numbers) makes, computed before it makes them."""
    bounds = [float(n) for n in numbers]
    if not 1 <= len(bounds) <= 3 or not all(math.isfinite(b) for b in bounds):
        raise CannotEvaluate(f"line {getattr(node, 'lineno', 0)}: arange{tuple(numbers)}")
    start, stop, step = (0.0, bounds[0], 1.0) if len(bounds) == 1 else (*bounds[:2], bounds[2] if len(bounds) > 2 else 1.0)
    if step == 0:
        raise CannotEvaluate(f"line {getattr(node, 'lineno', 0)}: arange with a step of 0")
    return max(0, math.ceil((stop - start) / step))


def _einsum_work(spec: str, operands: list) -> int:
    """The multiply-adds of np.einsum(spec, *operands): the product of every index's size."""
    inputs = spec.split("->")[0].split(",")
    if len(inputs) != len(operands) or "." in spec:
        raise CannotEvaluate(f"einsum {spec!r} over {len(operands)} operands")
    sizes: dict[str, int] = {}
    for letters, operand in zip(inputs, operands):
        shape = np.shape(operand)
        if len(letters) != len(shape):
            raise CannotEvaluate(f"einsum {spec!r}: {letters} over a shape {shape}")
        sizes.update(zip(letters, shape))
    return math.prod(sizes.values())


# ---------------------------------------------------------------------- builtins: (interpreter, args, kwargs)
def _getattr(interp, args, kwargs):
    obj, name = args[0], args[1]
    if isinstance(obj, Obj):
        if name in obj.attrs:
            return obj.attrs[name]
        if obj.name == "self" and name in interp.methods:
            return Func(interp.methods[name], obj)
    if len(args) > 2:
        return args[2]
    raise CannotEvaluate(f"getattr: no {name}")


def _setattr(interp, args, kwargs):
    if not isinstance(args[0], Obj):
        raise CannotEvaluate("setattr on a non-object")
    args[0].attrs[args[1]] = args[2]


def _hasattr(interp, args, kwargs):
    return isinstance(args[0], Obj) and args[1] in args[0].attrs


def _isinstance(interp, args, kwargs) -> bool:
    raise CannotEvaluate("isinstance")


BUILTINS = {
    "len": lambda i, a, k: len(a[0]),
    "range": lambda i, a, k: range(*[int(x) for x in a]),
    "enumerate": lambda i, a, k: list(enumerate(i.listed(a[0]))),
    "zip": lambda i, a, k: list(zip(*[i.listed(x) for x in a])),
    "list": lambda i, a, k: i.listed(a[0]) if a else [],
    "tuple": lambda i, a, k: tuple(i.listed(a[0])) if a else (),
    "set": lambda i, a, k: set(i.listed(a[0])) if a else set(),
    "dict": lambda i, a, k: dict(a[0], **k) if a else dict(k),
    "sorted": lambda i, a, k: sorted(i.listed(a[0])),
    "reversed": lambda i, a, k: list(reversed(i.listed(a[0]))),
    "sum": lambda i, a, k: sum(i.listed(a[0])),
    "min": lambda i, a, k: min(a if len(a) > 1 else i.listed(a[0])),
    "max": lambda i, a, k: max(a if len(a) > 1 else i.listed(a[0])),
    "int": lambda i, a, k: int(a[0]),
    "float": lambda i, a, k: float(a[0]),
    "abs": lambda i, a, k: abs(a[0]),
    "isinstance": _isinstance,
    "getattr": _getattr,
    "setattr": _setattr,
    "hasattr": _hasattr,
    "print": lambda i, a, k: None,
    "Callable": DTYPE,
    "None": None,
}

# The tensor methods `Interpreter.method` computes.
ARRAY_METHODS = frozenset({"half", "float", "double", "to", "type", "type_as", "contiguous", "detach", "clone", "cpu",
                           "long", "int", "cos", "sin", "exp", "log", "sqrt", "unsqueeze", "view", "reshape", "expand",
                           "repeat", "transpose", "permute", "flatten", "unflatten", "unbind", "sum", "mean",
                           "sigmoid", "rsqrt", "pow", "softmax", "split", "chunk", "squeeze", "size", "dim"})

# The torch/numpy/math functions `Interpreter.library` computes (under a module's name, or bare).
LIBRARY = frozenset({"arange", "cat", "concat", "concatenate", "stack", "empty_like", "zeros_like", "ones_like",
                     "zeros", "ones", "empty", "outer", "ger", "einsum", "exp", "log", "log2", "sin", "cos", "pow",
                     "power", "tensor", "as_tensor", "Buffer", "Parameter", "no_grad", "sqrt", "floor", "ceil",
                     "repeat_interleave", "full", "flip", "get_default_dtype", "float", "int", "chunk", "split",
                     "softmax", "rsqrt", "sigmoid", "sum", "mean", "matmul", "bmm", "dropout", "mul", "multiply"})
