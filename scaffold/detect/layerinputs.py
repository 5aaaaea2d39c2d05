"""Per-layer input embeddings (Gemma 3n's and Gemma 4's PLE), named from the code that computes them (read as
text, never run).

The model that builds the decoder stack builds a second embedding table of the token ids besides the one that
starts the residual stream, and hands what that table gives (sliced per layer, projected, mixed) to each decoder
layer call as an argument of its own, beside the hidden states. The port's decoder layers take the hidden states
alone, from one embedding; a second input per layer is not a form it has.

The reading follows values, not names: in the model's forward (and the methods of its own class that forward
calls, inlined), each value carries the embedding modules it was computed from; at the call of a layer of the
stack (`for ... in self.<stack>: layer(...)`, `self.<stack>[i](...)`), an embedding that reaches an argument other
than the first (the hidden states) and does not reach the first is such a per-layer input. A position embedding
added to the token embedding (GPT-2's wpe) reaches the hidden states and is not one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import dataflow
from scaffold.detect.sourcecode import _dotted, _parsed, subtree

DEPTH = 3  # methods of the model's own class inlined into one another at most this deep


@dataclass(frozen=True)
class LayerInput:
    """A per-layer input embedding as the code builds and hands it."""

    model_cls: str
    table: str  # the attribute of the second embedding (embed_tokens_per_layer)
    table_cls: str
    table_where: str  # FILE:LINE where __init__ builds it
    stream: str  # the embedding the hidden states come from (embed_tokens)
    call_where: str  # FILE:LINE of the layer call that takes it
    argument: str  # that call's argument carrying it, as written

    def __str__(self) -> str:
        return (f"per-layer input embeddings: {self.model_cls} builds {self.table} ({self.table_cls}, "
                f"{self.table_where}), an embedding of the token ids besides {self.stream}, and hands what it gives "
                f"to each decoder layer beside the hidden states ({self.call_where}: argument {self.argument}); the "
                "port's decoder layers take the hidden states alone, from one embedding")

    def short(self) -> str:
        return f"per-layer input embeddings ({self.table}, {self.table_where}, handed to each layer at {self.call_where})"


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _embedding_classes(sources: dict) -> set[str]:
    """nn.Embedding and the source's classes derived from it (Gemma's scaled word embedding), by their last name."""
    bases: dict[str, set[str]] = {}
    for _file, tree in _parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            bases[cls.name] = {_dotted(b).rsplit(".", 1)[-1] for b in cls.bases}
    found = {"Embedding"}
    grew = True
    while grew:
        grew = False
        for name, parents in bases.items():
            if name not in found and parents & found:
                found.add(name)
                grew = True
    return found


class _Taint:
    """Which embedding modules each value of a method was computed from."""

    def __init__(self, cls: ast.ClassDef, embeddings: dict[str, int], stack: str, file: str):
        self.cls, self.embeddings, self.stack, self.file = cls, embeddings, stack, file
        self.calls: list[tuple[int, list[tuple[str, frozenset]]]] = []  # layer calls: line, (arg text, taint)

    def expr(self, node: ast.AST | None, env: dict, depth: int) -> frozenset:
        if node is None:
            return frozenset()
        if isinstance(node, ast.Name):
            return env.get(node.id, frozenset())
        if isinstance(node, ast.Call):
            func = node.func
            args = [*node.args, *(k.value for k in node.keywords)]
            if isinstance(func, ast.Attribute) and _dotted(func.value) == "self":
                if func.attr in self.embeddings:
                    return frozenset({func.attr})
                method = _method(self.cls, func.attr)
                if method is not None and depth < DEPTH:
                    return self.inline(method, node, env, depth + 1)
            out = frozenset()
            if isinstance(func, ast.Attribute):
                out |= self.expr(func.value, env, depth)  # x.reshape(...), x.to(...)
            for arg in args:
                out |= self.expr(arg.value if isinstance(arg, ast.Starred) else arg, env, depth)
            return out
        if isinstance(node, ast.Lambda):
            return frozenset()
        out = frozenset()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                out |= self.expr(child, env, depth)
        return out

    def inline(self, method: ast.FunctionDef, call: ast.Call, env: dict, depth: int) -> frozenset:
        params = [a.arg for a in [*method.args.posonlyargs, *method.args.args] if a.arg != "self"]
        inner = {p: self.expr(a, env, depth) for p, a in zip(params, call.args)}
        for k in call.keywords:
            if k.arg is not None:
                inner[k.arg] = self.expr(k.value, env, depth)
        return self.body(method.body, inner, depth, set())

    def _assign(self, target: ast.AST, taint: frozenset, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = env.get(target.id, frozenset()) | taint
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._assign(elt, taint, env)
        elif isinstance(target, ast.Starred):
            self._assign(target.value, taint, env)

    def _layer_call(self, node: ast.Call, layer_vars: set[str]) -> bool:
        func = node.func
        if isinstance(func, ast.Name) and func.id in layer_vars:
            return True
        # self.<stack>[i](...)
        return (isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute)
                and func.value.attr == self.stack and _dotted(func.value.value) == "self")

    def _record(self, stmt: ast.AST, env: dict, depth: int, layer_vars: set[str]) -> None:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and self._layer_call(node, layer_vars):
                args = [(ast.unparse(a), self.expr(a, env, depth)) for a in node.args]
                args += [(f"{k.arg}={ast.unparse(k.value)}", self.expr(k.value, env, depth)) for k in node.keywords]
                self.calls.append((node.lineno, args))

    def body(self, stmts: list, env: dict, depth: int, layer_vars: set[str]) -> frozenset:
        returned = frozenset()
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor)):
                over_stack = any(isinstance(n, ast.Attribute) and n.attr == self.stack and _dotted(n.value) == "self"
                                 for n in ast.walk(stmt.iter))
                inner_vars = set(layer_vars)
                if over_stack:
                    inner_vars |= {n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)}
                else:
                    self._assign(stmt.target, self.expr(stmt.iter, env, depth), env)
                returned |= self.body(stmt.body, env, depth, inner_vars)
                returned |= self.body(stmt.orelse, env, depth, layer_vars)
                continue
            if isinstance(stmt, (ast.If, ast.While)):
                returned |= self.body(stmt.body, env, depth, layer_vars)
                returned |= self.body(stmt.orelse, env, depth, layer_vars)
                continue
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                returned |= self.body(stmt.body, env, depth, layer_vars)
                continue
            if isinstance(stmt, ast.Try):
                for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                    returned |= self.body(part, env, depth, layer_vars)
                continue
            if depth == 0:
                self._record(stmt, env, depth, layer_vars)
            if isinstance(stmt, ast.Assign):
                taint = self.expr(stmt.value, env, depth)
                for target in stmt.targets:
                    self._assign(target, taint, env)
            elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
                self._assign(stmt.target, self.expr(stmt.value, env, depth)
                             | (self.expr(stmt.target, env, depth) if isinstance(stmt, ast.AugAssign)
                                else frozenset()), env)
            elif isinstance(stmt, ast.Return):
                returned |= self.expr(stmt.value, env, depth)
        return returned


def _stack_owners(sources: dict) -> list[tuple[str, ast.ClassDef, str]]:
    """(file, class, stack attribute) of the classes whose __init__ builds the decoder stack (an nn.ModuleList of the
    decoder layer class), those a *ForCausalLM class builds where the source has several stacks."""
    layer = dataflow.layer_class(sources)
    if layer is None:
        return []
    owners = []
    for file, tree in _parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            init = _method(cls, "__init__")
            for node in subtree(init) if init is not None else ():
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Attribute) and isinstance(node.value, ast.Call)
                        and _dotted(node.value.func).rsplit(".", 1)[-1] == "ModuleList" and node.value.args):
                    continue
                built = {_dotted(c.func).rsplit(".", 1)[-1] for c in ast.walk(node.value.args[0])
                         if isinstance(c, ast.Call)}
                if layer[1].name in built:
                    owners.append((file, cls, node.targets[0].attr))
    return owners


def per_layer_inputs(sources: dict, tensors=None) -> LayerInput | None:
    """The second embedding the model hands each decoder layer beside the hidden states, or None. With `tensors`
    (the checkpoint's tensor names), only a table the checkpoint holds (`<...>.<table>.weight`) counts: __init__
    may build it under a config switch (Gemma 4's `if self.hidden_size_per_layer_input:`)."""
    if not sources:
        return None
    kinds = _embedding_classes(sources)
    for file, cls, stack in _stack_owners(sources):
        init, forward = _method(cls, "__init__"), _method(cls, "forward")
        if forward is None:
            continue
        embeddings: dict[str, tuple[str, int]] = {}
        for node in subtree(init):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                    and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)
                    and _dotted(node.value.func).rsplit(".", 1)[-1] in kinds):
                embeddings.setdefault(node.targets[0].attr, (_dotted(node.value.func).rsplit(".", 1)[-1], node.lineno))
        if len(embeddings) < 2:
            continue
        taint = _Taint(cls, dict.fromkeys(embeddings, 0), stack, file)
        taint.body(forward.body, {}, 0, set())
        for line, args in taint.calls:
            if not args:
                continue
            hidden = args[0][1]
            if not hidden:
                continue
            for text, carried in args[1:]:
                extra = sorted(t for t in carried - hidden if tensors is None
                               or any(n == f"{t}.weight" or n.endswith(f".{t}.weight") for n in tensors))
                if extra:
                    table = extra[0]
                    return LayerInput(cls.name, table, embeddings[table][0], f"{file}:{embeddings[table][1]}",
                                      min(hidden), f"{file}:{line}", text)
    return None


# ---------------------------------------------------------------------------------------------------------------
# The form the port computes, read from what the code computes.
#
# The model's forward (its own methods inlined) and the decoder layer's forward are evaluated over symbolic terms:
# a module call is a term naming the module and its kind (an embedding lookup, a linear map, a norm, an
# activation), arithmetic with numbers the code computes from config.json is kept as constant factors, reshapes
# are recorded with their last two sizes and slices with the loop's layer index. The per-layer input the layer
# call receives must then be, up to the order of sums and products and where the constants stand,
#
#     c2 * (norm_N(c1 * linear_M(h0)) + c_t * table_T(ids))        sliced per layer: [..., i, :] of [L, P]
#
# (h0 the hidden states the stack starts from), and the layer must add to what its residual adds leave
#
#     norm_Q(linear_D(act(linear_G(r)) * per_layer_input))         (r that sum)
#
# before its layer scalar, if any: vLLM's Gemma 4 (and Gemma 3n's) per-layer embeddings. Anything else is refused
# naming what differs.


class Refused(Exception):
    """Per-layer input embeddings computed otherwise than the port computes them: what differs, with file:line."""


@dataclass(frozen=True)
class Const:
    value: float
    expr: str | None  # an expression over `config` (plain reads and arithmetic), or None where it is a literal


@dataclass(frozen=True)
class PerLayerForm:
    """What the port needs of per-layer input embeddings read from the code (all module names as the checkpoint
    holds them: the first three under the base model, the last three inside each decoder layer)."""

    found: LayerInput
    table: str
    model_projection: str
    projection_norm: str
    gate: str
    projection: str
    post_norm: str
    table_scale: Const
    model_scale: Const
    input_scale: Const
    act: str  # transformers' activation name (ACT2FN's key)
    act_expr: str | None  # config.K where the code reads it from config.json
    evidence: str  # FILE:LINE of the model's combination and of the layer's use


def _num(node, config: dict, selfvals: dict, env: dict | None = None) -> Const | None:
    """A number the code computes from literals, config.json's values and self's numbers, with its expression over
    `config` (None where a literal will do); None where the code computes something else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return Const(float(node.value), repr(node.value))
    if isinstance(node, ast.Name) and env is not None and isinstance(env.get(node.id), Const):
        return env[node.id]
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        if base in ("config", "self.config"):
            value = config.get(node.attr)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and dataflow_identifier(node.attr):
                return Const(float(value), f"config.{node.attr}")
            return None
        if base == "self" and isinstance(selfvals.get(node.attr), Const):
            return selfvals[node.attr]
        return None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _num(node.operand, config, selfvals, env)
        return None if inner is None else Const(-inner.value, f"-{_wrap(inner.expr)}")
    if isinstance(node, ast.BinOp):
        a, b = _num(node.left, config, selfvals, env), _num(node.right, config, selfvals, env)
        if a is None or b is None:
            return None
        ops = {ast.Add: ("+", lambda x, y: x + y), ast.Sub: ("-", lambda x, y: x - y),
               ast.Mult: ("*", lambda x, y: x * y), ast.Div: ("/", lambda x, y: x / y),
               ast.Pow: ("**", lambda x, y: x ** y)}
        op = ops.get(type(node.op))
        if op is None:
            return None
        try:
            value = float(op[1](a.value, b.value))
        except (ZeroDivisionError, OverflowError, ValueError, TypeError):
            return None
        return Const(value, f"{_wrap(a.expr)} {op[0]} {_wrap(b.expr)}")
    if isinstance(node, ast.Call) and node.args:
        name = _dotted(node.func).rsplit(".", 1)[-1]
        inner = _num(node.args[0], config, selfvals, env)
        if inner is None:
            return None
        if name in ("tensor", "Buffer", "Parameter", "float", "as_tensor", "scalar_tensor"):
            return inner
        if name == "sqrt" and inner.value >= 0:
            return Const(inner.value ** 0.5, f"{_wrap(inner.expr)} ** 0.5")
        if name == "rsqrt" and inner.value > 0:
            return Const(inner.value ** -0.5, f"{_wrap(inner.expr)} ** -0.5")
    return None


def _wrap(expr: str) -> str:
    """expr as an operand: bare where it is a name, a dotted read or a non-negative number."""
    return expr if all(c.isalnum() or c in "._" for c in expr) else f"({expr})"


def dataflow_identifier(name: str) -> bool:
    return name.isidentifier() and not name.startswith("_")


def _kinds(cls: ast.ClassDef, classes: dict, embeds: set[str]) -> dict[str, tuple[str, ast.Call]]:
    """self.<attr> -> (kind, constructor call) for the modules __init__ builds: embedding, linear, norm, act."""
    out = {}
    init = _method(cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self"):
            continue
        attr, value = node.targets[0].attr, node.value
        if isinstance(value, ast.Subscript) and _dotted(value.value) in ("ACT2FN", "transformers.activations.ACT2FN"):
            out.setdefault(attr, ("act", value))
            continue
        if not isinstance(value, ast.Call):
            continue
        name = _dotted(value.func).rsplit(".", 1)[-1]
        if name in ("get_activation",):
            out.setdefault(attr, ("act", value))
        elif name in embeds:
            out.setdefault(attr, ("embed", value))
        elif name.endswith("Linear"):
            out.setdefault(attr, ("linear", value))
        elif "Norm" in name:
            out.setdefault(attr, ("norm", value))
        else:
            out.setdefault(attr, ("module", value))
    return out


def _self_numbers(cls: ast.ClassDef, config: dict, bound: dict | None = None) -> dict[str, Const]:
    """self.<attr> = <number> in __init__ (in order: a later one may read an earlier one), with the constructor's
    parameters bound to numbers where `bound` gives them."""
    vals: dict = {}
    init = _method(cls, "__init__")
    env = dict(bound or {})
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self"):
            found = _num(node.value, config, vals, env)
            if found is not None:
                vals.setdefault(node.targets[0].attr, found)
    return vals


class _Sym:
    """Symbolic evaluation of one class's forward (its own methods inlined) over terms:
    ("param", name), ("const", Const), ("lookup", attr, arg), ("linear", attr, arg), ("norm", attr, arg),
    ("act", attr, arg), ("module", attr, args), ("mul", a, b), ("add", a, b), ("reshape", x, dims),
    ("slice", x, index_text, where), ("none",), ("opaque", text)."""

    def __init__(self, cls: ast.ClassDef, file: str, sources: dict, config: dict, embeds: set[str],
                 stack: str | None = None):
        self.cls, self.file, self.sources, self.config, self.stack = cls, file, sources, config, stack
        self.classes = {c.name: c for _f, tree in _parsed(sources) for c in subtree(tree) if isinstance(c, ast.ClassDef)}
        self.kinds = _kinds(cls, self.classes, embeds)
        self.numbers = _self_numbers(cls, config)
        self.calls: list[tuple[int, list, dict]] = []  # layer calls: line, positional terms, keyword terms
        self.loop_index: str | None = None

    # --- expressions
    def num(self, node, env):
        consts = {k: v[1] for k, v in env.items() if isinstance(v, tuple) and v[0] == "const"}
        return _num(node, self.config, self.numbers, consts)

    def expr(self, node, env, depth=0):
        if node is None:
            return ("none",)
        if isinstance(node, ast.Constant) and node.value is None:
            return ("none",)
        number = self.num(node, env)
        if number is not None:
            return ("const", number)
        if isinstance(node, ast.Name):
            return env.get(node.id, ("opaque", node.id))
        if isinstance(node, ast.IfExp):
            test = self.decide(node.test, env)
            if test is None and isinstance(node.orelse, ast.Constant) and node.orelse.value is None:
                test = True
            if test is None:
                return ("opaque", ast.unparse(node))
            return self.expr(node.body if test else node.orelse, env, depth)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.Add, ast.Div)):
            a, b = self.expr(node.left, env, depth), self.expr(node.right, env, depth)
            if isinstance(node.op, ast.Mult):
                return ("mul", a, b)
            if isinstance(node.op, ast.Add):
                return ("add", a, b)
            if b[0] == "const" and b[1].value:
                return ("mul", a, ("const", Const(1.0 / b[1].value, f"1 / {_wrap(b[1].expr)}")))
            return ("opaque", ast.unparse(node))
        if isinstance(node, ast.Subscript):
            base = self.expr(node.value, env, depth)
            return ("slice", base, ast.unparse(node.slice), self._index_at(node.slice), node.lineno)
        if isinstance(node, ast.Attribute):
            if _dotted(node.value) == "self":
                return ("attr", node.attr)
            return ("opaque", ast.unparse(node))
        if isinstance(node, ast.Call):
            return self.call(node, env, depth)
        return ("opaque", ast.unparse(node))

    def _index_at(self, index) -> int | None:
        """2 where the loop's layer index selects the layer axis of [batch, seq, layers, width] (the model's forward
        takes [batch, seq] token ids) and every other index is a full slice: `[:, :, i, :]`, `[:, :, i]`,
        `[..., i, :]`; None otherwise."""
        elts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
        at = [k for k, e in enumerate(elts) if isinstance(e, ast.Name) and e.id == self.loop_index]
        ellipsis = [k for k, e in enumerate(elts) if isinstance(e, ast.Constant) and e.value is Ellipsis]
        if len(at) != 1 or len(ellipsis) > 1:
            return None
        full = all(k == at[0] or k in ellipsis or (isinstance(e, ast.Slice) and e.lower is None and e.upper is None
                                                   and e.step is None) for k, e in enumerate(elts))
        if not full:
            return None
        if ellipsis and ellipsis[0] < at[0]:
            return 2 if len(elts) - at[0] == 2 else None
        return 2 if at[0] == 2 and not ellipsis and len(elts) <= 4 else None

    def call(self, node: ast.Call, env, depth):
        func = node.func
        args = [self.expr(a, env, depth) for a in node.args]
        if isinstance(func, ast.Attribute) and _dotted(func.value) == "self":
            kind = self.kinds.get(func.attr)
            arg = args[0] if args else ("none",)
            if kind is not None and kind[0] == "embed":
                return self.embedding(func.attr, kind[1], arg)
            if kind is not None and kind[0] in ("linear", "norm", "act"):
                return (kind[0], func.attr, arg)
            if kind is not None:
                return ("module", func.attr, tuple(args))
            method = _method(self.cls, func.attr)
            if method is not None and depth < DEPTH:
                return self.inline(method, node, env, depth + 1)
            return ("opaque", ast.unparse(node))
        if isinstance(func, ast.Attribute):
            base = self.expr(func.value, env, depth)
            if func.attr in ("reshape", "view", "unflatten"):
                dims = node.args[1] if func.attr == "unflatten" and len(node.args) > 1 else None
                dims = list(dims.elts) if isinstance(dims, (ast.Tuple, ast.List)) else (
                    list(node.args) if func.attr != "unflatten" else [])
                sizes = tuple(self._size(d, env) for d in dims[-2:])
                return ("reshape", base, sizes)
            if func.attr in ("to", "type_as", "contiguous", "float", "type"):
                return base
            return ("opaque", ast.unparse(node))
        return ("opaque", ast.unparse(node))

    def _size(self, node, env):
        if isinstance(node, ast.Call) and _dotted(node.func) == "len" and node.args:
            inner = node.args[0]
            if (isinstance(inner, ast.Attribute) and inner.attr == self.stack and _dotted(inner.value) == "self"
                    or isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Attribute)
                    and inner.value.attr == self.stack):
                layers = self.config.get("num_hidden_layers")
                return float(layers) if isinstance(layers, int) else None
        found = self.num(node, env)
        return None if found is None else found.value

    def embedding(self, attr, ctor: ast.Call, arg):
        """An embedding module's output: its lookup, times the factor its class's forward multiplies by."""
        name = _dotted(ctor.func).rsplit(".", 1)[-1]
        lookup = ("lookup", attr, arg)
        cls = self.classes.get(name)
        forward = _method(cls, "forward") if cls is not None else None
        if forward is None:
            return lookup  # nn.Embedding, or a subclass that keeps its forward
        # Bind the constructor's arguments to the class's __init__ parameters (numbers only).
        bound = {}
        init = _method(cls, "__init__")
        if init is not None:
            params = [a for a in [*init.args.posonlyargs, *init.args.args] if a.arg != "self"]
            defaults = dict(zip([a.arg for a in params][len(params) - len(init.args.defaults):], init.args.defaults))
            for p, a in zip(params, ctor.args):
                bound[p.arg] = a
            for k in ctor.keywords:
                if k.arg is not None:
                    bound[k.arg] = k.value
            for p in params:
                bound.setdefault(p.arg, defaults.get(p.arg))
        consts = {k: c for k, v in bound.items() if v is not None
                  and (c := _num(v, self.config, self.numbers, {})) is not None}
        inner = _Sym(cls, self.file, self.sources, self.config, set())
        inner.numbers = _self_numbers(cls, self.config, consts)
        param = [a.arg for a in forward.args.args if a.arg != "self"]
        env = {param[0]: ("param", "__ids__")} if param else {}
        out = inner.body(forward.body, env, 1)
        # super().forward(ids), the parent's lookup of the ids themselves, stands for the table's lookup.
        parent = ("opaque", f"super().forward({param[0]})") if param else None
        return _replace(out, ("param", "__ids__"), arg, parent, lookup)

    def inline(self, method, call: ast.Call, env, depth):
        params = [a.arg for a in [*method.args.posonlyargs, *method.args.args] if a.arg != "self"]
        defaults = dict(zip(params[len(params) - len(method.args.defaults):], method.args.defaults))
        inner = {p: self.expr(d, env, depth) for p, d in defaults.items()}
        inner.update({p: self.expr(a, env, depth) for p, a in zip(params, call.args)})
        for k in call.keywords:
            if k.arg is not None:
                inner[k.arg] = self.expr(k.value, env, depth)
        return self.body(method.body, inner, depth)

    # --- statements
    def decide(self, test, env) -> bool | None:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.decide(test.operand, env)
            return None if inner is None else not inner
        if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.comparators[0], ast.Constant) \
                and test.comparators[0].value is None and isinstance(test.ops[0], (ast.Is, ast.IsNot)):
            value = self.expr(test.left, env)
            if value[0] == "opaque":
                return None
            is_none = value == ("none",)
            return is_none if isinstance(test.ops[0], ast.Is) else not is_none
        value = self.num(test, env)
        if value is not None:
            return bool(value.value)
        if isinstance(test, ast.Attribute) and _dotted(test.value) in ("config", "self.config", "self"):
            key = test.attr
            if _dotted(test.value) == "self":
                init = _method(self.cls, "__init__")
                for node in subtree(init) if init is not None else ():
                    if (isinstance(node, ast.Assign) and len(node.targets) == 1
                            and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == key
                            and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Attribute)
                            and _dotted(node.value.value) in ("config", "self.config")):
                        key = node.value.attr
                        break
                else:
                    return None
            if key in self.config:
                return bool(self.config[key])
        return None

    def body(self, stmts, env, depth, returns=True):
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Expr, ast.Pass,
                                 ast.Assert, ast.Raise)):
                if isinstance(stmt, ast.Expr):
                    self._record(stmt, env, depth)
                continue
            if isinstance(stmt, ast.Return):
                self._record(stmt, env, depth)
                return self.expr(stmt.value, env, depth)
            if isinstance(stmt, ast.If):
                test = self.decide(stmt.test, env)
                raises = stmt.body and isinstance(stmt.body[-1], ast.Raise)
                branch = stmt.orelse if test is False or (test is None and raises) else stmt.body
                if test is None and not raises and stmt.orelse:
                    return ("opaque", f"if {ast.unparse(stmt.test)}")
                out = self.body(branch, env, depth)
                if out is not None:
                    return out
                continue
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                out = self.body(stmt.body, env, depth)
                if out is not None:
                    return out
                continue
            if isinstance(stmt, (ast.For, ast.AsyncFor)):
                over_stack = self.stack is not None and any(
                    isinstance(n, ast.Attribute) and n.attr == self.stack and _dotted(n.value) == "self"
                    for n in ast.walk(stmt.iter))
                if over_stack:
                    names = [n.id for n in ast.walk(stmt.target) if isinstance(n, ast.Name)]
                    if isinstance(stmt.target, ast.Tuple) and names:  # for i, layer in enumerate(self.layers)
                        self.loop_index = names[0]
                        self.layer_vars = set(names[1:])
                    elif isinstance(stmt.iter, ast.Call) and _dotted(stmt.iter.func) == "range":
                        self.loop_index, self.layer_vars = names[0], set()
                    else:
                        self.loop_index, self.layer_vars = None, set(names)
                    out = self.body(stmt.body, env, depth)
                    if out is not None:
                        return out
                continue
            if isinstance(stmt, ast.Assign):
                self._record(stmt, env, depth)
                value = self.expr(stmt.value, env, depth)
                for target in stmt.targets:
                    if isinstance(target, ast.Name):
                        env[target.id] = value
                continue
            if isinstance(stmt, ast.AnnAssign) and stmt.value is not None and isinstance(stmt.target, ast.Name):
                env[stmt.target.id] = self.expr(stmt.value, env, depth)
                continue
            if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                op = {ast.Mult: "mul", ast.Add: "add"}.get(type(stmt.op))
                value = self.expr(stmt.value, env, depth)
                env[stmt.target.id] = (op, env.get(stmt.target.id, ("opaque", stmt.target.id)), value) if op else (
                    "opaque", ast.unparse(stmt))
                continue
        return None

    def _record(self, stmt, env, depth):
        if depth or self.stack is None:
            return
        for node in ast.walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            layer = (isinstance(func, ast.Name) and func.id in getattr(self, "layer_vars", set())) or (
                isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute)
                and func.value.attr == self.stack and _dotted(func.value.value) == "self")
            if layer:
                self.calls.append((node.lineno, [self.expr(a, env, depth) for a in node.args],
                                   {k.arg: self.expr(k.value, env, depth) for k in node.keywords if k.arg}))


def _replace(term, *pairs):
    """term with each (old, new) pair of subterms replaced."""
    table = dict(zip(pairs[::2], pairs[1::2]))
    if term in table:
        return table[term]
    if isinstance(term, tuple):
        return tuple(_replace(t, *pairs) if isinstance(t, tuple) else t for t in term)
    return term


def _factors(term) -> tuple[Const, list]:
    """A product's constant factor (value and expression) and its other factors."""
    if term[0] == "mul":
        ca, ra = _factors(term[1])
        cb, rb = _factors(term[2])
        expr = None if ca.expr is None or cb.expr is None else (
            cb.expr if ca.expr == "1.0" else ca.expr if cb.expr == "1.0" else f"{_wrap(ca.expr)} * {_wrap(cb.expr)}")
        return Const(ca.value * cb.value, expr), ra + rb
    if term[0] == "const":
        return term[1], []
    return Const(1.0, "1.0"), [term]


def _whole_layer_axis(index: str, layers, config: dict) -> bool:
    """Whether the index `[..., :N, :]` over a [layers, width] term's last two axes keeps all of it: N evaluates to the layers (Gemma-3n slices its table's lookup by
    config.num_hidden_layers, a no-op where the table holds exactly that many layers)."""
    inner = index[1:-1] if index.startswith("(") and index.endswith(")") else index
    try:
        node = ast.parse(f"x[{inner}]", mode="eval").body.slice
    except SyntaxError:
        return False
    elts = list(node.elts) if isinstance(node, ast.Tuple) else [node]
    if len(elts) != 3 or not (isinstance(elts[0], ast.Constant) and elts[0].value is Ellipsis):
        return False
    cut, rest = elts[1], elts[2]
    if not (isinstance(cut, ast.Slice) and cut.lower is None and cut.step is None and cut.upper is not None
            and isinstance(rest, ast.Slice) and rest.lower is None and rest.upper is None and rest.step is None):
        return False
    upper = _num(cut.upper, config, {})
    return upper is not None and isinstance(layers, int) and upper.value == float(layers)


def _strip(term, sizes, layers, width, problems, config=None):
    """term without its reshapes (each must end in [layers, width] sizes) and the slices that keep every layer of a
    term reshaped so, and with casts kept out."""
    if not isinstance(term, tuple) or not term:
        return term
    if term[0] == "slice" and config is not None and _whole_layer_axis(term[2], layers, config) and any(
            t[0] == "reshape" and t[2] == (float(layers), float(width)) for t in _subterms(term[1])):
        return _strip(term[1], sizes, layers, width, problems, config)
    if term[0] == "reshape":
        if term[2] != (float(layers), float(width)):
            problems.append(f"a reshape to {term[2]} (the port packs each token's per-layer inputs layer by layer, "
                            f"[{layers}, {width}])")
        return _strip(term[1], sizes, layers, width, problems, config)
    return tuple(_strip(t, sizes, layers, width, problems, config) if isinstance(t, tuple) else t for t in term)


def _show(term) -> str:
    if not isinstance(term, tuple):
        return str(term)
    if term[0] in ("linear", "norm", "act", "lookup"):
        return f"{term[1]}({_show(term[2])})"
    if term[0] == "mul":
        return f"{_show(term[1])} * {_show(term[2])}"
    if term[0] == "add":
        return f"({_show(term[1])} + {_show(term[2])})"
    if term[0] == "const":
        return f"{term[1].value:.6g}"
    if term[0] == "param":
        return term[1]
    if term[0] in ("slice", "reshape"):
        inner = _show(term[1])
        inner = inner if all(c.isalnum() or c in "._()" for c in inner) else f"({inner})"
        return f"{inner}[{term[2]}]" if term[0] == "slice" else f"{inner}.reshape(..)"
    return term[1] if len(term) > 1 and isinstance(term[1], str) else term[0]


def read(sources: dict, config: dict, tensors, stacked=None) -> PerLayerForm | None:
    """The per-layer input embeddings as the port computes them, read from the code; None where the model has none
    (per_layer_inputs); Refused naming what differs where it computes them otherwise. `stacked`: the AltUp form
    (scaffold.detect.altup.read) where the model stacks copies of the stream for its layers."""
    found = per_layer_inputs(sources, tensors)
    if found is None:
        return None
    file = found.call_where.rsplit(":", 1)[0]
    owner = next((c for f, c, _s in _stack_owners(sources) if c.name == found.model_cls), None)
    stack = next((s for f, c, s in _stack_owners(sources) if c.name == found.model_cls), None)
    layer = dataflow.layer_class(sources)
    if owner is None or layer is None:
        raise Refused(f"{found.short()}: the reader does not find the classes that compute it")
    layers, embeds = config.get("num_hidden_layers"), _embedding_classes(sources)
    model = _Sym(owner, file, sources, config, embeds, stack)
    model.body(_method(owner, "forward").body, _forward_env(_method(owner, "forward")), 0)
    line = int(found.call_where.rsplit(":", 1)[1])
    call = next(((args, kw) for at, args, kw in model.calls if at == line), None)
    if call is None or not call[0]:
        raise Refused(f"{found.short()}: the reader does not follow the layer call")
    args, keywords = call
    hidden = args[0]
    if stacked is not None:
        # Copies of the stream stacked for the layers (AltUp, scaffold.detect.altup: copy 0 is the embeddings): the
        # projection reads the embeddings the stream starts from.
        params = [a.arg for a in _method(owner, "forward").args.args if a.arg != "self"]
        kind = model.kinds.get(found.stream)
        if kind is None or kind[0] != "embed" or not params:
            raise Refused(f"{found.short()}: the reader does not find the embedding the stacked copies start from")
        hidden = model.embedding(found.stream, kind[1], ("param", params[0]))
    handed = [(i, t) for i, t in enumerate(args[1:], 1)] + [(k, t) for k, t in keywords.items()]
    side = [(where, t) for where, t in handed if _mentions(t, ("lookup", found.table))]
    where = found.call_where

    def refuse(what: str):
        raise Refused(f"per-layer input embeddings computed otherwise than the port computes them ({where}): {what}")

    if len(side) != 1:
        refuse(f"the reader finds a lookup of {found.table} in {len(side)} of the layer's arguments (the argument "
               f"{found.argument} is {_show(handed[0][1]) if len(handed) == 1 else 'not one'}); the port hands each "
               "layer one slice of one table's lookup of the token ids")
    argument, term = side[0]

    if term[0] != "slice" or term[3] != 2:
        refuse(f"the layer's input is {_show(term)}, not the slice [..., i, :] of one [layers, width] tensor per "
               "token")
    width = _table_width(found.table, tensors, layers)
    if width is None:
        refuse(f"{found.table}'s width is not num_hidden_layers x a per-layer width")
    problems: list[str] = []
    body = _strip(term[1], None, layers, width, problems, config)
    if problems:
        refuse(problems[0])
    scale, rest = _factors(body)
    if len(rest) != 1 or rest[0][0] != "add":
        refuse(f"the per-layer inputs are {_show(body)}, not a scaled sum of the table and a projection of the "
               "hidden states")
    parts = [_factors(rest[0][1]), _factors(rest[0][2])]
    table_part = next((p for p in parts if p[1] == [("lookup", found.table, _ids(p[1]))]), None)
    norm_part = next((p for p in parts if len(p[1]) == 1 and p[1][0][0] == "norm"), None)
    if table_part is None or norm_part is None or table_part is norm_part:
        refuse(f"the per-layer inputs are {_show(body)}, not c2 * (norm(c1 * linear(h)) + c * table(ids))")
    ids = table_part[1][0][2]
    if norm_part[0].value != 1.0:
        refuse("a factor outside the projection's norm")
    n_attr = norm_part[1][0][1]
    inner_scale, inner = _factors(norm_part[1][0][2])
    lin_c, lin_rest = _factors(inner[0][2]) if len(inner) == 1 and inner[0][0] == "linear" else (None, None)
    h_c, h_rest = _factors(hidden)
    if lin_rest is None or lin_rest != h_rest or not h_c.value:
        refuse(f"{n_attr} norms {_show(norm_part[1][0][2])}, not a linear map of the hidden states the first layer "
               "takes")
    if ids[0] != "param" or not any(_mentions(hidden, ("lookup", n, ids)) for n in (found.stream,)):
        refuse(f"{found.table} looks up {_show(ids)}, not the token ids the stream's embedding reads")
    m_attr = inner[0][1]
    if lin_c.value != h_c.value:  # a factor inside the linear map (no bias: it commutes) other than the stream's
        inner_scale = Const(inner_scale.value * lin_c.value / h_c.value, None)
    evidence = f"{where} ({found.model_cls}: {_show(body)})"
    # The layer's side (with stacked copies, the roles the AltUp reading followed by their values).
    if stacked is not None:
        layer_form = _altup_use(layer, sources, config, stacked)
    else:
        layer_form = _layer_use(layer, sources, config, embeds, argument, width)
    # The port builds both norms as the layers' norms: the code must build them so (class and arguments).
    layer_sym = _Sym(layer[1], layer[0], sources, config, embeds)
    built = {attr: _built(k[1]) for attr, k in layer_sym.kinds.items() if k[0] == "norm"}
    wanted = built.get(layer_form[2])
    others = {b for a, b in built.items() if a != layer_form[2]}
    projection_norm = _built(model.kinds[n_attr][1])
    if others != {wanted} or projection_norm != wanted:
        refuse(f"the per-layer norms ({n_attr}: {projection_norm[0]}, {layer_form[2]}: {wanted and wanted[0]}) are "
               f"not built as the layer's norms are ({', '.join(sorted({b[0] for b in others}))})")
    return PerLayerForm(found, found.table, m_attr, n_attr, *layer_form[:3], table_scale=table_part[0],
                        model_scale=inner_scale, input_scale=scale, act=layer_form[3], act_expr=layer_form[4],
                        evidence=f"{evidence}; {layer_form[5]}")


def _built(call: ast.Call) -> tuple[str, tuple[str, ...]]:
    """A module's class and the arguments it is built with but the first (its width)."""
    return (_dotted(call.func).rsplit(".", 1)[-1],
            tuple(ast.unparse(a) for a in call.args[1:]) + tuple(sorted(ast.unparse(k) for k in call.keywords)))


def _forward_env(forward: ast.FunctionDef) -> dict:
    """The model's forward called with the token ids (its first parameter) and nothing else: the other parameters
    defaulting to None are None."""
    params = [a for a in [*forward.args.posonlyargs, *forward.args.args] if a.arg != "self"]
    defaults = dict(zip([a.arg for a in params][len(params) - len(forward.args.defaults):], forward.args.defaults))
    env = {}
    for k, a in enumerate(params):
        default = defaults.get(a.arg)
        none = k > 0 and isinstance(default, ast.Constant) and default.value is None
        env[a.arg] = ("none",) if none else ("param", a.arg)
    return env


def _ids(rest):
    return rest[0][2] if len(rest) == 1 and rest[0][0] == "lookup" else None


def _mentions(term, needle) -> bool:
    if not isinstance(term, tuple):
        return False
    if term[:len(needle)] == needle:
        return True
    return any(_mentions(t, needle) for t in term if isinstance(t, tuple))


def _table_width(table: str, tensors, layers) -> int | None:
    shape = None
    for name in tensors or ():
        if name == f"{table}.weight" or name.endswith(f".{table}.weight"):
            info = tensors[name] if isinstance(tensors, dict) else None
            shape = getattr(info, "shape", info)
    if not shape or not isinstance(layers, int) or layers <= 0 or len(shape) != 2 or shape[1] % layers:
        return None
    return shape[1] // layers


def _layer_use(layer, sources, config, embeds, argument, width):
    """(gate, projection, post norm, activation, its config expression, evidence) of the decoder layer's use of its
    per-layer input: norm(projection(act(gate(r)) * x)) added to r, the sum its residual adds leave."""
    file, cls = layer[0], layer[1]
    forward = _method(cls, "forward")
    params = [a.arg for a in forward.args.args if a.arg != "self"]
    name = params[argument] if isinstance(argument, int) and argument < len(params) else argument
    where = f"{file}:{forward.lineno}"

    def refuse(what: str):
        raise Refused(f"per-layer input embeddings used otherwise than the port uses them ({cls.name}, {where}): "
                      f"{what}")

    if name not in params:
        refuse(f"the layer takes no parameter {name!r}")
    sym = _Sym(cls, file, sources, config, embeds)
    env = {p: ("param", p) for p in params}
    out = sym.body(forward.body, env, 0)
    if out is None:
        refuse("the reader does not follow what forward returns")
    pli = ("param", name)
    uses = _count(out, pli)
    if uses != 1:
        refuse(f"{name} reaches the output {uses} times")
    adds = [t for t in _subterms(out) if t[0] == "add" and (_mentions(t[1], pli) != _mentions(t[2], pli))]
    for add in adds:
        r, z = (add[1], add[2]) if not _mentions(add[1], pli) else (add[2], add[1])
        if z[0] == "norm" and z[2][0] == "linear" and z[2][2][0] == "mul":
            a, b = z[2][2][1], z[2][2][2]
            act = a if b == pli else b if a == pli else None
            if act is not None and act[0] == "act" and act[2][0] == "linear" and act[2][2] == r:
                gate, proj, post = act[2][1], z[2][1], z[1]
                key, act_name = _activation(cls, act[1], config)
                if act_name is None:
                    refuse(f"its gate's activation self.{act[1]} is not ACT2FN[...] of a name config.json gives")
                # What encloses the sum: nothing, or the layer's one-element scalar.
                top = out
                if top != add and not (top[0] == "mul" and add in (top[1], top[2])
                                       and {top[1], top[2]} - {add} <= {t for t in (top[1], top[2]) if t[0] == "attr"}):
                    refuse(f"what the layer returns is {_show(out)}, not its output plus the per-layer term "
                           "(times a scalar of its own)")
                return gate, proj, post, act_name, key, (
                    f"{where}: {post}({proj}({act[1]}({gate}(h)) * {name})) added to h ({cls.name})")
    refuse(f"{name} reaches the output as {_show(out)}, not as norm(linear(act(linear(h)) * {name})) added to h")


def _altup_use(layer, sources, config, form):
    """(gate, projection, post norm, activation, its config key, evidence) of the layer's per-layer input as the AltUp
    reading followed it: norm(proj(act(gate(y_a)) * x)) added to copies 1..."""
    roles = form.roles
    key, act_name = _activation(layer[1], roles["per_layer_input_act"], config)
    if act_name is None:
        raise Refused(f"per-layer input embeddings used otherwise than the port uses them ({layer[1].name}): its gate's "
                      f"activation self.{roles['per_layer_input_act']} is not ACT2FN[...] of a name config.json gives")
    evidence = (f"{layer[0]}:{layer[1].lineno}: {roles['per_layer_input_norm']}({roles['per_layer_input_proj']}("
                f"{roles['per_layer_input_act']}({roles['per_layer_input_gate']}(y)) * per_layer_input)) added to the "
                f"copies but the first ({layer[1].name}, read with AltUp)")
    return (roles["per_layer_input_gate"], roles["per_layer_input_proj"], roles["per_layer_input_norm"], act_name, key,
            evidence)


def _subterms(term):
    if isinstance(term, tuple) and term:
        yield term
        for t in term:
            if isinstance(t, tuple):
                yield from _subterms(t)


def _count(term, needle) -> int:
    if term == needle:
        return 1
    return sum(_count(t, needle) for t in term if isinstance(t, tuple)) if isinstance(term, tuple) else 0


def _activation(cls, attr, config):
    """(config key or None, transformers' activation name) of `self.<attr> = ACT2FN[...]` in __init__."""
    init = _method(cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == attr and isinstance(node.value, ast.Subscript)):
            key = node.value.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                return None, key.value
            if isinstance(key, ast.Attribute) and _dotted(key.value) in ("config", "self.config") \
                    and isinstance(config.get(key.attr), str):
                return key.attr, config[key.attr]
    return None, None
