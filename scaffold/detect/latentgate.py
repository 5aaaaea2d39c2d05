"""A latent attention whose query up-projection also reads the unnormed low-rank query and emits an output gate.

A.X-K2's attention (DeepSeek-V3's MLA otherwise) projects the hidden states to the low-rank query c = q_a_proj(x),
norms it, and hands the up-projection both, concatenated: q_gate_proj(cat([norm(c), c], -1)) (the checkpoint calls
it q_b_proj). Its output, viewed per head, is cut into the head's query (qk_nope + qk_rope wide) and a gate
(v_head_dim wide); the attention output, per element, is multiplied by sigmoid(gate) before o_proj.

The reader follows values, not names, through the attention's forward (and the class's own methods it calls, their
parameters bound to the call's arguments): which inputs the up-projection's call concatenates and in which order
(the low-rank projection's output and that output through the query's norm), whether its output is viewed per head
before it is cut in two along the last axis, which piece reaches the attention and which, through an activation,
multiplies what the attention returns on its way to the output projection. What it does not follow is a `Refused`
naming the line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.sourcecode import _classes, _dotted

IDENTITY_METHODS = {"contiguous", "float", "to", "type", "type_as", "clone", "detach", "view", "reshape",
                    "transpose", "unsqueeze", "squeeze", "flatten", "permute", "expand", "unflatten", "bfloat16",
                    "half", "view_as", "reshape_as"}
SHAPING = {"view", "reshape", "unflatten"}  # reshapes that may give the output a per-head axis
ACTIVATIONS = {"sigmoid", "softplus", "silu", "tanh", "relu"}
MODULE_ACTIVATIONS = {"Sigmoid": "sigmoid", "Softplus": "softplus", "SiLU": "silu", "Tanh": "tanh", "ReLU": "relu"}
CATS = {"cat", "concat", "concatenate"}
MAX_DEPTH = 4


class Refused(Exception):
    """The form is not the one the port computes, or the reader does not follow it: the message names the line."""


@dataclass(frozen=True)
class QueryGate:
    inputs: tuple[str, str]   # what the up-projection reads, in order: "normed" / "unnormed"
    gate_first: bool          # each head's rows hold the gate before the query
    act: str                  # the gate's activation (spec.GATE_ACTIVATIONS)
    evidence: str             # FILE:LINE of the concatenation, the cut and the gate's product


# Symbolic values: tuples, the first item their kind.
#   ("in",)                      the attention's input (forward's first argument)
#   ("mod", attr, arg)           self.<attr>(arg): a module of __init__
#   ("cat", (a, b, ...), line)   concatenated along the last axis
#   ("view", x, per_head)        reshaped; per_head where the new shape has three axes or more
#   ("piece", x, i, line)        the i-th piece of x cut in two along the last axis
#   ("act", name, x, line)       an activation of x
#   ("mul", a, b, line)          a product
#   ("opaque", deps)             anything else, with the values it derives from


def _strip(v):
    """v without the reshapes that keep its values (views, dtype casts); a view's per-head marker is kept apart."""
    while isinstance(v, tuple) and v and v[0] == "view":
        v = v[1]
    return v


def _deps(v) -> set:
    """Every symbolic value v derives from, v included."""
    out, todo = set(), [v]
    while todo:
        x = todo.pop()
        if not isinstance(x, tuple) or x in out:
            continue
        out.add(x)
        for item in x[1:] if isinstance(x[0], str) else x:
            if isinstance(item, tuple):
                todo.append(item)
            elif isinstance(item, frozenset):
                todo.extend(item)
    return out


class _Reader:
    def __init__(self, file: str, cls: ast.ClassDef):
        self.file, self.cls = file, cls
        self.methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        self.module_acts = self._module_activations()
        self.calls: list[tuple[str, object, int]] = []  # (attr, argument, line) of every self.<module>(x)

    def _module_activations(self) -> dict[str, str]:
        init = self.methods.get("__init__")
        out = {}
        for node in ast.walk(init) if init else ():
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call)
                    and _dotted(node.targets[0]).startswith("self.")):
                short = _dotted(node.value.func).rsplit(".", 1)[-1]
                if short in MODULE_ACTIVATIONS:
                    out[_dotted(node.targets[0])[5:]] = MODULE_ACTIVATIONS[short]
        return out

    def where(self, line: int) -> str:
        return f"{self.file}:{line}"

    def run(self, func: ast.FunctionDef, args: list, depth: int = 0):
        params = [a.arg for a in func.args.args][1:]
        env = dict(zip(params, args))
        for p in params[len(args):]:
            env[p] = ("opaque", frozenset())
        returned = []
        self.block(func.body, env, returned, depth)
        return returned[0] if returned else ("opaque", frozenset())

    def block(self, body: list, env: dict, returned: list, depth: int) -> None:
        for stmt in body:
            if returned:
                return
            if isinstance(stmt, ast.Return):
                returned.append(self.expr(stmt.value, env, depth) if stmt.value else ("opaque", frozenset()))
            elif isinstance(stmt, ast.Assign):
                value = self.expr(stmt.value, env, depth)
                for target in stmt.targets:
                    self.assign(target, value, env)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self.assign(stmt.target, self.expr(stmt.value, env, depth), env)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                left = env.get(stmt.target.id, ("opaque", frozenset()))
                right = self.expr(stmt.value, env, depth)
                env[stmt.target.id] = (("mul", left, right, stmt.lineno) if isinstance(stmt.op, ast.Mult)
                                       else ("opaque", frozenset({left, right})))
            elif isinstance(stmt, ast.If):
                # Both branches run; what either assigns is kept (the later one wins): the forms read here are not
                # under a condition in the code this reads, and one that is stays visible in its own branch.
                self.block(stmt.body, env, returned, depth)
                self.block(stmt.orelse, env, returned, depth)
            elif isinstance(stmt, (ast.With, ast.For)):
                self.block(stmt.body, env, returned, depth)
            elif isinstance(stmt, ast.Expr):
                self.expr(stmt.value, env, depth)

    def assign(self, target: ast.expr, value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            items = self.unpack(value, len(target.elts))
            for t, v in zip(target.elts, items):
                self.assign(t, v, env)

    def unpack(self, value, n: int) -> list:
        if isinstance(value, tuple) and value and value[0] == "pieces":
            _, x, count, line = value
            if count == n:
                return [("piece", x, i, line) for i in range(n)]
        if isinstance(value, tuple) and value and value[0] == "tuple" and len(value[1]) == n:
            return list(value[1])
        return [("opaque", frozenset({value, ("item", i)})) for i in range(n)]

    def expr(self, node: ast.expr | None, env: dict, depth: int):
        if node is None:
            return ("opaque", frozenset())
        if isinstance(node, ast.Name):
            return env.get(node.id, ("opaque", frozenset()))
        if isinstance(node, (ast.Tuple, ast.List)):
            return ("tuple", tuple(self.expr(e, env, depth) for e in node.elts))
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value, env, depth)
            index = node.slice
            if isinstance(base, tuple) and base and base[0] == "tuple" and isinstance(index, ast.Constant) \
                    and isinstance(index.value, int) and -len(base[1]) <= index.value < len(base[1]):
                return base[1][index.value]
            if isinstance(base, tuple) and base and base[0] == "pieces" and isinstance(index, ast.Constant) \
                    and isinstance(index.value, int) and 0 <= index.value < base[2]:
                return ("piece", base[1], index.value, base[3])
            return ("opaque", frozenset({base}))
        if isinstance(node, ast.BinOp):
            left, right = self.expr(node.left, env, depth), self.expr(node.right, env, depth)
            if isinstance(node.op, ast.Mult):
                return ("mul", left, right, node.lineno)
            return ("opaque", frozenset({left, right}))
        if isinstance(node, ast.Call):
            return self.call(node, env, depth)
        if isinstance(node, ast.Attribute):
            return ("opaque", frozenset({self.expr(node.value, env, depth)}))
        return ("opaque", frozenset(self.expr(c, env, depth) for c in ast.iter_child_nodes(node)
                                    if isinstance(c, ast.expr)))

    def call(self, node: ast.Call, env: dict, depth: int):
        func = node.func
        dotted = _dotted(func)
        short = dotted.rsplit(".", 1)[-1] if dotted else getattr(func, "attr", "")
        args = [self.expr(a, env, depth) for a in node.args]
        kwargs = {k.arg: k.value for k in node.keywords}
        line = node.lineno
        # self.<method>(...) of the class: run it with its parameters bound; self.<module>(x): a module's output.
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
            if func.attr in self.methods and depth < MAX_DEPTH:
                return self.run(self.methods[func.attr], args, depth + 1)
            if func.attr in self.module_acts and len(args) == 1:
                return ("act", self.module_acts[func.attr], args[0], line)
            arg = args[0] if len(args) == 1 and not node.keywords else ("tuple", tuple(args))
            self.calls.append((func.attr, arg, line))
            return ("mod", func.attr, arg)
        module_fn = dotted.split(".")[0] in ("torch", "F", "nn", "functional") if dotted else False
        if module_fn and short in CATS and node.args:
            dim = kwargs.get("dim", kwargs.get("axis", node.args[1] if len(node.args) > 1 else None))
            parts = args[0]
            if _last_axis(dim) and isinstance(parts, tuple) and parts[0] == "tuple":
                return ("cat", parts[1], line)
            return ("opaque", frozenset({parts}))
        if module_fn and short in ACTIVATIONS and len(args) >= 1:
            return ("act", short, args[0], line)
        if module_fn and short == "mul" and len(args) == 2:
            return ("mul", args[0], args[1], line)
        if module_fn and short == "split" and len(node.args) >= 2:
            return self.split(args[0], node.args[1], kwargs.get("dim", node.args[2] if len(node.args) > 2 else None),
                              line)
        if module_fn and short == "chunk" and len(node.args) >= 2:
            return self.chunk(args[0], node.args[1], kwargs.get("dim", node.args[2] if len(node.args) > 2 else None),
                              line)
        if isinstance(func, ast.Attribute) and not module_fn:
            base = self.expr(func.value, env, depth)
            method = func.attr
            if method in SHAPING:
                if method == "unflatten":
                    return ("view", base, True)
                count = len(node.args)
                if count == 1:  # one shape: written out, or a local holding it
                    shape = self.expr(node.args[0], env, depth)
                    count = len(shape[1]) if isinstance(shape, tuple) and shape[0] == "tuple" else 1
                return ("view", base, count >= 3)
            if method in IDENTITY_METHODS:
                return ("view", base, False) if method not in ("view", "reshape") else base
            if method in ACTIVATIONS and not node.args:
                return ("act", method, base, line)
            if method == "mul" and len(args) == 1:
                return ("mul", base, args[0], line)
            if method == "split" and node.args:
                return self.split(base, node.args[0], kwargs.get("dim", node.args[1] if len(node.args) > 1 else None),
                                  line)
            if method == "chunk" and node.args:
                return self.chunk(base, node.args[0], kwargs.get("dim", node.args[1] if len(node.args) > 1 else None),
                                  line)
            return ("opaque", frozenset({base, *args, *(self.expr(v, env, depth) for v in kwargs.values())}))
        return ("opaque", frozenset({*args, *(self.expr(v, env, depth) for v in kwargs.values())}))

    def split(self, x, sizes: ast.expr, dim, line: int):
        if _last_axis(dim) and isinstance(sizes, (ast.List, ast.Tuple)):
            return ("pieces", x, len(sizes.elts), line)
        return ("opaque", frozenset({x}))

    def chunk(self, x, count: ast.expr, dim, line: int):
        if _last_axis(dim) and isinstance(count, ast.Constant) and isinstance(count.value, int):
            return ("pieces", x, count.value, line)
        return ("opaque", frozenset({x}))


def _last_axis(dim) -> bool:
    return (isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and isinstance(dim.operand, ast.Constant)
            and dim.operand.value == 1)


def read(sources: dict[str, str], attention_cls: str, q_a_proj: str, q_a_norm: str, q_b_proj: str,
         o_proj: str) -> QueryGate:
    """How the attention class's forward computes its query and output gate from the query up-projection `q_b_proj`
    (the code's attribute names); Refused naming the line where it is not the form the port builds."""
    found = _classes(sources).get(attention_cls.rsplit(".", 1)[-1])
    if found is None:
        raise Refused(f"no class {attention_cls} in the code read")
    file, cls = found
    reader = _Reader(file, cls)
    forward = reader.methods.get("forward")
    if forward is None or len(forward.args.args) < 2:
        raise Refused(f"{attention_cls} has no forward taking the hidden states")
    reader.run(forward, [("in",)])
    ups = [(arg, line) for attr, arg, line in reader.calls if attr == q_b_proj]
    if len(ups) != 1:
        raise Refused(f"{attention_cls}.forward calls self.{q_b_proj} {len(ups)} times ({file}), not once")
    arg, up_line = ups[0]
    low = ("mod", q_a_proj, ("in",))
    normed = ("mod", q_a_norm, low)
    cat = _strip(arg)
    if not (isinstance(cat, tuple) and cat[0] == "cat" and len(cat[1]) == 2):
        raise Refused(f"{reader.where(up_line)}: self.{q_b_proj} reads {_describe(arg, q_a_proj, q_a_norm)}, not "
                      "the low-rank query and its normed form concatenated along the last axis")
    parts = tuple(_strip(p) for p in cat[1])
    roles = tuple("normed" if p == normed else "unnormed" if p == low else None for p in parts)
    if None in roles or len(set(roles)) != 2:
        raise Refused(f"{reader.where(cat[2])}: self.{q_b_proj} reads the concatenation of "
                      f"{' and '.join(_describe(p, q_a_proj, q_a_norm) for p in parts)}, not self.{q_a_proj}(x) and "
                      f"self.{q_a_norm}(self.{q_a_proj}(x))")
    up = ("mod", q_b_proj, arg)
    # The cut: pieces of the up-projection's output, viewed per head before the cut.
    cut = sorted((p for p in _all_values(reader) if isinstance(p, tuple) and p[0] == "piece" and _strip(p[1]) == up),
                 key=lambda p: (p[3], p[2]))
    if not cut:
        raise Refused(f"{reader.where(up_line)}: the output of self.{q_b_proj} is not cut in two along its last axis "
                      "(into each head's query and gate) where the reader follows it")
    views = {p[1] for p in cut}
    if len(views) != 1 or not _per_head(next(iter(views))):
        raise Refused(f"{reader.where(cut[0][3])}: the output of self.{q_b_proj} is cut along its last axis without "
                      "a view per head first: its rows are not [query | gate] per head, which the port cuts")
    # The gate: an activation of one piece multiplying a value that derives from the other piece (the attention's
    # output), on the way into the output projection.
    into_o = [arg for attr, arg, _ in reader.calls if attr == o_proj]
    if len(into_o) != 1:
        raise Refused(f"{attention_cls}.forward calls self.{o_proj} {len(into_o)} times, not once")
    products = [d for d in _deps(into_o[0]) if isinstance(d, tuple) and d[0] == "mul"]
    for mul in products:
        for gate, out in ((mul[1], mul[2]), (mul[2], mul[1])):
            g = _strip(gate)
            if not (isinstance(g, tuple) and g[0] == "act"):
                continue
            gated = _strip(g[2])
            if not (isinstance(gated, tuple) and gated[0] == "piece" and _strip(gated[1]) == up):
                continue
            query = next((p for p in cut if p[2] != gated[2]), None)
            if query is None or query not in _deps(out):
                raise Refused(f"{reader.where(mul[3])}: the gate piece of self.{q_b_proj} multiplies a value that "
                              "does not derive from the query piece (the attention's output)")
            if gated[2] not in (0, 1) or len({p[2] for p in cut}) != 2:
                break
            if g[1] not in ACTIVATIONS:
                raise Refused(f"{reader.where(g[3])}: the gate's activation {g[1]} is not one of "
                              f"{', '.join(sorted(ACTIVATIONS))}")
            return QueryGate(inputs=roles, gate_first=gated[2] == 0, act=g[1],
                             evidence=f"{reader.where(cat[2])} (concatenation), {reader.where(cut[0][3])} (cut per "
                                      f"head), {reader.where(mul[3])} ({g[1]} gate on the attention output)")
    raise Refused(f"{reader.where(cut[0][3])}: the output of self.{q_b_proj} is cut in two, but no activation of one "
                  f"piece multiplies the attention output on its way into self.{o_proj}")


def _all_values(reader: _Reader) -> set:
    out = set()
    for _, arg, _ in reader.calls:
        out |= _deps(arg)
    return out


def _per_head(v) -> bool:
    return isinstance(v, tuple) and v and v[0] == "view" and (v[2] or _per_head(v[1]))


def _describe(v, q_a_proj: str, q_a_norm: str) -> str:
    v = _strip(v)
    if v == ("mod", q_a_proj, ("in",)):
        return f"self.{q_a_proj}(x)"
    if v == ("mod", q_a_norm, ("mod", q_a_proj, ("in",))):
        return f"self.{q_a_norm}(self.{q_a_proj}(x))"
    if isinstance(v, tuple) and v and v[0] == "mod":
        return f"self.{v[1]}(...)"
    if isinstance(v, tuple) and v and v[0] == "cat":
        return f"a concatenation of {len(v[1])} values"
    if v == ("in",):
        return "the hidden states"
    return "a value the reader does not follow"


def gated_output(file: str, cls: ast.ClassDef) -> str | None:
    """Where a module's forward returns y * act(m(y)) with y = n(x), n and m modules of its own (A.X-K2's gated
    norm: a low-rank MLP of the norm's output gating it): FILE:LINE and the form as read; None elsewhere."""
    reader = _Reader(file, cls)
    forward = reader.methods.get("forward")
    if forward is None or len(forward.args.args) < 2:
        return None
    out = _strip(reader.run(forward, [("in",)]))
    if not (isinstance(out, tuple) and out[0] == "mul"):
        return None
    for y, gate in ((out[1], out[2]), (out[2], out[1])):
        y, gate = _strip(y), _strip(gate)
        if not (isinstance(y, tuple) and y[0] == "mod" and y[2] == ("in",)):
            continue
        if not (isinstance(gate, tuple) and gate[0] == "act"):
            continue
        inner = _strip(gate[2])
        if isinstance(inner, tuple) and inner[0] == "mod" and inner[1] != y[1] and y in _deps(inner[2]):
            reads = f"self.{y[1]}(x)" if _strip(inner[2]) == y else f"... self.{y[1]}(x) ..."
            return f"{file}:{out[3]}: self.{y[1]}(x) * {gate[1]}(self.{inner[1]}({reads}))"
    return None
