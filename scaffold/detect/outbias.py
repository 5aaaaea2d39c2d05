"""An output bias the attention holds as a parameter of its own and the decoder layer adds (GPT-NeoX-Japanese).

GPT-NeoX-Japanese's attention keeps its output projection without a bias and a separate parameter beside it,
on the last layer only,

    self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
    self.dense_bias = nn.Parameter(torch.zeros(config.hidden_size)) if use_bias else None
    ...
    return attn_output, attn_weights, self.dense_bias          # attn_output = self.dense(...)

and the decoder layer adds it to the projection's output before the residual,

    attn_output, attn_weights, attn_bias = self.attention(ln_out, ...)
    attn_output = bias_dropout_add(attn_output, bias=attn_bias..., residual=residual, ...)
    # def bias_dropout_add(x, bias, residual, ...): x = x + bias; out = dropout(x); out = residual + out

which is the output projection's bias. This reads that from the code (the parameter returned beside the
projection's output, added to it where the layer receives both, in the layer or in a function it hands both to),
and on which layers the parameter exists: its constructor condition followed up to the config and the layer's
index (`layer_idx == config.num_hidden_layers - 1`), as window.py follows a window's. The port gives those
layers' output projection a bias and loads the parameter into it. Read as text, never run.
"""

from __future__ import annotations

import ast

from scaffold.detect import conditions, dataflow, window
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import _dotted, _parsed, subtree


class OutputBias:
    def __init__(self, param: str, layers: list[int], expr: str, evidence: str):
        self.param, self.layers, self.expr, self.evidence = param, layers, expr, evidence


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _is_parameter(value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1] == "Parameter"


def _parameter_condition(init: ast.FunctionDef, param: str) -> tuple[ast.expr | None, int] | None:
    """(the condition under which __init__ makes self.PARAM an nn.Parameter, or None where it always does, line);
    None where it makes no such parameter or in a form this does not follow."""
    def assigns(stmt) -> ast.expr | None:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0]) == f"self.{param}"):
            return stmt.value
        return None

    for stmt in init.body:
        value = assigns(stmt)
        if isinstance(value, ast.Constant) and value.value is None:
            continue  # `self.b = None`, then `if COND: self.b = nn.Parameter(...)`
        if value is not None:
            if _is_parameter(value):
                return None, stmt.lineno
            if (isinstance(value, ast.IfExp) and _is_parameter(value.body) and isinstance(value.orelse, ast.Constant)
                    and value.orelse.value is None):
                return value.test, stmt.lineno
            return None
        if isinstance(stmt, ast.If) and not stmt.orelse:
            for inner in stmt.body:
                value = assigns(inner)
                if value is not None and _is_parameter(value):
                    return stmt.test, inner.lineno
    return None


def _o_proj_names(func: ast.FunctionDef, o_proj: str) -> set[str]:
    """The locals of `func` holding the output projection's result (`x = self.dense(x)`)."""
    names = set()
    for node in subtree(func):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and _dotted(node.value.func) == f"self.{o_proj}"):
            names.add(node.targets[0].id)
    return names


def _returned_positions(forward: ast.FunctionDef, param: str, o_proj: str) -> tuple[int, int, int] | None:
    """(index of the projection's output, index of self.PARAM, line) in the tuple every return hands back."""
    outs = _o_proj_names(forward, o_proj)
    found = set()
    for node in subtree(forward):
        if isinstance(node, ast.Return):
            if not isinstance(node.value, ast.Tuple):
                return None
            elts = node.value.elts
            at_param = [i for i, e in enumerate(elts) if _dotted(e) == f"self.{param}"]
            at_out = [i for i, e in enumerate(elts) if (isinstance(e, ast.Name) and e.id in outs)
                      or (isinstance(e, ast.Call) and _dotted(e.func) == f"self.{o_proj}")]
            if len(at_param) != 1 or len(at_out) != 1:
                return None
            found.add((at_out[0], at_param[0], node.lineno))
    return found.pop() if len(found) == 1 else None


def _reads(expr: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in subtree(expr))


def _adds(func: ast.AST | None, x: str, bias: str, *, bias_exact: bool) -> int | None:
    """The line where `func` (a function or one statement) adds `bias` to `x` and keeps the sum as x (`x = x + bias`, `x += bias`); None otherwise. `bias_exact`: the added operand is the name itself (in a function the layer
    calls), else any expression of it (`attn_bias.expand_as(residual)`)."""
    if func is None:
        return None

    def is_bias(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == bias) if bias_exact else _reads(node, bias)

    for stmt in subtree(func):
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name) \
                and stmt.target.id == x and is_bias(stmt.value):
            return stmt.lineno
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and isinstance(stmt.value, ast.BinOp) and isinstance(stmt.value.op, ast.Add)):
            left, right = stmt.value.left, stmt.value.right
            pair = (isinstance(left, ast.Name) and left.id == x and is_bias(right)) or \
                   (isinstance(right, ast.Name) and right.id == x and is_bias(left))
            if pair:
                return stmt.lineno
    return None


def _function(sources: dict, name: str) -> tuple[str, ast.FunctionDef] | None:
    hits = [(file, node) for file, tree in _parsed(sources) for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == name]
    return hits[0] if len(hits) == 1 else None


def _assigns_before(node: ast.AST, name: str, line: int | None) -> bool:
    """Whether `node` assigns `name` (before `line`, where given)."""
    for n in subtree(node):
        if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and (line is None or n.lineno < line):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == name for target in targets for t in subtree(target)):
                return True
    return False


def _added_in_layer(sources: dict, forward: ast.FunctionDef, unpacked_at: ast.stmt, out: str,
                    bias: str) -> str | None:
    """FILE:LINE-style evidence that the layer's forward adds `bias` to `out` before anything else changes `out`
    (itself, or in a module-level function it hands both to, bound by parameter); None where it does not, or not
    in a way this can read."""
    after = forward.body[forward.body.index(unpacked_at) + 1:]
    for stmt in after:
        if not _reads(stmt, bias):
            if _assigns_before(stmt, out, None):
                return None  # the output changed before the bias is added
            continue
        # The first statement reading the bias: an addition to the output, here or in the function called.
        line = _adds(stmt, out, bias, bias_exact=False)
        if line is not None:
            return None if _assigns_before(stmt, out, line) else f"{line}: {ast.unparse(stmt)}"
        call = stmt.value if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) else None
        if call is None or not isinstance(call.func, ast.Name):
            return None
        found = _function(sources, call.func.id)
        if found is None:
            return None
        file, func = found
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        bound = dict(zip(params, call.args))
        bound.update({k.arg: k.value for k in call.keywords if k.arg})
        x = next((p for p, e in bound.items() if isinstance(e, ast.Name) and e.id == out), None)
        b = next((p for p, e in bound.items() if _reads(e, bias) and p != x), None)
        if x is None or b is None:
            return None
        inner = _adds(func, x, b, bias_exact=True)
        if inner is None or _assigns_before(func, x, inner):
            return None  # the output changed before the bias is added: no projection bias
        return f"{stmt.lineno}: {ast.unparse(stmt)}; {file}:{inner}: {x} + {b}"
    return None


def code_output_bias(sources: dict, config: dict, layers_attr: str | None, o_proj: str, num_layers: int,
                     layers_holding: list[int], param: str, where, model_type: str | None) -> OutputBias | None:
    """The output bias the attention keeps as its parameter PARAM (the checkpoint's `{attention}.{param}`, held by
    the layers `layers_holding`) and the decoder layer adds to the output projection's result; None where the code
    does not read so. Refused (UnsupportedArchitecture) where it does but on layers the config does not decide or
    the checkpoint does not match."""
    flow = dataflow.analyze_layer(sources, config, layers_attr) or dataflow.analyze_layer(sources, config)
    if flow is None or flow.attention_flow is None or flow.attention_inner is not None:
        return None
    found = dataflow._class(sources, flow.attention_flow.cls)
    layer_found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if found is None or layer_found is None:
        return None
    file, attn_cls = found
    layer_file, layer_cls, _ = layer_found
    init, forward, layer_forward = _method(attn_cls, "__init__"), _method(attn_cls, "forward"), \
        _method(layer_cls, "forward")
    if init is None or forward is None or layer_forward is None:
        return None
    made = _parameter_condition(init, param)
    returned = _returned_positions(forward, param, o_proj)
    if made is None or returned is None:
        return None
    test, made_line = made
    at_out, at_param, return_line = returned
    # The layer unpacks the attention's tuple: which of its names hold the projection's output and the bias.
    unpacked = None
    for stmt in layer_forward.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Tuple)
                and isinstance(stmt.value, ast.Call) and _dotted(stmt.value.func) == f"self.{flow.attention}"):
            elts = stmt.targets[0].elts
            if max(at_out, at_param) < len(elts) and all(isinstance(elts[i], ast.Name) for i in (at_out, at_param)):
                unpacked = (stmt, elts[at_out].id, elts[at_param].id)
    if unpacked is None:
        return None
    added = _added_in_layer(sources, layer_forward, *unpacked)
    if added is None:
        return None
    said = (f"{file}:{made_line}: self.{param}, returned beside self.{o_proj}'s output ({file}:{return_line}) and "
            f"added to it by the layer ({layer_file}:{added})")
    if test is None:
        expr_text, layers = "True", list(range(num_layers))
    else:
        expr = window.lift_to_layer(sources, flow, layers_attr, init, test)
        if expr is None:
            raise unsupported(f"an output bias on the layers where {ast.unparse(test)} ({said}), a condition the "
                              "reader does not follow to the config and the layer's number", where, model_type)
        expr_text = ast.unparse(expr)
        reads = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        truth = [conditions.evaluate(expr, config, {"layer_idx": i}) for i in range(num_layers)]
        if reads - window.READS or None in truth:
            raise unsupported(f"an output bias on the layers where {expr_text} ({said}), which config.json does "
                              "not decide", where, model_type)
        layers = [i for i, t in enumerate(truth) if t]
    if layers != sorted(layers_holding):
        raise unsupported(f"an output bias on the layers where {expr_text} ({said}): layers {layers}, but the "
                          f"checkpoint holds it in layers {sorted(layers_holding)}", where, model_type)
    return OutputBias(param, layers, expr_text, said)
