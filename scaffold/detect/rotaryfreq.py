"""The frequencies a rotary embedding module computes, read by running its code over numbers.

Most rotary modules compute inv_freq[k] = base ** (-2k / d) and rotate q and k by cos/sin(p * inv_freq[k]),
the table concatenated with itself (NeoX, rotate_half). Some compute the same frequencies in another order:
Cohere Compass "pre-rotates" them for its multimodal rotary sections (rope_parameters.mrope_section = [h, w, t]),
`inv_freq_3d[:h + w] = cat(inv_freq[:h + w][0::2], inv_freq[:h + w][1::2])`, and its forward splits the table
into the sections, takes each from one row of 3-D positions (h from the second row, w from the third, t from the
first) and concatenates them back. For a text-only model the rows are the same positions, so the rotation is
plain NeoX rotary whose column j turns at the standard frequency order[j]. A lab may write the reordering
otherwise (its own names, a permutation index, sections concatenated in another order). So the code is not
matched as text: the module's __init__ and forward are interpreted over numbers (a small Python and array
language: assignments, ifs, for loops, comprehensions, f-strings, getattr/setattr, dict reads, arange, pow, cat,
split, expand, slices, cos, sin, the module's own methods and helpers), on config.json's values and positions
0..P-1 given identically in every row, and the cos/sin table it returns is compared, column by column, with
cos/sin(p * base ** (-2k / d)). A table that is not such a reordering (scaled, another base, frequencies that
are not the standard ones, not NeoX-halved) is named, not guessed.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

import numpy as np

from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

POSITIONS = 40  # positions 0..P-1 the forward is run at
TOLERANCE = 1e-9
MAX_DEPTH = 6
MAX_STEPS = 20000  # statements and loop iterations interpreted, at most
MAX_ELEMENTS = 1 << 20  # numbers in one array, at most


@dataclass(frozen=True)
class FrequencyOrder:
    """What a rotary module computes for one layer type: NeoX rotary at the standard frequencies of `base`,
    column j at frequency index order[j]."""

    order: tuple[int, ...]
    base: float
    cls: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def permuted(self) -> bool:
        return list(self.order) != list(range(len(self.order)))


class _Unknown(Exception):
    pass


class _Continue(Exception):
    pass


class _Break(Exception):
    pass


_DTYPE = object()  # a dtype or device: the interpreter computes in float64 whatever the code asks
_MODULE = object()  # torch, np, nn, math: their functions are the interpreter's builtins


class _Obj:
    """self, or the config: attributes by name."""

    def __init__(self, attrs: dict | None = None, name: str = "object"):
        self.attrs = dict(attrs or {})
        self.name = name


@dataclass
class _Func:
    node: ast.FunctionDef
    bound: object = None  # the receiver of a method, None for a function or a staticmethod


def _static(func: ast.FunctionDef) -> bool:
    return any(_dotted(d).rsplit(".", 1)[-1] == "staticmethod" for d in func.decorator_list)


class _Interpreter:
    def __init__(self, functions: dict[str, ast.FunctionDef], methods: dict[str, ast.FunctionDef]):
        self.functions, self.methods = functions, methods
        self.steps = 0
        self.depth = 0

    # ------------------------------------------------------------------ statements
    def run(self, func: ast.FunctionDef, receiver, args: list, kwargs: dict) -> object:
        if self.depth > MAX_DEPTH:
            raise _Unknown(f"{func.name}: calls nested too deep")
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        env: dict = {}
        if receiver is not None and not _static(func):
            env[params[0]] = receiver
            params = params[1:]
        if len(args) > len(params):
            raise _Unknown(f"{func.name} takes {len(params)} arguments")
        env.update(zip(params, args))
        for key, value in kwargs.items():
            if key in params:
                env[key] = value
        defaults = func.args.defaults
        for name, default in zip(params[len(params) - len(defaults):], defaults):
            env.setdefault(name, self.expr(default, {}))
        for arg, default in zip(func.args.kwonlyargs, func.args.kw_defaults):
            env[arg.arg] = kwargs.get(arg.arg, self.expr(default, {}) if default is not None else None)
        missing = [p for p in params if p not in env]
        if missing:
            raise _Unknown(f"{func.name}: no value for {', '.join(missing)}")
        self.depth += 1
        try:
            out = self.block(func.body, env)
        finally:
            self.depth -= 1
        return None if out is None else out[0]

    def block(self, body: list[ast.stmt], env: dict) -> tuple | None:
        for stmt in body:
            self.steps += 1
            if self.steps > MAX_STEPS:
                raise _Unknown("too many steps")
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
        if isinstance(stmt, ast.For):
            for item in self.iterate(self.expr(stmt.iter, env)):
                self.assign(stmt.target, item, env)
                try:
                    out = self.block(stmt.body, env)
                except _Continue:
                    continue
                except _Break:
                    break
                if out is not None:
                    return out
            return None
        if isinstance(stmt, ast.With):
            return self.block(stmt.body, env)  # autocast and no_grad contexts: the interpreter is float64
        if isinstance(stmt, ast.Continue):
            raise _Continue
        if isinstance(stmt, ast.Break):
            raise _Break
        if isinstance(stmt, ast.Pass):
            return None
        raise _Unknown(f"line {stmt.lineno}: {type(stmt).__name__}")

    def assign(self, target: ast.expr, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = list(self.iterate(value))
            if len(items) != len(target.elts):
                raise _Unknown(f"line {target.lineno}: {len(items)} values for {len(target.elts)} names")
            for t, v in zip(target.elts, items):
                self.assign(t, v, env)
        elif isinstance(target, ast.Attribute):
            owner = self.expr(target.value, env)
            if not isinstance(owner, _Obj):
                raise _Unknown(f"line {target.lineno}: attribute of a non-object")
            owner.attrs[target.attr] = value
        elif isinstance(target, ast.Subscript):
            owner = self.expr(target.value, env)
            if isinstance(owner, dict):
                owner[self.expr(target.slice, env)] = value
            elif isinstance(owner, np.ndarray):
                owner[self.index(target.slice, env)] = value
            else:
                raise _Unknown(f"line {target.lineno}: assignment into {type(owner).__name__}")
        else:
            raise _Unknown(f"line {target.lineno}: assignment to {type(target).__name__}")

    # ------------------------------------------------------------------ expressions
    @staticmethod
    def truth(value) -> bool:
        if isinstance(value, np.ndarray):
            if value.size != 1:
                raise _Unknown("the truth of an array")
            return bool(value.item())
        return bool(value)

    @staticmethod
    def iterate(value):
        if isinstance(value, (list, tuple, range, str)):
            return list(value)
        if isinstance(value, dict):
            return list(value)
        if isinstance(value, np.ndarray):
            return list(value)
        if isinstance(value, (set, frozenset)):
            return sorted(value, key=repr)
        raise _Unknown(f"iteration over {type(value).__name__}")

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
                raise _Unknown("an index array of fractions")
            return value.astype(np.int64)  # arange's numbers used as indices (inv_freq[perm])
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, np.ndarray) and value.ndim == 0:
            return int(value.item())
        return value

    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in env:
                return env[node.id]
            if node.id in self.functions:
                return _Func(self.functions[node.id])
            if node.id in ("torch", "np", "numpy", "nn", "math", "F"):
                return _MODULE
            if node.id in _BUILTINS:
                return _BUILTINS[node.id]
            raise _Unknown(f"line {node.lineno}: name {node.id}")
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
            raise _Unknown(f"line {node.lineno}: unary operator")
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
            items = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    items.extend(self.iterate(self.expr(e.value, env)))
                else:
                    items.append(self.expr(e, env))
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
            value = self.expr(node.value, env)
            if isinstance(value, dict):
                key = self.expr(node.slice, env)
                if key not in value:
                    raise _Unknown(f"line {node.lineno}: no key {key!r}")
                return value[key]
            if isinstance(value, (list, tuple, str, np.ndarray)):
                try:
                    return value[self.index(node.slice, env)]
                except (IndexError, TypeError) as exc:
                    raise _Unknown(f"line {node.lineno}: {exc}") from None
            raise _Unknown(f"line {node.lineno}: subscript of {type(value).__name__}")
        if isinstance(node, ast.JoinedStr):
            return "".join(str(self.expr(v.value, env)) if isinstance(v, ast.FormattedValue) else str(v.value)
                           for v in node.values)
        if isinstance(node, (ast.GeneratorExp, ast.ListComp)):
            return self.comprehension(node, env)
        if isinstance(node, ast.Call):
            out = self.call(node, env)
            if isinstance(out, np.ndarray) and out.size > MAX_ELEMENTS:
                raise _Unknown(f"line {node.lineno}: an array of {out.size} numbers (a cache over every position)")
            return out
        raise _Unknown(f"line {getattr(node, 'lineno', 0)}: {type(node).__name__}")

    def comprehension(self, node, env: dict) -> list:
        out = []

        def loop(level: int, scope: dict) -> None:
            if level == len(node.generators):
                out.append(self.expr(node.elt, scope))
                return
            gen = node.generators[level]
            for item in self.iterate(self.expr(gen.iter, scope)):
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
            raise _Unknown(f"line {node.lineno}: comparison of arrays")
        try:
            return {ast.Eq: lambda: a == b, ast.NotEq: lambda: a != b, ast.Lt: lambda: a < b, ast.Gt: lambda: a > b,
                    ast.LtE: lambda: a <= b, ast.GtE: lambda: a >= b}[type(op)]()
        except TypeError:
            raise _Unknown(f"line {node.lineno}: comparison") from None

    def binop(self, op, a, b, node):
        ops = {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply, ast.Div: np.true_divide,
               ast.FloorDiv: np.floor_divide, ast.Pow: np.power, ast.Mod: np.mod, ast.MatMult: np.matmul}
        if isinstance(a, (list, tuple, str)) and isinstance(op, (ast.Add, ast.Mult)) and not isinstance(
                b, np.ndarray):
            return a + b if isinstance(op, ast.Add) else a * b
        if type(op) not in ops or a is None or b is None or not all(
                isinstance(v, (int, float, np.ndarray, np.generic)) for v in (a, b)):
            raise _Unknown(f"line {node.lineno}: operator {type(op).__name__}")
        if isinstance(op, ast.Pow) and not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
            return float(a) ** b if isinstance(a, float) or isinstance(b, float) or b < 0 else a ** b
        out = ops[type(op)](np.asarray(a, dtype=np.float64) if isinstance(op, ast.Pow) else a, b)
        return out.item() if isinstance(out, np.generic) else out

    def attribute(self, node: ast.Attribute, env: dict):
        dotted = _dotted(node)
        head = dotted.split(".")[0]
        if head in ("torch", "np", "numpy", "nn", "math", "F") and head not in env:
            if dotted in ("math.pi", "np.pi", "torch.pi"):
                return math.pi
            if node.attr in _TORCH_CALLS:
                return ("torch", node.attr)
            return _DTYPE  # torch.float32, torch.nn.Module...: a type, a dtype
        owner = self.expr(node.value, env)
        if isinstance(owner, _Obj):
            if node.attr in owner.attrs:
                return owner.attrs[node.attr]
            if owner.name == "self" and node.attr in self.methods:
                return _Func(self.methods[node.attr], owner)
            if owner.name == "self" and node.attr == "register_buffer":
                return lambda _interp, args, kwargs: owner.attrs.__setitem__(args[0], args[1])
            raise _Unknown(f"line {node.lineno}: {owner.name} has no {node.attr}")
        if isinstance(owner, np.ndarray):
            if node.attr in ("device", "dtype"):
                return _DTYPE
            if node.attr == "shape":
                return tuple(owner.shape)
            if node.attr == "ndim":
                return owner.ndim
            if node.attr == "T":
                return owner.T
            return ("method", owner, node.attr)
        if isinstance(owner, (dict, list, str)):
            return ("method", owner, node.attr)
        if owner is _DTYPE:
            return _DTYPE
        raise _Unknown(f"line {node.lineno}: attribute {node.attr} of {type(owner).__name__}")

    def call(self, node: ast.Call, env: dict):
        if (isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                or isinstance(node.func, ast.Name) and node.func.id == "super"):
            return _Obj(name="super")
        func = self.expr(node.func, env)
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self.iterate(self.expr(a.value, env)))
            else:
                args.append(self.expr(a, env))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                kwargs.update(self.expr(k.value, env))
            else:
                kwargs[k.arg] = self.expr(k.value, env)
        if isinstance(func, _Func):
            return self.run(func.node, func.bound, args, kwargs)
        if callable(func) and not isinstance(func, type):
            return func(self, args, kwargs)
        if isinstance(func, tuple) and func and func[0] == "torch":
            return _torch_call(func[1], args, kwargs, node)
        if isinstance(func, tuple) and func and func[0] == "method":
            return _method(func[1], func[2], args, kwargs, node)
        raise _Unknown(f"line {node.lineno}: call {ast.unparse(node.func)[:40]}")


def _load(target: ast.expr) -> ast.expr:
    out = ast.parse(ast.unparse(target), mode="eval").body
    return ast.copy_location(out, target)


def _getattr(interp, args, kwargs):
    obj, name = args[0], args[1]
    if isinstance(obj, _Obj):
        if name in obj.attrs:
            return obj.attrs[name]
        if obj.name == "self" and name in interp.methods:
            return _Func(interp.methods[name], obj)
    if len(args) > 2:
        return args[2]
    raise _Unknown(f"getattr: no {name}")


def _setattr(interp, args, kwargs):
    if not isinstance(args[0], _Obj):
        raise _Unknown("setattr on a non-object")
    args[0].attrs[args[1]] = args[2]


def _hasattr(interp, args, kwargs):
    return isinstance(args[0], _Obj) and args[1] in args[0].attrs


_BUILTINS = {
    "len": lambda i, a, k: len(a[0]),
    "range": lambda i, a, k: range(*[int(x) for x in a]),
    "enumerate": lambda i, a, k: list(enumerate(i.iterate(a[0]))),
    "zip": lambda i, a, k: list(zip(*[i.iterate(x) for x in a])),
    "list": lambda i, a, k: list(i.iterate(a[0])) if a else [],
    "tuple": lambda i, a, k: tuple(i.iterate(a[0])) if a else (),
    "set": lambda i, a, k: set(i.iterate(a[0])) if a else set(),
    "dict": lambda i, a, k: dict(a[0], **k) if a else dict(k),
    "sorted": lambda i, a, k: sorted(i.iterate(a[0])),
    "reversed": lambda i, a, k: list(reversed(i.iterate(a[0]))),
    "sum": lambda i, a, k: sum(i.iterate(a[0])),
    "min": lambda i, a, k: min(a if len(a) > 1 else i.iterate(a[0])),
    "max": lambda i, a, k: max(a if len(a) > 1 else i.iterate(a[0])),
    "int": lambda i, a, k: int(a[0]),
    "float": lambda i, a, k: float(a[0]),
    "abs": lambda i, a, k: abs(a[0]),
    "isinstance": lambda i, a, k: _isinstance(a[0], a[1]),
    "getattr": _getattr,
    "setattr": _setattr,
    "hasattr": _hasattr,
    "print": lambda i, a, k: None,
    "Callable": _DTYPE,
    "None": None,
}


def _isinstance(value, kind) -> bool:
    raise _Unknown("isinstance")


_TORCH_CALLS = {"arange", "cat", "concat", "concatenate", "stack", "empty_like", "zeros_like", "ones_like", "zeros",
                "ones", "empty", "outer", "ger", "einsum", "exp", "log", "sin", "cos", "pow", "tensor", "as_tensor",
                "Buffer", "Parameter", "no_grad", "sqrt", "floor", "repeat_interleave", "full", "flip",
                "get_default_dtype", "float", "int"}


def _dims(args, kwargs, name="dim", default=0):
    return kwargs.get(name, kwargs.get("axis", args[0] if args else default))


def _torch_call(name: str, args: list, kwargs: dict, node: ast.Call):
    args = [a for a in args if a is not _DTYPE]
    if name in ("Buffer", "Parameter", "tensor", "as_tensor"):
        return np.asarray(args[0], dtype=np.float64)
    if name in ("exp", "log", "sin", "cos", "sqrt", "floor"):
        x = args[0]
        return getattr(np, name)(np.asarray(x, dtype=np.float64)) if isinstance(x, np.ndarray) else getattr(
            math, name)(x)
    if name == "pow":
        return np.power(np.asarray(args[0], dtype=np.float64), args[1])
    if name == "arange":
        numbers = [a for a in args if not isinstance(a, str)]
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
        return (np.ones if name == "ones" else np.zeros)([int(s) for s in shape])
    if name in ("outer", "ger"):
        return np.outer(args[0], args[1])
    if name == "einsum":
        return np.einsum(args[0].replace(" ", ""), *args[1:])
    if name == "flip":
        return np.flip(args[0], axis=tuple(kwargs.get("dims", args[1] if len(args) > 1 else ())))
    if name == "float":
        return float(args[0])
    if name == "int":
        return int(args[0])
    raise _Unknown(f"line {node.lineno}: torch.{name}")


def _method(owner, name: str, args: list, kwargs: dict, node: ast.Call):
    if isinstance(owner, dict):
        if name == "get":
            return owner.get(args[0], args[1] if len(args) > 1 else None)
        if name in ("keys", "values", "items"):
            return list(getattr(owner, name)())
        raise _Unknown(f"line {node.lineno}: dict.{name}")
    if isinstance(owner, list) and name == "index":
        return owner.index(args[0])
    if not isinstance(owner, np.ndarray):
        raise _Unknown(f"line {node.lineno}: method {name} of {type(owner).__name__}")
    args = [a for a in args if a is not _DTYPE]
    if name in ("float", "double", "to", "type", "type_as", "contiguous", "detach", "clone", "cpu", "long", "int"):
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
        return np.broadcast_to(owner, full).copy()
    if name == "repeat":
        reps = list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)
        return np.tile(owner, [int(r) for r in reps])
    if name == "transpose":
        return np.swapaxes(owner, args[0], args[1])
    if name == "flatten":
        start = (args[0] if args else kwargs.get("start_dim", 0)) % owner.ndim
        return owner.reshape(*owner.shape[:start], -1)
    if name == "split":
        sizes, dim = args[0], _dims(args[1:], kwargs, default=0)
        size = owner.shape[dim]
        if isinstance(sizes, (int, float)):
            sizes = [int(sizes)] * (size // int(sizes)) + ([size % int(sizes)] if size % int(sizes) else [])
        if sum(sizes) != size:
            raise _Unknown(f"line {node.lineno}: split of {size} into {sizes}")
        return list(np.split(owner, np.cumsum(sizes)[:-1], axis=dim))
    if name == "chunk":
        return list(np.split(owner, int(args[0]), axis=_dims(args[1:], kwargs)))
    if name == "squeeze":
        return np.squeeze(owner, axis=args[0]) if args else np.squeeze(owner)
    if name == "size":
        return owner.shape[args[0]] if args else tuple(owner.shape)
    if name == "dim":
        return owner.ndim
    raise _Unknown(f"line {node.lineno}: method {name}")


# ---------------------------------------------------------------------- the module and its reading
def _functions(sources: dict[str, str]) -> dict[str, ast.FunctionDef]:
    out: dict[str, ast.FunctionDef] = {}
    for _file, tree in _parsed(sources):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, node)
    return out


def rotary_class(sources: dict[str, str]) -> tuple[str, ast.ClassDef, str, ast.ClassDef] | None:
    """(file, rotary class, attribute, decoder stack class) of the rotary module the decoder stack builds as
    self.<attribute> = Cls(...) (a class of the sources whose code computes a cosine and a sine), where the
    stack is the class that also builds the token embedding (nn.Embedding): not a vision tower's."""
    classes = _classes(sources)
    found = []
    for _file, tree in _parsed(sources):
        for owner in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            init = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                continue
            embeds = any(isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == "Embedding"
                         for n in subtree(init))
            for node in subtree(init):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and _dotted(node.targets[0]).startswith("self.") and isinstance(node.value, ast.Call)):
                    name = _dotted(node.value.func).rsplit(".", 1)[-1]
                    if name in classes and name != owner.name and _computes_cos_sin(classes[name][1]):
                        found.append((not embeds, *classes[name], _dotted(node.targets[0])[5:], owner))
    if not found:
        return None
    found.sort(key=lambda f: f[0])
    return found[0][1:]


def _computes_cos_sin(cls: ast.ClassDef) -> bool:
    names = {_dotted(n.func).rsplit(".", 1)[-1] for n in subtree(cls) if isinstance(n, ast.Call)}
    return {"cos", "sin"} <= names


def read_order(sources: dict[str, str], config: dict, layer_type: str | None, head_dim: int,
               base: float) -> FrequencyOrder | str | None:
    """The order of the frequencies the rotary module (the one the decoder stack builds) computes for
    `layer_type`, run on config.json's values with the same positions in every row; a reason where its table
    is not a reordering of NeoX rotary at base `base` over `head_dim`; None where no such module is found."""
    found = rotary_class(sources)
    if found is None:
        return None
    file, cls = found[:2]
    where = f"{file}:{cls.lineno}"
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "__init__" not in methods or "forward" not in methods:
        return f"{where}: {cls.name} has no __init__ and forward to read"
    interp = _Interpreter(_functions(sources), methods)
    config_obj = _Obj(dict(config), "config")  # its dicts stay dicts: config.rope_parameters[...] reads them
    module = _Obj(name="self")
    table = None
    positions = np.arange(POSITIONS, dtype=np.float64)
    errors = []
    try:
        interp.run(methods["__init__"], module, [config_obj], {})
    except Exception as exc:  # noqa: BLE001 - code the reader cannot run is a reason, never a crash
        return f"{where}: {cls.name}.__init__ computes what the reader does not follow ({exc})"
    forward = methods["forward"]
    params = [a.arg for a in forward.args.args][1:]
    extra = {p: layer_type for p in params[2:] if "type" in p}
    x = np.zeros((1, POSITIONS, head_dim))
    # The positions as the decoder stack hands them: one row (batch, seq), or the same row repeated for each
    # section of a multimodal rotary (rows, batch, seq).
    sections = _sections(config, layer_type)
    for rows in ([positions[None, :]] + ([np.broadcast_to(positions, (len(sections), 1, POSITIONS)).copy()]
                                        if sections else [])):
        try:
            interp.steps = 0
            out = interp.run(forward, module, [x, rows], extra)
        except Exception as exc:  # noqa: BLE001 - code the reader cannot run is a reason, never a crash
            errors.append(str(exc))
            continue
        if isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, np.ndarray) for o in out):
            table = out
            break
        errors.append("its forward does not return (cos, sin)")
    if table is None:
        return f"{where}: {cls.name}.forward computes what the reader does not follow ({'; '.join(errors)})"
    return _compare(table, head_dim, base, cls.name, file, forward.lineno)


def _sections(config: dict, layer_type: str | None) -> list | None:
    params = config.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    found = params.get("mrope_section") if isinstance(params, dict) else None
    return found if isinstance(found, list) else None


def _compare(table, head_dim: int, base: float, cls: str, file: str, line: int) -> FrequencyOrder | str:
    where = f"{file}:{line}"
    cos, sin = (np.asarray(t, dtype=np.float64) for t in table)
    if cos.shape != sin.shape or cos.shape[-1] != head_dim or cos.size != POSITIONS * head_dim:
        return f"{where}: {cls} returns tables of shape {cos.shape}, not one row of {head_dim} per position"
    cos, sin = cos.reshape(POSITIONS, head_dim), sin.reshape(POSITIONS, head_dim)
    half = head_dim // 2
    if not (np.allclose(cos[:, :half], cos[:, half:], atol=TOLERANCE, rtol=0)
            and np.allclose(sin[:, :half], sin[:, half:], atol=TOLERANCE, rtol=0)):
        return (f"{where}: {cls} computes a cos/sin table whose two halves differ: not NeoX rotary "
                "(rotate_half) over the whole head")
    if not np.allclose(cos ** 2 + sin ** 2, 1.0, atol=1e-7, rtol=0):
        return f"{where}: {cls} scales its cos/sin table (cos² + sin² ≠ 1)"
    standard = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arctan2(sin[1, :half], cos[1, :half])  # position 1: each column's frequency, all below pi
    order = []
    for j in range(half):
        k = int(np.argmin(np.abs(standard - angles[j])))
        expected = np.arange(POSITIONS)[:, None] * standard[k]
        if not (np.allclose(cos[:, j], np.cos(expected[:, 0]), atol=1e-7, rtol=0)
                and np.allclose(sin[:, j], np.sin(expected[:, 0]), atol=1e-7, rtol=0)):
            return (f"{where}: {cls} rotates column {j} at a frequency ({angles[j]:.6g}) that is none of "
                    f"{base:g} ** (-2k / {head_dim})")
        order.append(k)
    if sorted(order) != list(range(half)):
        return (f"{where}: {cls} rotates its columns at the frequencies {order} of {base:g} ** (-2k / {head_dim}): "
                "not each once, so not a reordering")
    return FrequencyOrder(tuple(order), base, cls, file, line)


ROW_CALLS = frozenset({"arange", "view", "expand", "reshape", "unsqueeze", "get_seq_length", "repeat", "to", "long",
                       "float", "int", "clone", "contiguous", "size", "broadcast_to", "expand_as"})


def differing_rows(sources: dict[str, str]) -> str | None:
    """Where the decoder stack that builds the rotary module computes the positions it hands it
    from anything but the token positions themselves (a row per section built by another function: a multimodal
    rope index from the image grid), file:line and the call; None where every assignment to the positions only
    counts, reshapes and repeats them, so that every row holds the same positions."""
    found = rotary_class(sources)
    if found is None:
        return None
    file, _rotary, attribute, cls = found
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if forward is None:
        return None
    rotary_args = set()
    for call in (c for c in subtree(forward) if isinstance(c, ast.Call) and _dotted(c.func) == f"self.{attribute}"):
        given = [a.id for a in call.args if isinstance(a, ast.Name)] + [
            k.value.id for k in call.keywords if isinstance(k.value, ast.Name)]
        named = [a for a in given if "pos" in a]
        # The positions (position_ids), beside the hidden states the module reads for its dtype.
        rotary_args.update(named or given[1:2])
    for stmt in subtree(forward):
        if not (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id in rotary_args
                                                     for t in stmt.targets)):
            continue
        for call in (c for c in subtree(stmt.value) if isinstance(c, ast.Call)):
            name = _dotted(call.func).rsplit(".", 1)[-1] or getattr(call.func, "attr", "")
            if name not in ROW_CALLS:
                return f"{file}:{stmt.lineno}: {ast.unparse(stmt)[:80]}"
    return None
