"""A decoder layer's norm whose output is gated by a small MLP of that output (A.X-K2's AXK2GatedRMSNorm).

    y = self.norm(x)                                  # an RMS norm of its own
    return y * sigmoid(self.mlp(y))                   # self.mlp: fc2(silu(fc1(y))), hidden -> rank -> hidden

Read from what the code computes, not from names: the class the decoder layer builds at a norm's attribute whose
forward returns n(x) * act(m(n(x))) (latentgate.gated_output), the gate module's forward as down(act(up(x))) over
two bias-free linears, and the condition, if any, under which the layer builds the gated class rather than another
(A.X-K2 gates post_attention_layernorm only where `config.mlp_layer_types[layer_idx] == "sparse"`), followed to the
config and the layer's index as denselayers does for the MLP, and evaluated on config.json. What is not in this form
raises Refused naming the line. Read as text, never run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import codekeys, conditions, dataflow, latentgate, window
from scaffold.detect.denselayers import negated
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

GATE_ACTS = ("sigmoid",)
MLP_ACTS = ("silu", "relu", "tanh", "sigmoid")


class Refused(Exception):
    """A gated norm in another form than the port computes: the message names the line."""


@dataclass(frozen=True)
class GatedNorm:
    attrs: tuple[str, ...]        # the layer's norm attributes built as the gated class
    conditional: tuple[str, ...]  # those of them built so under a condition
    condition: str                # over config and layer_idx: where the conditional ones are gated; "" none
    layers: dict                  # attr -> the layers it is gated in (config.json evaluated)
    parts: tuple[str, str, str, str]  # the inner norm, the gate module, its up and down linears (code's names)
    mlp_act: str                  # the gate MLP's activation
    gate_act: str                 # the activation of the gate
    rank: str                     # the gate MLP's width, as the code writes it over config
    norm_class: str               # the class of the norm inside (the model's own plain norm)
    evidence: str                 # FILE:LINE and the form


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)


def _built(init: ast.FunctionDef | None) -> dict[str, ast.Call]:
    """self.<attr> -> the call __init__ builds it with (the last one)."""
    out = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and _dotted(node.targets[0]).startswith("self.")
                and isinstance(node.value, ast.Call)):
            out[_dotted(node.targets[0])[5:]] = node.value
    return out


def _choices(init: ast.FunctionDef) -> dict[str, list[tuple[str, ast.expr | None, bool, int]]]:
    """self.<attr> -> (class, condition or None, built when the condition is true, line) for every class __init__
    builds there, in a conditional expression's two branches or an if/else's."""
    out: dict[str, list] = {}
    for node in subtree(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and _dotted(node.targets[0]).startswith("self."):
            attr, value = _dotted(node.targets[0])[5:], node.value
            if isinstance(value, ast.IfExp):
                for call, truth in ((value.body, True), (value.orelse, False)):
                    if isinstance(call, ast.Call):
                        out.setdefault(attr, []).append((_dotted(call.func).rsplit(".", 1)[-1], value.test, truth,
                                                         node.lineno))
            elif isinstance(value, ast.Call):
                out.setdefault(attr, []).append((_dotted(value.func).rsplit(".", 1)[-1], None, True, node.lineno))
        elif isinstance(node, ast.If):
            for body, truth in ((node.body, True), (node.orelse, False)):
                for stmt in body:
                    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)
                            and _dotted(stmt.targets[0]).startswith("self.")):
                        out.setdefault(_dotted(stmt.targets[0])[5:], []).append(
                            (_dotted(stmt.value.func).rsplit(".", 1)[-1], node.test, truth, stmt.lineno))
    # An if/else's assignments were also walked as plain ones: keep the conditional reading where both exist.
    for attr, made in out.items():
        if any(c is not None for _n, c, _t, _l in made):
            out[attr] = [m for m in made if m[1] is not None]
    return out


def _bound(node: ast.expr, func: ast.FunctionDef | None, call: ast.Call | None) -> ast.expr:
    """`node`, a parameter of `func`, as the `call` that builds the class passes it; else `node`."""
    if not (isinstance(node, ast.Name) and func is not None and call is not None):
        return node
    params = [a.arg for a in func.args.args][1:]
    if node.id not in params:
        return node
    at = params.index(node.id)
    given = {k.arg: k.value for k in call.keywords if k.arg}
    return call.args[at] if at < len(call.args) else given.get(node.id, node)


def _mlp_form(out, file: str, cls: ast.ClassDef, x) -> tuple[str, str, str, ast.Call] | None:
    """(up, down, act, up's call) where `out` is down(act(up(x))), up and down bias-free nn.Linear of `cls`."""
    out = latentgate._strip(out)
    if not (isinstance(out, tuple) and out[0] == "mod" and isinstance(act := latentgate._strip(out[2]), tuple)
            and act[0] == "act" and isinstance(up := latentgate._strip(act[2]), tuple) and up[0] == "mod"
            and latentgate._strip(up[2]) == x):
        return None
    built = _built(_init(cls))
    for attr in (up[1], out[1]):
        call = built.get(attr)
        if call is None or _dotted(call.func).rsplit(".", 1)[-1] != "Linear":
            raise Refused(f"the gated norm's MLP in {cls.name} ({file}:{cls.lineno}) builds self.{attr} otherwise "
                          "than as an nn.Linear")
        bias = next((k.value for k in call.keywords if k.arg == "bias"), None)
        if not (isinstance(bias, ast.Constant) and bias.value is False):
            raise Refused(f"the gated norm's MLP in {cls.name} ({file}:{call.lineno}) builds self.{attr} with a "
                          "bias; the port's gate has none")
    if act[1] not in MLP_ACTS:
        raise Refused(f"the gated norm's MLP in {cls.name} ({file}:{act[3]}) applies {act[1]}")
    return up[1], out[1], act[1], built[up[1]]


def _width(up_call: ast.Call, chain: list[tuple[ast.FunctionDef | None, ast.Call | None]]) -> str | None:
    """The up linear's output width over config, its parameters followed through the calls that built each
    class (`chain`: innermost first, each __init__ with the call that built it)."""
    node = up_call.args[1] if len(up_call.args) > 1 else next(
        (k.value for k in up_call.keywords if k.arg == "out_features"), None)
    for func, call in chain:
        if node is None:
            return None
        found = codekeys.config_expr(node, func)
        if found is not None:
            return found[0]
        node = _bound(node, func, call)
    return None


def _model_norms(sources: dict, file: str, list_line: int) -> set[str]:
    """The classes the base model (the class whose __init__ builds the layer list at FILE:LIST_LINE) builds
    modules of."""
    tree = next((t for f, t in _parsed(sources) if f == file), None)
    for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)) if tree is not None else ():
        if cls.lineno <= list_line <= (cls.end_lineno or cls.lineno):
            return {_dotted(c.func).rsplit(".", 1)[-1] for c in _built(_init(cls)).values()}
    return set()


def read(sources: dict, config: dict, layers_attr: str | None, num_layers: int) -> GatedNorm | None:
    """The decoder layer's gated norms, or None where it builds none; Refused where one is in another form."""
    found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if found is None:
        return None
    file, layer, list_line = found
    init = _init(layer)
    if init is None:
        return None
    classes = _classes(sources)
    gated: dict[str, tuple] = {}  # class -> (file, inner, gate, act, evidence)
    attrs, conds, layers, parts, acts, evidence, conditional = [], set(), {}, set(), set(), [], []
    for attr, made in _choices(init).items():
        mine = []
        for name, cond, truth, line in made:
            if name not in classes:
                continue
            if name not in gated:
                norm_file, norm_cls = classes[name]
                form = latentgate.gated_output(norm_file, norm_cls)
                gated[name] = (norm_file, norm_cls, form) if form else None
            if gated[name]:
                mine.append((name, cond, truth, line))
        if not mine:
            continue
        if len(mine) != 1:
            raise Refused(f"{layer.name}.__init__ ({file}:{mine[0][3]}) builds self.{attr} as a gated norm in more "
                          "than one branch")
        name, cond, truth, line = mine[0]
        norm_file, norm_cls, form = gated[name]
        reader = latentgate._Reader(norm_file, norm_cls)
        out = latentgate._strip(reader.run(reader.methods["forward"], [("in",)]))
        y, gate = (out[1], out[2]) if latentgate._strip(out[2])[0] == "act" else (out[2], out[1])
        y, gate = latentgate._strip(y), latentgate._strip(gate)
        if gate[1] not in GATE_ACTS:
            raise Refused(f"{name}.forward ({norm_file}:{out[3]}) gates by {gate[1]}, not a sigmoid")
        built = _built(_init(norm_cls))
        norm_call = built.get(y[1])
        if norm_call is None:
            raise Refused(f"{name}.__init__ ({norm_file}:{norm_cls.lineno}) does not build self.{y[1]} as a module")
        layer_call = next((c for c in ast.walk(init) if isinstance(c, ast.Call)
                           and _dotted(c.func).rsplit(".", 1)[-1] == name), None)
        inline = _mlp_form(gate[2], norm_file, norm_cls, y)  # the gate's linears are the norm's own
        if inline is not None:
            up, down, mlp_act, up_call = inline
            gate_attr = ""
            rank = _width(up_call, [(_init(norm_cls), layer_call), (init, None)])
        else:
            inner_mod = latentgate._strip(gate[2])
            if not (isinstance(inner_mod, tuple) and inner_mod[0] == "mod"
                    and latentgate._strip(inner_mod[2]) == y):
                raise Refused(f"{name}.forward ({norm_file}:{out[3]}) gates the norm's output by something other "
                              "than a small MLP of that output (down(act(up(y))), its own linears or a module's)")
            gate_call = built.get(inner_mod[1])
            gate_name = _dotted(gate_call.func).rsplit(".", 1)[-1] if gate_call is not None else ""
            if gate_name not in classes:
                raise Refused(f"{name}.__init__ ({norm_file}:{norm_cls.lineno}) builds its gate self.{inner_mod[1]} "
                              "from code not in the modeling source")
            gate_file, gate_cls = classes[gate_name]
            reader_gate = latentgate._Reader(gate_file, gate_cls)
            forward = reader_gate.methods.get("forward")
            gate_form = _mlp_form(reader_gate.run(forward, [("in",)]), gate_file, gate_cls, ("in",)) \
                if forward else None
            if gate_form is None:
                raise Refused(f"the gated norm's MLP {gate_name} ({gate_file}:{gate_cls.lineno}) computes otherwise "
                              "than down(act(up(x))) over its own linears")
            up, down, mlp_act, up_call = gate_form
            gate_attr = inner_mod[1]
            rank = _width(up_call, [(_init(gate_cls), gate_call), (_init(norm_cls), layer_call), (init, None)])
        if rank is None:
            raise Refused(f"{name} ({norm_file}:{norm_cls.lineno}) builds its gate with a width that does not follow "
                          "from the config")
        inner_cls = _dotted(norm_call.func).rsplit(".", 1)[-1]
        # The inner norm must be the model's own plain norm (the port builds every norm of one kind): the class the
        # base model builds its final norm with, the one holding the layers.
        if inner_cls not in _model_norms(sources, file, list_line):
            raise Refused(f"{name}.__init__ ({norm_file}:{norm_call.lineno}) normalizes with {inner_cls}, not the "
                          "class the model builds its own final norm with")
        parts.add((y[1], gate_attr, up, down))
        acts.add((mlp_act, gate[1], rank, inner_cls))
        attrs.append(attr)
        if cond is None:
            layers[attr] = list(range(num_layers))
        else:
            expr = window.lift_from_layer(sources, layers_attr, cond)
            if expr is None or {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - window.READS:
                raise Refused(f"{layer.name}.__init__ ({file}:{line}) builds self.{attr} as {name} under "
                              f"`{ast.unparse(cond)}`, which does not follow from the config and the layer's index")
            if not truth:
                expr = negated(expr)
            truths = [conditions.evaluate(expr, config, {"layer_idx": i}) for i in range(num_layers)]
            if None in truths:
                raise Refused(f"{layer.name}.__init__ ({file}:{line}): config.json does not decide "
                              f"`{ast.unparse(cond)}` for every layer")
            conds.add(ast.unparse(expr))
            conditional.append(attr)
            layers[attr] = [i for i, t in enumerate(truths) if t]
        evidence.append(f"{file}:{line}: self.{attr} = {name}(...)")
        evidence_form = form
    if not attrs:
        return None
    if len(parts) != 1 or len(acts) != 1 or len(conds) > 1:
        raise Refused(f"{layer.name}.__init__ ({file}:{init.lineno}) builds gated norms of more than one form or "
                      "under more than one condition")
    return GatedNorm(tuple(attrs), tuple(conditional), next(iter(conds), ""), layers, next(iter(parts)),
                     *next(iter(acts)),
                     f"{evidence_form}; " + "; ".join(evidence))
