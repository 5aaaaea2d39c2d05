"""A routing without a top-k, read from the code: is it PhiMoE's sparsemixer as vLLM serves it?

PhiMoE's router (`sparsemixer`) takes no top-k of softmax scores. In inference it picks the best expert, masks
every score whose gap to the best, relative to max(|score|, best), exceeds 2 * jitter_eps, and weights the
expert by the softmax of what is left; then the same once more with the first expert's score set to -inf (the
gap still relative to the unmasked scores' magnitudes). vLLM serves it through FusedMoE with a custom routing
function (vllm/model_executor/models/phimoe.py, `sparsemixer(scores, jitter_eps)`). A lab may inline that code
into its router's forward, rename it, or write a variant (another threshold, a softmax over every score).

So the code is not matched as text: the routing path's statements after the router logits are computed are
interpreted over numbers (a small language of [tokens, experts] tables: max with its index, abs, clamp,
masked_fill, softmax, gather, scatter, cat, comparisons and arithmetic, the module's own functions called with
their arguments, `self.A` read from __init__ as `self.A = config.KEY`, `self.training` as False) on sample logits
where the masks matter, and compared with vLLM's sparsemixer at the jitter the code reads. Anything else the
statements compute is named, not guessed.
"""

from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass

from scaffold.detect.codekeys import _is_config
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

MAX_CALL_DEPTH = 4


@dataclass(frozen=True)
class SparseMixer:
    jitter: float  # the jitter_eps the code reads, with this config
    jitter_key: str | None  # the config key it reads it from (None: a number in the code)
    evidence: str  # file:line of what computes it


class _Unknown(Exception):
    pass


class _T:
    """A [tokens, columns] table of floats (kind "f"), indices ("i") or booleans ("b")."""

    def __init__(self, rows: list[list], kind: str):
        self.rows, self.kind = rows, kind

    @property
    def width(self) -> int:
        return len(self.rows[0])


def _broadcast(a, b, op, kind: str):
    if isinstance(a, _T) or isinstance(b, _T):
        rows_a = a.rows if isinstance(a, _T) else None
        rows_b = b.rows if isinstance(b, _T) else None
        n = len(rows_a if rows_a is not None else rows_b)
        width = max(len(r[0]) for r in (rows_a, rows_b) if r is not None)

        def at(rows, scalar, i, j):
            if rows is None:
                return scalar
            row = rows[i]
            if len(row) not in (1, width):
                raise _Unknown("tables of widths that do not broadcast")
            return row[0] if len(row) == 1 else row[j]
        return _T([[op(at(rows_a, a, i, j), at(rows_b, b, i, j)) for j in range(width)] for i in range(n)], kind)
    return op(a, b)


def _div(x: float, y: float) -> float:
    if y == 0:  # as torch divides
        return math.nan if x == 0 or math.isnan(x) else math.copysign(math.inf, x) * math.copysign(1, y)
    return x / y


def _softmax(row: list[float]) -> list[float]:
    top = max(row)
    if top == -math.inf:
        return [math.nan] * len(row)
    exps = [math.exp(x - top) for x in row]
    total = sum(exps)
    return [e / total for e in exps]


def _dim_last(node_args: dict, position: int | None, args: list) -> None:
    dim = node_args.get("dim", args[position] if position is not None and len(args) > position else None)
    if dim not in (-1, 1):
        raise _Unknown(f"an operation over dim {dim}")


class _Interp:
    def __init__(self, functions: dict[str, ast.FunctionDef], attrs: dict[str, float], where: str):
        self.functions, self.attrs, self.where = functions, attrs, where
        self.used: dict[str, float] = {}
        self.stack: list[str] = []

    # Statements: returns ("return", value) or None.
    def run(self, body: list[ast.stmt], env: dict, stop=None):
        for stmt in body:
            if stop is not None and (found := stop(stmt, env)) is not None:
                return "return", found
            if isinstance(stmt, ast.Assign):
                value = self.eval(stmt.value, env)
                for target in stmt.targets:
                    self.bind(target, value, env)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                env[stmt.target.id] = self.binop(stmt.op, env[stmt.target.id], self.eval(stmt.value, env))
            elif isinstance(stmt, ast.With):
                if (out := self.run(stmt.body, env, stop)) is not None:
                    return out
            elif isinstance(stmt, ast.If):
                test = self.eval(stmt.test, env)
                if not isinstance(test, bool):
                    raise _Unknown(ast.unparse(stmt.test))
                if (out := self.run(stmt.body if test else stmt.orelse, env, stop)) is not None:
                    return out
            elif isinstance(stmt, ast.Return):
                return "return", self.eval(stmt.value, env) if stmt.value is not None else None
            elif isinstance(stmt, (ast.Pass, ast.Assert)) or (
                    isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
                continue
            else:
                raise _Unknown(f"{self.where}:{stmt.lineno}: {ast.unparse(stmt).splitlines()[0][:70]}")
        return None

    def bind(self, target: ast.AST, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, ast.Tuple) and isinstance(value, tuple) and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self.bind(t, v, env)
        else:
            raise _Unknown(ast.unparse(target))

    def binop(self, op: ast.operator, a, b):
        ops = {ast.Add: lambda x, y: x + y, ast.Sub: lambda x, y: x - y, ast.Mult: lambda x, y: x * y,
               ast.Div: _div}
        if type(op) not in ops:
            raise _Unknown(type(op).__name__)
        return _broadcast(a, b, ops[type(op)], "f")

    def eval(self, node: ast.AST, env: dict):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise _Unknown(node.id)
            return env[node.id]
        if isinstance(node, ast.Attribute) and _dotted(node.value) == "self":
            if node.attr == "training":
                return False
            if node.attr in self.attrs:
                self.used[node.attr] = self.attrs[node.attr]
                return self.attrs[node.attr]
            raise _Unknown(ast.unparse(node))
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(self.eval(e, env) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            value = self.eval(node.operand, env)
            if isinstance(node.op, ast.Not) and isinstance(value, bool):
                return not value
            if isinstance(node.op, ast.USub):
                return _broadcast(value, -1.0, lambda x, y: x * y, "f")
            raise _Unknown(ast.unparse(node))
        if isinstance(node, ast.BoolOp):
            values = [self.eval(v, env) for v in node.values]
            if not all(isinstance(v, bool) for v in values):
                raise _Unknown(ast.unparse(node))
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.eval(node.left, env), self.eval(node.right, env))
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            ops = {ast.Gt: lambda x, y: x > y, ast.Lt: lambda x, y: x < y, ast.GtE: lambda x, y: x >= y,
                   ast.LtE: lambda x, y: x <= y, ast.Eq: lambda x, y: x == y}
            if type(node.ops[0]) not in ops:
                raise _Unknown(ast.unparse(node))
            return _broadcast(self.eval(node.left, env), self.eval(node.comparators[0], env), ops[type(node.ops[0])],
                              "b")
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            value = self.eval(node.value, env)
            if isinstance(value, tuple) and isinstance(node.slice.value, int):
                return value[node.slice.value]
        if isinstance(node, ast.Call):
            return self.call(node, env)
        raise _Unknown(ast.unparse(node)[:70])

    def call(self, node: ast.Call, env: dict):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        module = isinstance(func, ast.Attribute) and _dotted(func.value).split(".")[0] in (
            "torch", "F", "nn", "functional")
        args = ([] if module or not isinstance(func, ast.Attribute) else [self.eval(func.value, env)])
        if isinstance(func, ast.Name) and name in self.functions:
            return self.function(self.functions[name], node, env)
        args += [self.eval(a, env) for a in node.args]
        kw = {k.arg: self.eval(k.value, env) for k in node.keywords if k.arg is not None}
        if name == "float" and isinstance(func, ast.Name) and len(args) == 1 and isinstance(args[0], (str, int, float)):
            return float(args[0])
        if name in ("float", "contiguous", "to", "type_as", "detach") and args and isinstance(args[0], _T):
            return args[0]
        if name in ("cat", "concat", "concatenate") and args and isinstance(args[0], (tuple, list)):
            _dim_last(kw, 1, args)
            parts = args[0]
            if not parts or not all(isinstance(p, _T) and p.kind == parts[0].kind for p in parts):
                raise _Unknown(ast.unparse(node)[:70])
            return _T([[v for p in parts for v in p.rows[i]] for i in range(len(parts[0].rows))], parts[0].kind)
        if not args or not isinstance(args[0], _T):
            raise _Unknown(ast.unparse(node)[:70])
        x = args[0]
        if name == "max" and len(args) == 1 or (name == "max" and len(args) == 2 and "dim" not in kw):
            _dim_last(kw, 1, args)
            if not kw.get("keepdim", args[2] if len(args) > 2 else False):
                raise _Unknown(f"{ast.unparse(node)[:60]} without keepdim")
            best = [max(range(len(r)), key=lambda j, r=r: (r[j], -j)) for r in x.rows]
            return _T([[r[j]] for r, j in zip(x.rows, best)], "f"), _T([[j] for j in best], "i")
        if name == "abs" and len(args) == 1:
            return _T([[abs(v) for v in r] for r in x.rows], x.kind)
        if name in ("clamp", "clip"):
            low = kw.get("min", args[1] if len(args) > 1 else None)
            high = kw.get("max", args[2] if len(args) > 2 else None)
            out = x
            if low is not None:
                out = _broadcast(out, low, max, "f")
            if high is not None:
                out = _broadcast(out, high, min, "f")
            return out
        if name == "masked_fill" and len(args) == 3:
            mask, value = args[1], args[2]
            return _broadcast(_broadcast(x, mask, lambda v, m: (v, m), "f"), value,
                              lambda vm, fill: fill if vm[1] else vm[0], "f")
        if name == "softmax":
            _dim_last(kw, 1, args)
            return _T([_softmax(r) for r in x.rows], "f")
        if name == "gather":
            _dim_last(kw, 1, args)
            index = kw.get("index", args[2] if len(args) > 2 else None)
            if not isinstance(index, _T) or index.kind != "i":
                raise _Unknown(ast.unparse(node)[:70])
            return _T([[r[j] for j in idx] for r, idx in zip(x.rows, index.rows)], x.kind)
        if name == "scatter":
            _dim_last(kw, 1, args)
            index = kw.get("index", args[2] if len(args) > 2 else None)
            value = kw.get("value", kw.get("src", args[3] if len(args) > 3 else None))
            if not isinstance(index, _T) or isinstance(value, _T) or value is None:
                raise _Unknown(ast.unparse(node)[:70])
            rows = [list(r) for r in x.rows]
            for r, idx in zip(rows, index.rows):
                for j in idx:
                    r[j] = float(value)
            return _T(rows, x.kind)
        if name == "sum":
            _dim_last(kw, 1, args)
            if not kw.get("keepdim", False):
                raise _Unknown(f"{ast.unparse(node)[:60]} without keepdim")
            return _T([[sum(r)] for r in x.rows], "f")
        raise _Unknown(ast.unparse(node)[:70])

    def function(self, func: ast.FunctionDef, node: ast.Call, env: dict):
        if len(self.stack) >= MAX_CALL_DEPTH:
            raise _Unknown(f"calls deeper than {MAX_CALL_DEPTH}")
        params = [a.arg for a in func.args.args]
        defaults = dict(zip(params[len(params) - len(func.args.defaults):], func.args.defaults))
        local: dict = {}
        for p, a in zip(params, node.args):
            local[p] = self.eval(a, env)
        for k in node.keywords:
            if k.arg not in params:
                raise _Unknown(ast.unparse(node)[:70])
            local[k.arg] = self.eval(k.value, env)
        for p in params:
            if p not in local:
                if p not in defaults:
                    raise _Unknown(ast.unparse(node)[:70])
                local[p] = self.eval(defaults[p], {})
        self.stack.append(func.name)
        try:
            out = self.run(func.body, local)
        finally:
            self.stack.pop()
        return out[1] if out is not None else None


def reference(rows: list[list[float]], jitter: float) -> tuple[list[list[float]], list[list[int]]]:
    """vLLM's sparsemixer (vllm/model_executor/models/phimoe.py), row by row."""
    weights, ids = [], []
    for row in rows:
        pair_w, pair_i = [], []
        current = list(row)
        for _ in range(2):
            best = max(range(len(current)), key=lambda j: (current[j], -j))
            top = current[best]
            masked = [-math.inf if _div(top - s, max(abs(s), top)) > 2 * jitter else c
                      for s, c in zip(row, current)]
            pair_w.append(_softmax(masked)[best])
            pair_i.append(best)
            current = list(current)
            current[best] = -math.inf
        weights.append(pair_w)
        ids.append(pair_i)
    return weights, ids


def samples(jitter: float, experts: int) -> list[list[float]]:
    """Router logits where the masks matter: random rows, and rows whose runners-up sit just inside and just
    outside the relative gap 2 * jitter of the best (and of the second best)."""
    rng = random.Random(1234)
    rows = []
    for _ in range(24):
        rows.append([rng.uniform(-3, 3) for _ in range(experts)])
    gap = max(2 * jitter, 1e-3)
    for factor in (0.3, 0.7, 1.3, 2.5):
        for sign in (1, -1):
            best = sign * rng.uniform(0.5, 2.0)
            row = [best - rng.uniform(3, 5) for _ in range(experts)]
            row[0] = best
            row[1] = best - factor * gap * max(abs(best), 1e-3)
            row[2] = row[1] - factor * gap * max(abs(row[1]), 1e-3)
            if experts > 3:
                row[3] = row[1] - 0.5 * gap * max(abs(row[1]), 1e-3)
            rng.shuffle(row)
            rows.append(row)
    return rows


def _logits_assignment(body: list[ast.stmt], experts: str) -> tuple[int, str] | None:
    """(index in body, name) of the statement binding the router logits: a name assigned the router's linear
    (`super().forward(x)` of an nn.Linear subclass, `F.linear(x, self.weight)`, `self.gate(x)`)."""
    for i, stmt in enumerate(body):
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.Call)):
            continue
        func = stmt.value.func
        dotted = _dotted(func)
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and _dotted(func.value.func) == "super"
                and func.attr == "forward") or dotted.rsplit(".", 1)[-1] == "linear" or (
                dotted.startswith("self.") and dotted.count(".") == 1 and dotted != f"self.{experts}"):
            return i, stmt.targets[0].id
    return None


def read_sparsemixer(sources: dict[str, str], block: str, experts: str, config: dict,
                     top_k: int) -> SparseMixer | str:
    """The routing the MoE class `block` (its forward, or its router's) computes from the router logits, when it is
    vLLM's sparsemixer; else why not (a str naming the line or the difference)."""
    classes = _classes(sources)
    functions = {node.name: node for _file, tree in _parsed(sources) for node in tree.body
                 if isinstance(node, ast.FunctionDef)}
    file, cls = classes[block]
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    built = {}
    for stmt in subtree(init) if init else ():
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self" and isinstance(stmt.value, ast.Call)):
            built[stmt.targets[0].attr] = _dotted(stmt.value.func).rsplit(".", 1)[-1]
    # The router's forward first (where the logits are computed), then the block's own.
    candidates = [classes[c] for a, c in built.items() if a != experts and c in classes and c != block] + [(file, cls)]
    for c_file, c_cls in candidates:
        forward = next((n for n in c_cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
        if forward is None:
            continue
        found = _logits_assignment(forward.body, experts)
        if found is None:
            continue
        start, logits = found
        attrs: dict[str, float] = {}
        keys: dict[str, str] = {}
        c_init = next((n for n in c_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        for stmt in subtree(c_init) if c_init else ():
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                    and _dotted(stmt.targets[0].value) == "self"):
                value = stmt.value
                if isinstance(value, ast.Attribute) and _is_config(value.value) and isinstance(
                        config.get(value.attr), (int, float)) and not isinstance(config.get(value.attr), bool):
                    attrs[stmt.targets[0].attr] = float(config[value.attr])
                    keys[stmt.targets[0].attr] = value.attr
                elif isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
                    attrs[stmt.targets[0].attr] = float(value.value)
        return _compare(c_file, c_cls, forward, start, logits, functions, attrs, keys, experts, config, top_k)
    return f"{file}:{cls.lineno}: no router logits (a linear of the input) found on the routing path"


def _compare(file, cls, forward, start, logits, functions, attrs, keys, experts, config, top_k) -> SparseMixer | str:
    where = f"{file}:{forward.body[start].lineno}"
    # The jitter: the one config value the path reads that makes the code agree with sparsemixer.
    experts_n = config.get("num_local_experts") or config.get("num_experts") or 8
    experts_n = max(int(experts_n), 4)

    def stop(stmt, env):  # in the block's forward: the routing is what the experts are called with
        for node in subtree(stmt):
            if isinstance(node, ast.Call) and _dotted(node.func) == f"self.{experts}":
                interp_local = _Interp(functions, attrs, file)
                return tuple(interp_local.eval(a, env) for a in node.args[1:] if isinstance(a, ast.Name) and a.id in env)
        return None

    # The jitter: each number the path reads (the router's `self.A = config.KEY`, a function's default, a
    # constant); the code agrees with sparsemixer at one of them or at none.
    numbers = {float(n.value) for body in [forward, *functions.values()] for n in subtree(body)
               if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
               and 0 <= n.value < 1}
    candidates = sorted(set(attrs.values()) | numbers) or [0.0]
    last = None
    for jitter in candidates:
        rows = samples(jitter, experts_n)
        interp = _Interp(functions, attrs, file)
        try:
            out = interp.run(forward.body[start + 1:], {logits: _T(rows, "f")}, stop)
        except _Unknown as exc:
            return f"{where}: the routing computes {str(exc)[:90]}, which the routing reader does not follow"
        except (ValueError, IndexError, TypeError, KeyError, OverflowError) as exc:
            return f"{where}: the routing reader could not evaluate it ({type(exc).__name__})"
        value = out[1] if out is not None else None
        parts = value if isinstance(value, tuple) else (value,)
        weights = [p for p in parts if isinstance(p, _T) and p.kind == "f" and p.width != experts_n]
        ids = [p for p in parts if isinstance(p, _T) and p.kind == "i"]
        if len(weights) != 1 or len(ids) != 1:
            return f"{where}: the routing returns no one table of weights and one of expert indices"
        want_w, want_i = reference(rows, jitter)
        got = [sorted(zip(i, w)) for i, w in zip(ids[0].rows, weights[0].rows)]
        want = [sorted(zip(i, w)) for i, w in zip(want_i, want_w)]
        same_ids = all([p[0] for p in g] == [p[0] for p in w] for g, w in zip(got, want))
        worst = max((abs(a[1] - b[1]) for g, w in zip(got, want) for a, b in zip(g, w)), default=math.inf) \
            if same_ids else math.inf
        if same_ids and worst <= 1e-9:
            attr = next((a for a, v in interp.used.items() if v == jitter), None)
            if top_k != 2:
                return (f"{where}: the routing is sparsemixer, which routes each token to 2 experts, "
                        f"but config.json says {top_k}")
            return SparseMixer(jitter, keys.get(attr) if attr else None,
                               f"{where}: the router logits {logits} routed as vLLM's sparsemixer "
                               f"(jitter_eps {jitter:g}{f' = config.{keys[attr]}' if attr in keys else ''})")
        last = "other experts" if not same_ids else f"weights differing by up to {worst:.2g}"
    return (f"{where}: the routing computed from {logits} is not vLLM's sparsemixer at any jitter the code reads "
            f"({last} on sample logits)")
