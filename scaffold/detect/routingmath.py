"""A routing without a top-k, read from the code: is it PhiMoE's sparsemixer as vLLM serves it?

PhiMoE's router (`sparsemixer`) takes no top-k of softmax scores. In inference it picks the best expert, masks
every score whose gap to the best, relative to max(|score|, best), exceeds 2 * jitter_eps, and weights the
expert by the softmax of what is left; then the same once more with the first expert's score set to -inf (the
gap still relative to the unmasked scores' magnitudes). vLLM serves it through FusedMoE with a custom routing
function (vllm/model_executor/models/phimoe.py, `sparsemixer(scores, jitter_eps)`). A lab may inline that code
into its router's forward, rename it, or write a variant (another threshold, a softmax over every score).

So the code is not matched as text: the routing path's statements after the router logits are computed are
interpreted over numbers by evaluate.py's interpreter (`_Routing` adds what a routing computes beyond its library:
[tokens, experts] tables compared element by element, max with its index, abs, clamp, masked_fill, gather,
scatter; the module's own functions called with their arguments, `self.A` read from __init__ as
`self.A = config.KEY`, `self.training` as False) on sample logits where the masks matter, and compared with vLLM's
sparsemixer at the jitter the code reads. Anything else the statements compute is named, not guessed.
"""

from __future__ import annotations

import ast
import math
import random
from dataclasses import dataclass

import numpy as np

from scaffold.detect.codekeys import _is_config
from scaffold.detect.evaluate import MODULES, CannotEvaluate, Interpreter, Limits, Obj
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

MAX_CALL_DEPTH = 4


@dataclass(frozen=True)
class SparseMixer:
    jitter: float  # the jitter_eps the code reads, with this config
    jitter_key: str | None  # the config key it reads it from (None: a number in the code)
    evidence: str  # file:line of what computes it


class _Attrs(dict):
    """self's attributes, noting which numbers the code reads (`used`): the jitter is the one read."""

    def __init__(self, numbers: dict[str, float]):
        super().__init__(numbers, training=False)
        self.used: dict[str, float] = {}

    def __getitem__(self, key):
        value = super().__getitem__(key)
        if key != "training":
            self.used[key] = value
        return value


# The comparisons of tables, element by element (boolean tables).
_COMPARE = {ast.Gt: np.greater, ast.Lt: np.less, ast.GtE: np.greater_equal, ast.LtE: np.less_equal,
            ast.Eq: np.equal, ast.NotEq: np.not_equal}
# The torch calls a routing computes beyond evaluate.py's library (under torch., F., or as a tensor's methods).
ROUTING_CALLS = frozenset({"max", "abs", "clamp", "clip", "masked_fill", "gather", "scatter"})


class _Routing(Interpreter):
    """evaluate.py's interpreter over [tokens, experts] tables (float64 scores, int64 indices, boolean masks), with
    what a routing computes beyond its library: comparisons element by element, max over a dim with its index,
    abs, clamp, masked_fill, gather and scatter; `self.training` is False. `stop` ends the block's forward at the
    experts' call (what they are called with is the routing); the functions it calls run whole."""

    def __init__(self, functions: dict[str, ast.FunctionDef], attrs: dict[str, float], stop=None):
        super().__init__(functions, {}, Limits(depth=MAX_CALL_DEPTH))
        self.self_obj = Obj(name="self")
        self.self_obj.attrs = _Attrs(attrs)
        self.stop = stop

    @property
    def used(self) -> dict[str, float]:
        return self.self_obj.attrs.used

    def stmt(self, stmt: ast.stmt, env: dict):
        if self.stop is not None and self.depth == 0 and (found := self.stop(stmt, env)) is not None:
            return (found,)
        return super().stmt(stmt, env)

    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
            left, right = self.expr(node.left, env), self.expr(node.comparators[0], env)
            if isinstance(left, np.ndarray) or isinstance(right, np.ndarray):
                return _COMPARE[type(node.ops[0])](left, right)
            return self.compare(node.ops[0], left, right, node)
        return super().expr(node, env)

    def attribute(self, node: ast.Attribute, env: dict):
        head = _dotted(node).split(".")[0]
        if node.attr in ROUTING_CALLS:
            if head in (*MODULES, "functional") and head not in env:
                return ("library", node.attr)
            owner = self.expr(node.value, env)
            if isinstance(owner, np.ndarray):
                return ("method", owner, node.attr)
        return super().attribute(node, env)

    def library(self, name: str, args: list, kwargs: dict, node: ast.Call):
        if name in ROUTING_CALLS and args and isinstance(args[0], np.ndarray):
            return self.method(args[0], name, args[1:], kwargs, node)
        return super().library(name, args, kwargs, node)

    def method(self, owner, name: str, args: list, kwargs: dict, node: ast.Call):
        if not isinstance(owner, np.ndarray) or name not in ROUTING_CALLS:
            return super().method(owner, name, args, kwargs, node)
        line = f"line {node.lineno}: {ast.unparse(node)[:60]}"
        if name == "abs":
            return np.abs(owner)
        if name == "max":
            if args and isinstance(args[0], np.ndarray):  # torch.max(a, b): element by element
                return np.maximum(owner, args[0])
            if not args and "dim" not in kwargs:
                return np.asarray(owner.max())
            dim = _dim(args, kwargs)
            keep = bool(kwargs.get("keepdim", args[1] if len(args) > 1 else False))
            index = np.argmax(owner, axis=dim)  # the first of equal scores, as torch's
            values = np.take_along_axis(owner, np.expand_dims(index, dim), axis=dim)
            return (values, np.expand_dims(index, dim)) if keep else (values.squeeze(dim), index)
        if name in ("clamp", "clip"):
            low = kwargs.get("min", args[0] if args else None)
            high = kwargs.get("max", args[1] if len(args) > 1 else None)
            out = owner if low is None else np.maximum(owner, low)
            return out if high is None else np.minimum(out, high)
        if name == "masked_fill":
            mask = kwargs.get("mask", args[0] if args else None)
            value = kwargs.get("value", args[1] if len(args) > 1 else None)
            if not isinstance(mask, np.ndarray) or mask.dtype != bool or isinstance(value, np.ndarray) and value.ndim:
                raise CannotEvaluate(line)
            return np.where(mask, value, owner)
        # gather / scatter: along a dim, by a table of indices
        dim = _dim(args, kwargs)
        index = kwargs.get("index", args[1] if len(args) > 1 else None)
        if not isinstance(index, np.ndarray) or index.dtype.kind != "i":
            raise CannotEvaluate(line)
        if name == "gather":
            return np.take_along_axis(owner, index, axis=dim)
        value = kwargs.get("value", kwargs.get("src", args[2] if len(args) > 2 else None))
        if value is None or isinstance(value, np.ndarray):
            raise CannotEvaluate(line)
        out = owner.copy()
        np.put_along_axis(out, index, float(value), axis=dim)
        return out


def _dim(args: list, kwargs: dict) -> int:
    dim = kwargs.get("dim", args[0] if args else None)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise CannotEvaluate(f"an operation over dim {dim}")
    return dim


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
                return tuple(env[a.id] for a in node.args[1:] if isinstance(a, ast.Name) and a.id in env)
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
        interp = _Routing(functions, attrs, stop)
        env = {logits: np.array(rows, dtype=np.float64), "self": interp.self_obj}
        try:
            with np.errstate(all="ignore"):  # -inf scores: nan gaps, as torch computes them
                out = interp.call_block(forward.body[start + 1:], env)
        except CannotEvaluate as exc:
            return f"{where}: the routing computes {str(exc)[:90]}, which the routing reader does not follow"
        value = out[0] if out is not None else None
        parts = value if isinstance(value, tuple) else (value,)
        tables = [p for p in parts if isinstance(p, np.ndarray) and p.ndim == 2 and p.shape[0] == len(rows)]
        weights = [p.tolist() for p in tables if p.dtype.kind == "f" and p.shape[1] != experts_n]
        ids = [p.tolist() for p in tables if p.dtype.kind == "i"]
        if len(weights) != 1 or len(ids) != 1:
            return f"{where}: the routing returns no one table of weights and one of expert indices"
        want_w, want_i = reference(rows, jitter)
        got = [sorted(zip(i, w)) for i, w in zip(ids[0], weights[0])]
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
