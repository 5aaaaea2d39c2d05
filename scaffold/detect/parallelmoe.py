"""A mixture of experts beside the dense MLP in each decoder layer (Gemma 4's enable_moe_block): the layer runs its
dense MLP and routed experts of its own side by side and adds the two, whatever the modules are called.

Read from what the code computes, never from names:
- the layer's forward, evaluated over symbolic terms (layerinputs' reader, a tuple a module returns bound item by
  item): a sum whose one side is a module holding 3-D parameters (the experts) and whose other side is the dense
  MLP's output; each side's norms (the MLP's output norm, the experts' input and output norms), what the experts
  take (the residual stream the MLP's norm reads, normed or not) and what the router reads (the same stream, or
  the experts' normed input); the sum must stand where the dense MLP's output stood (under the MLP's post-norm, or
  added to the residual);
- the router's forward, interpreted over numbers (evaluate.py's interpreter: its __init__ run on config.json, its
  norm class's forward run, its linear and parameters given random values of the checkpoint's shapes) and compared
  with what the port computes: an RMS norm without weight, times a [hidden] scale and hidden ** -0.5 (each where
  the code has it), the projection to the experts, a softmax over every expert, the top k (config.json's k),
  renormalized where the code divides by their sum, each times a per-expert scale where the code has one (vLLM's
  Gemma 4 router);
- the experts' class by scaffold.detect.stacked (which half of the gate-and-up tensor is the gate, [out, in]
  storage), its activation from `ACT2FN[config.KEY]` with config.json's value.

Anything else is a reason naming the line, and the layer stays refused (scaffold.detect.forms).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from scaffold.detect import conditions, kvshare, layerinputs, stacked, window
from scaffold.detect.common import unsupported
from scaffold.detect.evaluate import (
    MODULES,
    VALUE_ERRORS,
    CannotEvaluate,
    Interpreter,
    Limits,
    Obj,
)
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree
from scaffold.spec import Source

SEED = 20260
TOKENS = 7


@dataclass(frozen=True)
class ParallelMoe:
    """What the layer computes beside its dense MLP, by the checkpoint's (the code's) attribute names."""

    experts: str  # the layer's attribute holding the experts' 3-D parameters
    router: str  # the layer's attribute of the router module
    dense: str  # the dense MLP's attribute
    dense_norm: str  # the norm over the dense MLP's output before the sum ("" none)
    input_norm: str  # the norm over the experts' input ("" none)
    output_norm: str  # the norm over the experts' output before the sum ("" none)
    router_input: str  # "residual" (the stream the MLP's norm reads) or "experts_input" (the experts' normed input)
    router_norm: str  # the router's weightless RMS norm ("" none)
    router_proj: str  # the router's linear to the experts
    router_scale: str  # the router's [hidden] parameter multiplying its normed input ("" none)
    router_root: bool  # the normed input times hidden_size ** -0.5
    expert_scale: str  # the router's [experts] parameter multiplying each chosen expert's weight ("" none)
    renormalize: bool  # the top-k weights divided by their sum
    gate_up: str  # the experts' gate-and-up parameter
    down: str  # the experts' down parameter
    up_first: bool  # the up half first in gate_up
    activation: str  # the experts' activation (config.json's value of the key ACT2FN reads)
    activation_key: str  # that key
    where: str  # FILE:LINE of the layer's forward
    router_where: str  # FILE:LINE of the router's forward
    experts_where: str  # FILE:LINE of the experts' class
    sum_norm: str = ""  # the norm over the sum (the dense MLP's post-norm in a plain layer; "" none)
    router_eps_key: str = ""  # the config key of the router norm's eps
    # The condition under which the layer's __init__ builds the experts, over config and layer_idx (Gemma 4's
    # config.enable_moe_block); "" where it builds them unconditionally. None: not followed.
    condition: str | None = ""
    top_k: int = 0  # the experts per token the router's top-k takes, run on config.json


# --------------------------------------------------------------------------------------------------- the layer
class _Terms(layerinputs._Sym):
    """layerinputs' symbolic reader, a module call's tuple bound item by item (`_, w, i = self.router(x)`)."""

    def body(self, stmts, env, depth, returns=True):
        for stmt in stmts:
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)
                    and isinstance(stmt.value, ast.Call)):
                value = self.expr(stmt.value, env, depth)
                for k, target in enumerate(stmt.targets[0].elts):
                    if isinstance(target, ast.Name):
                        env[target.id] = ("item", value, k)
                continue
            out = super().body([stmt], env, depth, returns)
            if out is not None:
                return out
        return None


def _bare(term):
    """The term without reshapes (the flattening to [tokens, hidden] and back)."""
    while isinstance(term, tuple) and term and term[0] == "reshape":
        term = term[1]
    return term


def _peel_norm(term) -> tuple[str, object]:
    term = _bare(term)
    if term[0] == "norm":
        return term[1], _bare(term[2])
    return "", term


def _walk(term, parent=None):
    yield term, parent
    if isinstance(term, tuple):
        for child in term[1:]:
            if isinstance(child, tuple):
                if child and isinstance(child[0], str):
                    yield from _walk(child, term)
                else:
                    for grandchild in child:
                        if isinstance(grandchild, tuple) and grandchild and isinstance(grandchild[0], str):
                            yield from _walk(grandchild, term)


def _three_d(cls: ast.ClassDef) -> list[str]:
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    out = []
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Call) and _dotted(node.value.func).endswith("Parameter")
                and node.value.args and isinstance(node.value.args[0], ast.Call)
                and len(node.value.args[0].args) == 3):
            out.append(node.targets[0].attr)
    return out


def build_condition(sources: dict, cls: ast.ClassDef, attr: str) -> str | None:
    """The test of the `if` blocks of the layer's __init__ around `self.<attr> = ...`, followed to the config and the
    layer's index (window.lift_from_layer: Gemma 4's `if self.enable_moe_block:` is `config.enable_moe_block`);
    "" where the assignment sits under no `if`; None where a test is not followed to them."""
    init = _method(cls, "__init__")
    if init is None:
        return ""

    def tests(body, above):
        for stmt in body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Attribute) and _dotted(t.value) == "self"
                                                    and t.attr == attr for t in stmt.targets):
                return above
            if isinstance(stmt, ast.If):
                found = tests(stmt.body, [*above, stmt.test])
                if found is None and stmt.orelse:
                    found = tests(stmt.orelse, [*above, ast.UnaryOp(ast.Not(), stmt.test)])
                if found is not None:
                    return found
        return None

    found = tests(init.body, [])
    if not found:
        return "" if found == [] else None
    test = found[0] if len(found) == 1 else ast.BoolOp(ast.And(), found)
    lifted = window.lift_from_layer(sources, None, test)
    if lifted is None or {n.id for n in ast.walk(lifted) if isinstance(n, ast.Name)} - {"config", "layer_idx"}:
        return None
    return ast.unparse(lifted)


def _built(cls: ast.ClassDef) -> dict[str, tuple[str, int]]:
    """self.X = Class(...) in __init__ (under any branch): X -> (Class, line)."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    out = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)):
            out.setdefault(node.targets[0].attr, (_dotted(node.value.func).rsplit(".", 1)[-1], node.lineno))
    return out


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name), None)


def read(sources: dict, config: dict, layer_cls: tuple[str, ast.ClassDef],
         tensors: dict | None) -> ParallelMoe | str | None:
    """The layer's experts beside its dense MLP (`layer_cls`: file and class of the decoder layer; `tensors`: layer
    0's tensors by their name inside the layer, shapes; None reads the layer's form alone, not the router), a reason
    naming the line where it computes otherwise, or None where no module holding 3-D parameters is summed with
    another module's output."""
    file, cls = layer_cls
    forward = _method(cls, "forward")
    if forward is None:
        return None
    classes = {name: fc for name, fc in _classes(sources).items()}
    built = _built(cls)
    experts = {a for a, (name, _l) in built.items() if name in classes and _three_d(classes[name][1])}
    if not experts:
        return None
    sym = _Terms(cls, file, sources, config, set())
    out = sym.body(forward.body, {a.arg: ("param", a.arg) for a in forward.args.args if a.arg != "self"}, 0)
    if out is None:
        return None
    where = f"{file}:{forward.lineno}"
    found = None
    for term, parent in _walk(out):
        if term[0] != "add":
            continue
        sides = [{t[1] for t, _p in _walk(side) if t[0] == "module"} for side in term[1:]]
        for k in (0, 1):
            other = sides[1 - k]
            called = _peel_norm(term[1 + k])[1]
            if called[0] == "module" and called[1] in experts and not other & experts and other:
                found = (term, parent, term[1 + k], term[2 - k], called[1])
                break
        if found:
            break
    if found is None:
        return None
    total, parent, expert_side, dense_side, attr = found
    # The dense side: [norm](dense(x)), x the MLP's input (the residual stream, through the MLP's own norm).
    dense_norm, dense_call = _peel_norm(dense_side)
    if dense_call[0] != "module" or len(dense_call[2]) != 1:
        return f"{cls.name}.forward ({where}) adds the experts' output to {_short(dense_side)}, not a module's output"
    dense = dense_call[1]
    _mlp_norm, residual = _peel_norm(dense_call[2][0])
    # The experts' side: [norm](experts(x', routing...)), x' the same stream, normed or not.
    output_norm, experts_call = _peel_norm(expert_side)
    if experts_call[0] != "module" or experts_call[1] != attr or len(experts_call[2]) != 3:
        return (f"{cls.name}.forward ({where}) adds {_short(expert_side)}: not the experts' output (self.{attr} "
                "called with its input and the router's two outputs) under at most one norm")
    input_norm, experts_in = _peel_norm(experts_call[2][0])
    if experts_in != residual:
        return (f"{cls.name}.forward ({where}): self.{attr} reads {_short(experts_in)}, not the residual stream the "
                f"dense MLP self.{dense} reads")
    routing = [_bare(a) for a in experts_call[2][1:]]
    if not all(r[0] == "item" and r[1][0] == "module" for r in routing) or routing[0][1] != routing[1][1]:
        return f"{cls.name}.forward ({where}): self.{attr} takes {', '.join(map(_short, routing))}, not a router's outputs"
    router_call = routing[0][1]
    router = router_call[1]
    if len(router_call[2]) != 1:
        return f"{cls.name}.forward ({where}): self.{router} is called with {len(router_call[2])} arguments"
    router_in = _bare(router_call[2][0])
    if router_in == residual:
        router_input = "residual"
    elif router_in == _bare(experts_call[2][0]) and input_norm:
        router_input = "experts_input"
    else:
        return (f"{cls.name}.forward ({where}): self.{router} reads {_short(router_in)}, neither the residual stream "
                "nor the experts' input")
    # The sum stands where the dense MLP's output stands in a plain layer: under its post-norm or added to the stream.
    if parent is None or not (parent[0] == "norm" and _bare(parent[2]) == total
                              or parent[0] == "add" and residual in (_bare(parent[1]), _bare(parent[2]))):
        return f"{cls.name}.forward ({where}): the sum of the dense MLP and the experts goes into {_short(parent)}"
    sum_norm = parent[1] if parent[0] == "norm" else ""
    condition = build_condition(sources, cls, attr)
    # The experts' class: which routing output is which, the halves, the activation.
    experts_cls_name = built[attr][0]
    efile, ecls = classes[experts_cls_name]
    experts_where = f"{efile}:{ecls.lineno}"
    eforward = _method(ecls, "forward")
    params = [a.arg for a in eforward.args.args if a.arg != "self"] if eforward is not None else []
    if len(params) != 3:
        return f"{experts_cls_name}.forward ({experts_where}) takes {params}, not (input, routing, routing)"
    weighted = _weighted_param(eforward, params[1:])
    if weighted is None:
        return (f"{experts_cls_name}.forward ({experts_where}): which of {params[1:]} weights the experts' output "
                "is not read (one parameter multiplying it expected)")
    weights_item = routing[params[1:].index(weighted)][2]
    index_item = routing[1 - params[1:].index(weighted)][2]
    try:
        code = stacked.experts_code(sources, tuple(_three_d(ecls)[:2]), config)
    except ValueError as exc:
        return f"{experts_cls_name} ({experts_where}): {exc}"
    if code is None or len(_three_d(ecls)) != 2:
        return f"{experts_cls_name} ({experts_where}) holds {_three_d(ecls)}, not a gate-and-up and a down tensor"
    if code.problem or code.in_out or code.interleaved or code.swigluoai or code.clamped_silu or code.added:
        what = code.problem or "experts stored [in, out], interleaved, clamped or biased"
        return (f"{experts_cls_name} ({experts_where}): {what}, "
                "which the port's experts beside the dense MLP do not compute")
    activation = _activation(ecls, config)
    if activation is None:
        return f"{experts_cls_name} ({experts_where}): no ACT2FN[config.KEY] the reader evaluates on config.json"
    if tensors is None:  # the layer's form alone (scaffold.detect.forms, before any tensor is read)
        return ParallelMoe(attr, router, dense, dense_norm, input_norm, output_norm, router_input, "", "", "", False,
                           "", False, code.gate_up, code.down, code.up_first, activation[1], activation[0], where, "",
                           experts_where, sum_norm, "", condition)
    # The router, over numbers.
    rname = built.get(router, ("", 0))[0]
    if rname not in classes:
        return f"{cls.name}.forward ({where}): the router self.{router} is not a class of the modeling code"
    found_router = _router(sources, config, classes, rname, router, tensors, weights_item, index_item)
    if isinstance(found_router, str):
        return found_router
    norm_attr, proj, scale, root, expert_scale, renormalize, router_where, eps_key, top_k = found_router
    return ParallelMoe(attr, router, dense, dense_norm, input_norm, output_norm, router_input, norm_attr, proj, scale,
                       root, expert_scale, renormalize, code.gate_up, code.down, code.up_first, activation[1],
                       activation[0], where, router_where, experts_where, sum_norm, eps_key, condition, top_k)


def _short(term) -> str:
    text = repr(term)
    return text if len(text) < 90 else text[:87] + "..."


def _weighted_param(forward: ast.FunctionDef, params: list[str]) -> str | None:
    """The one parameter of `params` the forward multiplies something by (the routing weights)."""
    used = set()
    for node in subtree(forward):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side in (node.left, node.right):
                for n in ast.walk(side):
                    if isinstance(n, ast.Name) and n.id in params:
                        used.add(n.id)
    return used.pop() if len(used) == 1 else None


def _activation(cls: ast.ClassDef, config: dict) -> tuple[str, str] | None:
    """(KEY, config.json's value) of `ACT2FN[config.KEY]` in the class's __init__."""
    init = _method(cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Subscript) and _dotted(node.value) == "ACT2FN"
                and isinstance(node.slice, ast.Attribute) and _dotted(node.slice.value) in ("config", "self.config")
                and isinstance(config.get(node.slice.attr), str)):
            return node.slice.attr, config[node.slice.attr]
    return None


# --------------------------------------------------------------------------------------------------- the router
class _Call:
    """A module of the router, called on an array."""

    def __init__(self, run):
        self.run = run


class _RouterRun(Interpreter):
    """evaluate.py's interpreter with the router's modules (_Call), torch.topk and torch.where-free indexing."""

    def __init__(self, functions, methods):
        super().__init__(functions, methods, Limits(depth=6))

    def attribute(self, node: ast.Attribute, env: dict):
        head = _dotted(node).split(".")[0]
        if node.attr == "topk" and head in (*MODULES, "functional") and head not in env:
            return ("library", "topk")
        if node.attr == "topk":
            owner = self.expr(node.value, env)
            if isinstance(owner, np.ndarray):
                return ("method", owner, "topk")
        return super().attribute(node, env)

    def apply(self, func, args, kwargs, node):
        if isinstance(func, _Call):
            return func.run(*args)
        return super().apply(func, args, kwargs, node)

    def library(self, name, args, kwargs, node):
        if name == "topk":
            return self.method(args[0], "topk", args[1:], kwargs, node)
        if name == "softmax":
            kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
        return super().library(name, args, kwargs, node)

    def method(self, owner, name, args, kwargs, node):
        if name == "topk" and isinstance(owner, np.ndarray):
            k = kwargs.get("k", args[0] if args else None)
            dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
            if not isinstance(k, int) or dim not in (-1, owner.ndim - 1):
                raise CannotEvaluate(f"line {node.lineno}: {ast.unparse(node)[:60]}")
            index = np.argsort(-owner, axis=-1, kind="stable")[..., :k]
            return np.take_along_axis(owner, index, axis=-1), index
        if name == "softmax" and isinstance(owner, np.ndarray):
            kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
        return super().method(owner, name, args, kwargs, node)

    def subscript(self, node, env):
        value = self.expr(node.value, env)
        if isinstance(value, np.ndarray):
            index = self.expr(node.slice, env) if not isinstance(node.slice, (ast.Slice, ast.Tuple)) else None
            if isinstance(index, np.ndarray) and index.dtype.kind == "i":
                return value[index]
        return super().subscript(node, env)


def _config_obj(config: dict) -> Obj:
    return kvshare._config_obj(config)


def _functions(sources: dict) -> dict:
    return {n.name: n for _f, tree in _parsed(sources) for n in tree.body if isinstance(n, ast.FunctionDef)}


def _instance(sources, config, classes, name: str, args: list, kwargs: dict) -> tuple[Obj, ast.ClassDef] | str:
    """`self` as the class's __init__ leaves it on these arguments (modules it builds as kvshare._Module)."""
    file, cls = classes[name]
    init = _method(cls, "__init__")
    me = Obj({}, "self")
    if init is None:
        return me, cls
    reader = kvshare._InitReader(_functions(sources))
    params = [a.arg for a in init.args.args][1:]
    defaults = dict(zip(params[len(params) - len(init.args.defaults):], init.args.defaults))
    env = {init.args.args[0].arg: me}
    for p, a in zip(params, args):
        env[p] = a
    env.update({k: v for k, v in kwargs.items() if k in params})
    for p in params:
        if p not in env:
            if p in defaults:
                env[p] = reader.evaluate(defaults[p], {})
            elif p in ("config", "cfg") or p.endswith("config"):
                env[p] = _config_obj(config)
            else:
                return f"{name}.__init__ ({file}:{init.lineno}): no value for its parameter {p}"
    try:
        reader.steps = 0
        reader.block(init.body, env)
    except (CannotEvaluate, *VALUE_ERRORS) as exc:
        return f"{name}.__init__ ({file}:{init.lineno}) is not followed ({exc})"
    me.env = env  # what the constructor calls of its modules read
    return me, cls


def _router(sources, config, classes, name, attr, tensors, weights_item, index_item):
    """(norm attr, proj attr, scale attr, root, per-expert scale attr, renormalize, FILE:LINE, eps key, k) of the router class
    `name` (the layer's self.`attr`), read by running its forward over numbers; else a reason."""
    file, cls = classes[name]
    where = f"{file}:{cls.lineno}"
    made = _instance(sources, config, classes, name, [_config_obj(config)], {})
    if isinstance(made, str):
        return made
    me, _ = made
    init = _method(cls, "__init__")
    forward = _method(cls, "forward")
    if forward is None or init is None:
        return f"{name} ({where}) has no forward"
    rng = np.random.default_rng(SEED)
    mine = {k[len(attr) + 1:]: v for k, v in tensors.items() if k.startswith(f"{attr}.")}
    hidden = config.get("hidden_size")
    modules = {a: v for a, v in me.attrs.items() if isinstance(v, kvshare._Module)}
    calls = {}
    roles = {"norm": "", "proj": "", "scale": "", "expert": ""}
    for a, module in modules.items():
        short = module.cls.rsplit(".", 1)[-1]
        if short in ("Parameter", "Buffer"):
            shape = mine.get(a)
            if shape is None:
                return f"{name}.__init__ ({file}:{module.line}) builds self.{a}, which the checkpoint does not hold"
            me.attrs[a] = rng.uniform(0.5, 1.5, size=tuple(shape))
            if len(shape) != 1:
                return f"{name} ({where}): self.{a} of shape {list(shape)}, not a vector"
        elif short == "Linear":
            shape = mine.get(f"{a}.weight")
            if shape is None or len(shape) != 2 or f"{a}.bias" in mine:
                return f"{name} ({where}): self.{a} is not a linear the checkpoint holds without a bias"
            weight = rng.normal(0, 0.3, size=tuple(shape))
            calls[a] = weight
            me.attrs[a] = _Call(lambda x, w=weight: x @ w.T)
            roles["proj"] = roles["proj"] and "several" or a
        elif short in classes:
            if any(k.startswith(f"{a}.") for k in mine):
                return f"{name} ({where}): self.{a} ({short}) holds tensors, not a norm without weight"
            ctor = next((n for n in subtree(init) if isinstance(n, ast.Assign) and n.lineno == module.line
                         and isinstance(n.value, ast.Call)), None)
            if ctor is None:
                return f"{name}.__init__ ({file}:{module.line}): the construction of self.{a} is not followed"
            reader = kvshare._InitReader(_functions(sources))
            try:
                args = [reader.evaluate(x, me.env) for x in ctor.value.args]
                kwargs = {k.arg: reader.evaluate(k.value, me.env) for k in ctor.value.keywords if k.arg}
            except (CannotEvaluate, *VALUE_ERRORS) as exc:
                return f"{name}.__init__ ({file}:{module.line}): self.{a}'s arguments are not followed ({exc})"
            inner = _instance(sources, config, classes, short, args, kwargs)
            if isinstance(inner, str):
                return inner
            nme, ncls = inner
            if any(isinstance(v, kvshare._Module) for v in nme.attrs.values()):
                return f"{name} ({where}): self.{a} ({short}) builds parameters or modules of its own"
            nforward = _method(ncls, "forward")
            methods = {f.name: f for f in ncls.body if isinstance(f, ast.FunctionDef)}

            def run(x, nforward=nforward, nme=nme, methods=methods):
                return _RouterRun(_functions(sources), methods).call_function(nforward, nme, [x])
            me.attrs[a] = _Call(run)
            roles["norm"] = roles["norm"] and "several" or a
        else:
            return f"{name} ({where}): self.{a} is a {module.cls}, which the reader does not run"
    if roles["proj"] in ("", "several") or roles["norm"] == "several":
        return f"{name} ({where}): not one linear to the experts (and at most one norm)"
    experts = calls[roles["proj"]].shape[0]
    vectors = {a: v for a, v in me.attrs.items() if isinstance(v, np.ndarray) and v.ndim == 1}
    scales = [a for a, v in vectors.items() if v.shape == (hidden,)]
    per_expert = [a for a, v in vectors.items() if v.shape == (experts,)]
    if len(scales) > 1 or len(per_expert) > 1 or len(vectors) != len(scales) + len(per_expert) or experts == hidden:
        return f"{name} ({where}): parameters {sorted(vectors)} the reader cannot tell apart"
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    x = rng.normal(0, 1e-3, size=(TOKENS, hidden))  # small: the norm's eps counts
    try:
        got = _RouterRun(_functions(sources), methods).call_function(forward, me, [x])
    except CannotEvaluate as exc:
        return f"{name}.forward ({file}:{forward.lineno}) is not followed: {exc}"
    if not isinstance(got, tuple) or max(weights_item, index_item) >= len(got):
        return f"{name}.forward ({file}:{forward.lineno}) returns no item {max(weights_item, index_item)}"
    weights, index = np.asarray(got[weights_item], dtype=np.float64), np.asarray(got[index_item])
    # The norm's eps: a config value whose key says eps (the one the port reads), tried in turn.
    eps_keys = [k for k, v in config.items() if "eps" in k and isinstance(v, float)] if roles["norm"] else [""]
    for eps_key in eps_keys:
        for root in (True, False):
            for renormalize in (True, False):
                want_w, want_i = _reference(x, config[eps_key] if eps_key else None,
                                            vectors.get(scales[0]) if scales else None,
                                            hidden ** -0.5 if root else 1.0, calls[roles["proj"]],
                                            vectors.get(per_expert[0]) if per_expert else None, renormalize,
                                            index.shape[-1])
                if index.shape == want_i.shape and _same(weights, index, want_w, want_i):
                    return (roles["norm"], roles["proj"], scales[0] if scales else "", root,
                            per_expert[0] if per_expert else "", renormalize, f"{file}:{forward.lineno}", eps_key,
                            int(index.shape[-1]))
    return (f"{name}.forward ({file}:{forward.lineno}) computes routing weights other than a softmax top-k of "
            "proj(norm(x) * scale * hidden ** -0.5), renormalized or not, times a per-expert scale (vLLM's Gemma 4 "
            "router), on sample inputs")


def _reference(x, eps, scale, root, proj, per_expert, renormalize, k):
    h = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) if eps is not None else x
    if scale is not None:
        h = h * scale
    h = h * root
    logits = h @ proj.T
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    index = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    w = np.take_along_axis(p, index, axis=-1)
    if renormalize:
        w = w / w.sum(-1, keepdims=True)
    if per_expert is not None:
        w = w * per_expert[index]
    return w, index


def _same(weights, index, want_w, want_i) -> bool:
    if index.dtype.kind not in "iu":
        return False
    order, want_order = np.argsort(index, axis=-1), np.argsort(want_i, axis=-1)
    if not np.array_equal(np.take_along_axis(index, order, -1), np.take_along_axis(want_i, want_order, -1)):
        return False
    return bool(np.allclose(np.take_along_axis(weights, order, -1), np.take_along_axis(want_w, want_order, -1),
                            rtol=1e-9, atol=1e-12))


# --------------------------------------------------------------------------------------------------- the spec
def _config_key(sources: dict, classes: list[str], config: dict, value: int, prefer: tuple[str, ...]) -> str | None:
    """The config key holding `value` that the classes' code reads (`config.KEY`), preferring `prefer`'s order."""
    read = set()
    all_classes = _classes(sources)
    for name in classes:
        if name in all_classes:
            for node in subtree(all_classes[name][1]):
                if isinstance(node, ast.Attribute) and _dotted(node.value) in ("config", "self.config"):
                    read.add(node.attr)
    keys = [k for k in read if config.get(k) == value and isinstance(config.get(k), int)
            and not isinstance(config.get(k), bool)]
    keys.sort(key=lambda k: (prefer.index(k) if k in prefer else len(prefer), k))
    return keys[0] if keys else None


def detect(ckpt, spec, names: dict, sources: dict, layer_cls, per_layer: dict) -> set[str]:
    """Set the parallel_moe_* fields where the decoder layer runs routed experts beside its dense MLP; return the
    modules (inside a layer) they claim. Raises UnsupportedArchitecture naming what the port does not compute."""
    if not sources or layer_cls is None:
        return set()
    where = ckpt.config_file
    layer0 = {k: tuple(v.shape) for k, v in per_layer[0].items()}
    found = read(sources, ckpt.config, layer_cls, layer0)
    if found is None:
        return set()
    if isinstance(found, str):
        raise unsupported(f"a mixture of experts beside the dense MLP in each decoder layer: {found}", where,
                          spec.model_type)
    if found.dense != names.get("mlp"):
        raise unsupported(f"a mixture of experts beside the dense MLP self.{found.dense} ({found.where}), where the "
                          f"port's MLP is {names.get('mlp')}", where, spec.model_type)
    if found.condition is None:
        raise unsupported(f"experts beside the dense MLP ({found.where}) built under a condition the reader does not "
                          "follow to the config and the layer's index", where, spec.model_type)
    if found.condition and not all(conditions.evaluate(ast.parse(found.condition, mode="eval").body, ckpt.config,
                                                       {"layer_idx": i}) for i in range(spec.num_layers)):
        raise unsupported(f"experts beside the dense MLP in some layers only (built where {found.condition}, "
                          f"{found.where})", where, spec.model_type)
    if found.up_first:
        raise unsupported(f"experts beside the dense MLP whose gate-and-up tensor holds the up half first "
                          f"({found.experts_where})", where, spec.model_type)
    if found.activation not in ("gelu_pytorch_tanh", "gelu_new", "silu", "gelu"):
        raise unsupported(f"experts beside the dense MLP with activation {found.activation!r} "
                          f"({found.experts_where}), which vLLM's FusedMoE does not compute", where, spec.model_type)
    gate_up = layer0.get(f"{found.experts}.{found.gate_up}")
    down = layer0.get(f"{found.experts}.{found.down}")
    if gate_up is None or down is None or len(gate_up) != 3 or len(down) != 3:
        raise unsupported(f"experts beside the dense MLP ({found.experts_where}) without the 3-D tensors "
                          f"{found.experts}.{found.gate_up} and {found.experts}.{found.down} in layer 0", where,
                          spec.model_type)
    experts, width = gate_up[0], gate_up[1] // 2
    hidden = spec.hidden_size
    top_k = found.top_k  # what the router's top-k took, run on config.json
    experts_cls = _built(layer_cls[1])[found.experts][0]
    router_cls = _built(layer_cls[1])[found.router][0]
    keys = {
        "parallel_moe_num_experts": (_config_key(sources, [experts_cls, router_cls, layer_cls[1].name], ckpt.config,
                                                 experts, ("num_experts",)), experts),
        "parallel_moe_intermediate_size": (_config_key(sources, [experts_cls], ckpt.config, width,
                                                       ("moe_intermediate_size",)), width),
        "parallel_moe_top_k": (_config_key(sources, [router_cls, layer_cls[1].name], ckpt.config, top_k,
                                           ("top_k_experts",)), top_k),
    }
    for field, (key, value) in keys.items():
        if key is None:
            raise unsupported(f"experts beside the dense MLP ({found.where}): no config key the code reads holds "
                              f"{field.removeprefix('parallel_moe_')} = {value}", where, spec.model_type)
        spec.set(field, int(value), Source("config", f"config.json {key}, read by the code", f"config.{key}"))
    shapes = {f"{found.experts}.{found.gate_up}": (experts, 2 * width, hidden),
              f"{found.experts}.{found.down}": (experts, hidden, width),
              f"{found.router}.{found.router_proj}.weight": (experts, hidden)}
    if found.router_scale:
        shapes[f"{found.router}.{found.router_scale}"] = (hidden,)
    if found.expert_scale:
        shapes[f"{found.router}.{found.expert_scale}"] = (experts,)
    for norm in (found.dense_norm, found.input_norm, found.output_norm):
        if norm:
            shapes[f"{norm}.weight"] = (hidden,)
    stack = f"{names['model']}.{names['layers']}"
    for layer, tensors in per_layer.items():
        for rest, shape in shapes.items():
            info = tensors.get(rest)
            if info is None or tuple(info.shape) != shape:
                raise unsupported(f"experts beside the dense MLP in every layer ({found.where}), where "
                                  f"{stack}.{layer}.{rest} is " + (f"{list(info.shape)}, not {list(shape)}" if info
                                                                   else "missing"), where, spec.model_type)
    evidence = Source("code", f"{found.where}: the layer adds self.{found.experts}'s output (routed by "
                              f"self.{found.router}) to its dense MLP self.{found.dense}'s")
    router = Source("code", f"{found.router_where}: read over numbers (softmax top-k of the projection of the normed, "
                            "scaled input, times a per-expert scale)")
    for field, value, source in (
            ("parallel_moe_experts", found.experts, evidence), ("parallel_moe_router", found.router, evidence),
            ("parallel_moe_dense_norm", found.dense_norm, evidence),
            ("parallel_moe_input_norm", found.input_norm, evidence),
            ("parallel_moe_output_norm", found.output_norm, evidence),
            ("parallel_moe_router_input", found.router_input, evidence),
            ("parallel_moe_router_norm", found.router_norm, router),
            ("parallel_moe_router_proj", found.router_proj, router),
            ("parallel_moe_router_scale", found.router_scale, router),
            ("parallel_moe_router_root", found.router_root, router),
            ("parallel_moe_expert_scale", found.expert_scale, router),
            ("parallel_moe_renormalize", found.renormalize, router),
            ("parallel_moe_gate_up", found.gate_up, Source("code", found.experts_where)),
            ("parallel_moe_down", found.down, Source("code", found.experts_where)),
            ("parallel_moe_activation", found.activation,
             Source("config", f"{found.experts_where}: ACT2FN[config.{found.activation_key}]",
                    f"config.{found.activation_key}"))):
        spec.set(field, value, source)
    spec.set("parallel_moe_condition", found.condition,
             Source("code", f"{found.where}: the layer's __init__ builds self.{found.experts} where "
                            f"{found.condition}; the port evaluates it on the config it serves", found.condition)
             if found.condition else Source("code", f"{found.where}: built in every layer"))
    if found.router_norm:
        spec.set("parallel_moe_router_eps", float(ckpt.config[found.router_eps_key]),
                 Source("config", f"config.json {found.router_eps_key} (the router norm's, read over numbers)",
                        f"config.{found.router_eps_key}"))
    # The norm over the sum is the layer's MLP post-norm; the dense MLP's own output norm is the block's.
    names.pop("mlp_post_norm", None)
    if found.sum_norm:
        names["mlp_post_norm"] = found.sum_norm
    claimed = {found.experts, f"{found.experts}.{found.gate_up}", f"{found.experts}.{found.down}",
               f"{found.router}.{found.router_proj}", f"{found.router}"}
    claimed |= {n for n in (found.dense_norm, found.input_norm, found.output_norm) if n}
    return claimed
