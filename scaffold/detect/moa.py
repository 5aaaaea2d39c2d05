"""A mixture of attention heads (JetMoE's MoA), read from what the attention's code computes.

`forms.routed_attention` finds the form: an attention class builds a module whose router takes a top-k of a
projection's outputs for each token, and the attention's forward calls that module before the attention and on
its output. What the port computes (templates' routed_attention partial; studies/jetmoe_moa.py checks the design
against transformers' module):

- the router: a linear layer of the routed module's router class, its top-k taken over the raw logits and a softmax
  over the k chosen (JetMoeTopKGating's order); any other order is refused here naming its line;
- the queries: the call before the attention runs a 3-D tensor of the routed module ([experts, kv heads x head_dim,
  hidden]) for each chosen expert, giving k query groups per token, each as wide as the keys;
- keys and values: one projection of the attention's own, cut by `chunk(2)` (keys first), shared by the k groups;
  the forward tiles them with `repeat(1, top_k, 1, 1)`, so query head j * kv_heads + h reads KV head h; the port
  permutes its queries to vLLM's grouped order (head h * k + j) and its output back; a `repeat_interleave` (or
  anything else) is refused;
- the output: the call on the attention's output runs the other 3-D tensor ([experts, hidden, kv heads x
  head_dim]) for each chosen expert, weighted by its gate and summed, plus a 1-D bias of the routed module.

Only this layout of tensors is read (module weights `<routed>.<in>.weight`, `<routed>.<out>.weight`,
`<routed>.<router...>.weight`, `<routed>.<bias>`); another is refused by name (`Refused`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import codekeys, forms
from scaffold.detect.blocks import _method
from scaffold.detect.sourcecode import _dotted, subtree


class Refused(Exception):
    """A routed attention the port does not compute: the message names what and where."""


@dataclass(frozen=True)
class MoA:
    attr: str  # the routed module, inside the attention (experts)
    router: str  # its router's linear, inside the routed module (router.layer)
    q_bank: str  # the module whose [experts, kv x d, hidden] weight makes the queries (input_linear)
    o_bank: str  # the module whose [experts, hidden, kv x d] weight makes the output (output_linear)
    bias: str  # the routed module's 1-D bias added to the output (bias)
    kv_proj: str  # the attention's projection of keys and values (kv_proj)
    top_k: str  # the config expression of the experts per token (config.num_experts_per_tok)
    num_experts: int
    experts_expr: str  # the config expression of the experts (config.num_local_experts)
    evidence: str


def _constructor_arg(call: ast.Call, init: ast.FunctionDef, param: str) -> ast.AST | None:
    """The argument a call gives to __init__'s parameter `param` (keyword, or by position after self)."""
    for kw in call.keywords:
        if kw.arg == param:
            return kw.value
    names = [a.arg for a in init.args.args][1:]
    if param in names and names.index(param) < len(call.args):
        return call.args[names.index(param)]
    return None


def _config_behind(classes: dict, chain: list[str], node: ast.AST) -> str | None:
    """The config expression a value of the last class of `chain` (built by the one before it, and so on) comes
    from: within its __init__ (codekeys.config_expr), else through the parameter it was given by its builder."""
    if not chain:
        return None
    cls = classes[chain[-1]][1]
    init = _method(cls, "__init__")
    if init is None:
        return None
    found = codekeys.config_expr(node, init)
    if found is not None:
        return found[0]
    local = codekeys._assignments(init)
    while isinstance(node, ast.Attribute) and _dotted(node.value) == "self" and f"self.{node.attr}" in local:
        node = local[f"self.{node.attr}"]
    if not (isinstance(node, ast.Name) and node.id in [a.arg for a in init.args.args][1:]) or len(chain) < 2:
        return None
    builder = classes[chain[-2]][1]
    builder_init = _method(builder, "__init__")
    for call in (n for n in subtree(builder_init) if isinstance(n, ast.Call)):
        if _dotted(call.func).rsplit(".", 1)[-1] == chain[-1]:
            arg = _constructor_arg(call, init, node.id)
            return _config_behind(classes, chain[:-1], arg) if arg is not None else None
    return None


def _chain(classes: dict, start: str, target: str, depth: int = 0) -> list[str] | None:
    """The classes from `start` down to `target`, each built by the one before it."""
    if start == target:
        return [start]
    if depth > 3 or start not in classes:
        return None
    for inner, _line in forms._built(classes[start][1]).values():
        found = _chain(classes, inner, target, depth + 1)
        if found is not None:
            return [start, *found]
    return None


def _called_modules(cls: ast.ClassDef, method: str) -> list[str]:
    """self.X(...) calls in one method of a class (the modules it runs), in order."""
    func = _method(cls, method)
    if func is None:
        return []
    return list(dict.fromkeys(n.func.attr for n in subtree(func) if isinstance(n, ast.Call)
                              and isinstance(n.func, ast.Attribute) and _dotted(n.func.value) == "self"))


def read(sources: dict, config: dict, layer0: dict, attn: str) -> MoA | None:
    """The routed attention of the attention class whose module the checkpoint keeps at `attn` (layer 0's
    tensors `layer0`, names inside the layer), or None where the attention is not routed; `Refused` where it is,
    in a form the port does not compute."""
    classes = forms._classes(sources)
    for name, _file, cls, forward in forms.attention_forwards(sources):
        for attr, (inner, _line) in forms._built(cls).items():
            routed = forms._routes_to_experts(classes, inner)
            if routed is None or not any(r.startswith(f"{attn}.{attr}.") for r in layer0):
                continue
            calls = forms._routed_roles(forward, attr)
            return _read(sources, config, layer0, attn, classes, name, attr, inner, routed, calls)
    return None


def _read(sources, config, layer0, attn, classes, name, attr, inner, routed, calls) -> MoA:
    file, cls = classes[name]
    forward = _method(cls, "forward")
    router_cls, topk = routed
    where = f"{file}:{cls.lineno}"
    before = [c for c, role in calls if role == "before the attention"]
    after = [c for c, role in calls if role == "on the attention's output"]
    if len(before) != 1 or len(after) != 1 or not all(isinstance(c.func, ast.Attribute) for c in before + after):
        raise Refused(f"{name}.forward ({where}) calls self.{attr} {len(calls)} time(s), not once for the queries "
                      "(a method, before the attention) and once for the output (a method, on its output)")
    inner_cls = classes[inner][1]
    mine = {r[len(f"{attn}.{attr}."):]: info for r, info in layer0.items() if r.startswith(f"{attn}.{attr}.")}
    banks = {r.removesuffix(".weight"): info for r, info in mine.items() if len(info.shape) == 3
             and r.endswith(".weight") and r.count(".") == 1}

    def bank(call: ast.Call, role: str) -> str:
        used = [m for m in _called_modules(inner_cls, call.func.attr) if m in banks]
        if len(used) != 1:
            raise Refused(f"{inner}.{call.func.attr} ({classes[inner][0]}:{inner_cls.lineno}) makes the {role} "
                          f"with {len(used)} module(s) holding a 3-D weight [experts, out, in] "
                          f"({', '.join(sorted(banks)) or 'none'}), not one")
        return used[0]

    q_bank, o_bank = bank(before[0], "queries"), bank(after[0], "output")
    experts, q_rows, hidden = banks[q_bank].shape
    # The router: a linear layer inside the routed module, its weight [experts, hidden].
    routers = [r.removesuffix(".weight") for r, info in mine.items() if r.endswith(".weight")
               and list(info.shape) == [experts, hidden] and r.removesuffix(".weight") not in banks]
    biases = [r for r, info in mine.items() if "." not in r and list(info.shape) == [hidden]]
    if list(banks[o_bank].shape) != [experts, hidden, q_rows] or len(routers) != 1 or len(biases) > 1 \
            or set(mine) - {f"{q_bank}.weight", f"{o_bank}.weight", f"{routers[0]}.weight", *biases}:
        raise Refused(f"{inner} ({classes[inner][0]}:{inner_cls.lineno}) holds {', '.join(sorted(mine))}: not one "
                      "query bank [experts, rows, hidden], one output bank [experts, hidden, rows], one router "
                      "[experts, hidden] and a bias")
    if not biases:
        raise Refused(f"{inner} ({classes[inner][0]}:{inner_cls.lineno}) adds no bias to its output; the port "
                      "reads the form with one")
    if not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and _dotted(n.right) == f"self.{biases[0]}"
               for n in subtree(_method(inner_cls, after[0].func.attr))):
        raise Refused(f"{inner}.{after[0].func.attr} does not add self.{biases[0]} to its output")
    order = _router_order(classes, router_cls, topk)
    if order is not None:
        raise Refused(order)
    kv = _shared_kv(cls, forward, layer0, attn, q_rows, hidden, file)
    top_k = _config_behind(classes, _chain(classes, inner, router_cls) or [], _topk_k(topk))
    if top_k is None:
        raise Refused(f"{router_cls}'s top-k ({classes[router_cls][0]}:{topk.lineno}) takes a k no config key "
                      "gives")
    chain = _chain(classes, inner, router_cls) or []
    leaf = routers[0].rsplit(".", 1)[-1]
    router_init = _method(classes[router_cls][1], "__init__")
    built = next((n.value for n in subtree(router_init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and _dotted(n.targets[0]) == f"self.{leaf}" and isinstance(n.value, ast.Call)), None)
    width = built and (next((k.value for k in built.keywords if k.arg == "out_features"), None)
                       or (built.args[1] if len(built.args) > 1 else None))
    experts_expr = _config_behind(classes, chain, width) if width is not None else None
    if experts_expr is None:
        raise Refused(f"{router_cls}'s router ({classes[router_cls][0]}:{router_init.lineno}) is built "
                      f"{'without' if width is None else 'with'} a width no config key gives")
    evidence = (f"{name}.forward ({where}): queries from self.{attr}.{before[0].func.attr} "
                f"({file}:{before[0].lineno}, {inner}.{q_bank}), output from self.{attr}.{after[0].func.attr} "
                f"({file}:{after[0].lineno}, {inner}.{o_bank} plus {biases[0]}), routed by {router_cls}'s top-k "
                f"then softmax ({classes[router_cls][0]}:{topk.lineno}); keys and values from self.{kv}, tiled "
                "over the top-k groups")
    return MoA(attr, routers[0], q_bank, o_bank, biases[0], kv, top_k, experts, experts_expr, evidence)


def _topk_k(call: ast.Call) -> ast.AST:
    for kw in call.keywords:
        if kw.arg == "k":
            return kw.value
    return call.args[0] if isinstance(call.func, ast.Attribute) and _dotted(call.func.value) != "torch" \
        else call.args[1]


def _router_order(classes: dict, router_cls: str, topk: ast.Call) -> str | None:
    """Why the router's weights are not a softmax over the top-k of its raw logits (None where they are): the
    top-k's input a projection's output with casts only, and a softmax of the values it returns."""
    file, cls = classes[router_cls]
    func = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and topk in subtree(f))
    scored = topk.func.value if isinstance(topk.func, ast.Attribute) and _dotted(topk.func.value) != "torch" \
        else topk.args[0]
    local = codekeys._assignments(func)
    while isinstance(scored, ast.Name) and scored.id in local:
        scored = local[scored.id]
    calls = {forms._callee(n) for n in subtree(scored) if isinstance(n, ast.Call)}
    if calls & {"softmax", "sigmoid", "log_softmax", "exp"}:
        return (f"a router that scores before its top-k ({file}:{topk.lineno}: {forms._line(scored, 60)}): the "
                "port routes the mixture of attention heads by a softmax over the top-k of the raw logits")
    stmt = next(s for s in forms._statements(func.body) if topk in subtree(s))
    chosen = forms._chosen_indices(stmt, topk)
    values = stmt.targets[0].elts[0].id if isinstance(stmt, ast.Assign) and isinstance(
        stmt.targets[0], ast.Tuple) and isinstance(stmt.targets[0].elts[0], ast.Name) else None
    if values is None or chosen is None:
        return f"a router whose top-k ({file}:{topk.lineno}) is not read as (values, indices)"
    softmaxed = any(isinstance(n, ast.Call) and forms._callee(n) == "softmax"
                    and any(isinstance(a, ast.Name) and a.id == values
                            for a in (*n.args, *([n.func.value] if isinstance(n.func, ast.Attribute) else [])))
                    for n in subtree(func))
    divided = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in subtree(func))
    if not softmaxed or divided:
        return (f"a router whose weights are not a softmax over its top-k values ({file}:{topk.lineno}): the port "
                "routes the mixture of attention heads so")
    return None


def _shared_kv(cls: ast.ClassDef, forward: ast.FunctionDef, layer0: dict, attn: str, q_rows: int, hidden: int,
               file: str) -> str:
    """The attention's projection of keys and values: self.P(x).chunk(2, dim=-1) unpacked to (keys, values), its
    weight [2 x rows, hidden]; keys and values tiled with .repeat(1, k, 1, 1). Else Refused."""
    proj = None
    for stmt in forms._statements(forward.body):
        if (isinstance(stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Tuple) and len(stmt.targets[0].elts) == 2
                and isinstance(stmt.value, ast.Call) and forms._callee(stmt.value) == "chunk"
                and isinstance(stmt.value.func, ast.Attribute) and isinstance(stmt.value.func.value, ast.Call)
                and _dotted(stmt.value.func.value.func).startswith("self.")):
            args = stmt.value.args
            if args and isinstance(args[0], ast.Constant) and args[0].value == 2:
                proj = _dotted(stmt.value.func.value.func)[len("self."):]
                line = stmt.lineno
    if proj is None or list(layer0.get(f"{attn}.{proj}.weight", ()).shape if f"{attn}.{proj}.weight" in layer0
                            else []) != [2 * q_rows, hidden] or f"{attn}.{proj}.bias" in layer0:
        raise Refused(f"{cls.name}.forward ({file}:{forward.lineno}) does not take its keys and values from one "
                      f"projection without bias cut in two by chunk(2), {2 * q_rows} rows of {hidden}")
    repeats = [n for n in subtree(forward) if isinstance(n, ast.Call) and forms._callee(n) in ("repeat",
                                                                                              "repeat_interleave")]
    tiled = [n for n in repeats if forms._callee(n) == "repeat" and len(n.args) == 4
             and all(isinstance(a, ast.Constant) and a.value == 1 for i, a in enumerate(n.args) if i != 1)]
    if len(tiled) != 2 or len(repeats) != 2:
        raise Refused(f"{cls.name}.forward ({file}:{line}) does not tile its keys and values over the top-k query "
                      "groups with .repeat(1, k, 1, 1) (query head j * kv_heads + h reading KV head h): "
                      + (", ".join(f"line {n.lineno}: {forms._line(n, 50)}" for n in repeats) or "no repeat"))
    return proj
