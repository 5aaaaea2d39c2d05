"""KV heads sized per layer, value heads of their own width, a scale on the values, sinks on some layers only.

MiMo-V2-Flash's attention builds its projections so:

    is_swa = config.layer_types[layer_idx] == "sliding_attention"
    num_key_value_heads = config.num_key_value_heads * 2 if is_swa else config.num_key_value_heads
    self.k_proj = nn.Linear(config.hidden_size, num_key_value_heads * self.head_dim, ...)
    self.v_proj = nn.Linear(config.hidden_size, num_key_value_heads * config.v_head_dim, ...)
    self.o_proj = nn.Linear(num_attention_heads * config.v_head_dim, config.hidden_size, ...)
    self.sinks = nn.Parameter(torch.empty(num_attention_heads)) if is_swa else None
    self.v_scale = config.attention_value_scale if config.attention_value_scale is not None else 1.0
    ...
    value_states = self.v_proj(hidden_states).view(...).transpose(1, 2) * self.v_scale

This reads those sizes from what the attention's __init__ multiplies (whatever the projections, locals and keys
are called): each projection's width is a product of a head count and a head width; the factor the key
projection shares with the query projection is the q/k head width, the other its KV head count; the factor the
value projection shares with the key projection is the KV head count, the other the value head width. Each is
followed up to the config and the layer's index (window.lift_to_layer) and evaluated on config.json for every
layer. A factor that multiplies the value projection's output in the forward is the value scale. Read as text,
never run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from scaffold.detect import conditions, configexpr, dataflow, outbias, window
from scaffold.detect.sourcecode import _dotted, subtree


@dataclass
class HeadSizes:
    """What the attention's __init__ sizes its projections with, evaluated on config.json.

    kv_heads: each layer's KV heads; kv_expr: the code's expression of them over config and layer_idx (None where
    it reads no layer_idx); v_width: the value heads' width where it differs from the q/k head width (None where
    they are the same), v_expr its config expression; value_scale / value_scale_expr: a factor on the values;
    sinks_layers / sinks_expr: the layers whose attention builds `sinks` (a parameter built under a condition),
    with that condition."""
    cls: str
    file: str
    line: int
    kv_heads: list[int] = field(default_factory=list)
    kv_expr: str | None = None
    kv_line: int = 0
    v_width: int | None = None
    v_expr: str | None = None
    v_line: int = 0
    value_scale: float | None = None
    value_scale_expr: str | None = None
    value_scale_line: int = 0
    problems: list[str] = field(default_factory=list)
    head_dim = ()  # the q/k head width is config.json's in every layer (policy.check_shapes reads it per layer)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _width(call: ast.Call, position: int, keyword: str) -> ast.expr | None:
    """The in (position 0) or out (1) size a Linear-like constructor call is given."""
    if len(call.args) > position:
        return call.args[position]
    return next((k.value for k in call.keywords if k.arg == keyword), None)


def _factors(expr: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Mult):
        return expr.left, expr.right
    return None


def _same(a: ast.expr, b: ast.expr) -> bool:
    return ast.dump(a) == ast.dump(b)


def _split(product: ast.expr, shared_with: ast.expr) -> tuple[ast.expr, ast.expr] | None:
    """(the factor of `product` that `shared_with` (a product) also has, the other factor); None otherwise."""
    mine, theirs = _factors(product), _factors(shared_with)
    if mine is None or theirs is None:
        return None
    for i in (0, 1):
        if any(_same(mine[i], t) for t in theirs):
            return mine[i], mine[1 - i]
    return None


def _value(expr: ast.expr, config: dict, layer: int):
    value = conditions._value(expr, config, {"layer_idx": layer})
    return None if value is conditions._UNKNOWN else value


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def read(sources: dict, config: dict, layers_attr: str | None, num_layers: int) -> HeadSizes | None:
    """The attention's sizes as its __init__ builds them (see the module's docstring); None where the code has no
    attention this can read, or builds every layer's k and v from the q/k head width and one KV head count."""
    flow = dataflow.analyze_layer(sources, config, layers_attr) or dataflow.analyze_layer(sources, config)
    if flow is None or flow.attention_flow is None or flow.attention_flow.layout != "separate":
        return None
    code = flow.attention_flow
    found = dataflow._class(sources, code.cls)
    if found is None or code.o is None:
        return None
    file, cls = found
    init = _method(cls, "__init__")
    if init is None:
        return None
    built = dataflow._init_assignments(init)
    calls = {role: built.get(attr) for role, attr in (("q", code.q), ("k", code.k), ("v", code.v), ("o", code.o))}
    if not all(isinstance(c, ast.Call) for c in calls.values()):
        return None

    def lifted(expr: ast.expr | None) -> ast.expr | None:
        return None if expr is None else window.lift_to_layer(sources, flow, layers_attr, init, expr)

    q_out, k_out = lifted(_width(calls["q"], 1, "out_features")), lifted(_width(calls["k"], 1, "out_features"))
    v_out, o_in = lifted(_width(calls["v"], 1, "out_features")), lifted(_width(calls["o"], 0, "in_features"))
    if None in (q_out, k_out, v_out, o_in):
        return None
    key = _split(k_out, q_out)  # (q/k head width, KV heads)
    value = _split(v_out, k_out) if key is not None else None  # (KV heads, value width)
    if key is None or value is None or not _same(value[0], key[1]):
        return None
    head_width, kv_count = key
    v_width = value[1]
    out = HeadSizes(code.cls, file, init.lineno, kv_line=calls["k"].lineno, v_line=calls["v"].lineno)
    reads = {n.id for n in ast.walk(kv_count) if isinstance(n, ast.Name)}
    counts = [_value(kv_count, config, i) for i in range(num_layers)]
    # KV heads config.json does not decide (a count handed in by the caller, a default of the config class) are left
    # to the checks against num_kv_heads: the tensors say whether they are that count.
    if not (reads - window.READS) and all(_positive_int(c) for c in counts):
        out.kv_heads = counts
        if "layer_idx" in reads and len(set(counts)) > 1:
            out.kv_expr = ast.unparse(kv_count)
    if not _same(v_width, head_width):
        o_parts = _factors(o_in)
        widths = {_value(v_width, config, i) for i in range(num_layers)}
        text = configexpr.expression(v_width)
        width = widths.pop() if len(widths) == 1 else None
        if o_parts is None or not any(_same(p, v_width) for p in o_parts):
            out.problems.append(f"value heads {ast.unparse(v_width)} wide ({file}:{calls['v'].lineno}) that the "
                                f"output projection {code.o} does not take ({ast.unparse(o_in)})")
        elif text is None or not _positive_int(width):
            out.problems.append(f"value heads {ast.unparse(v_width)} wide ({file}:{calls['v'].lineno}), which is "
                                "not one config value for every layer")
        elif width != _value(head_width, config, 0):
            out.v_width, out.v_expr = width, text
    _value_scale(out, cls, code.v, config)
    return out


def _value_scale(out: HeadSizes, cls: ast.ClassDef, v_proj: str, config: dict) -> None:
    """A factor the forward multiplies the value projection's output by (`v = self.v_proj(x)... * self.s`, or
    `v = v * s`, `v *= s` later): its config expression and value."""
    forward = _method(cls, "forward")
    init = _method(cls, "__init__")
    if forward is None:
        return
    held: set[str] = set()  # names holding the values (reshaped, transposed, scaled), nothing computed from them

    def is_values(node: ast.AST) -> bool:
        """The value projection's output, a name holding it, or a method called on one (`.view(...)`)."""
        if isinstance(node, ast.Call) and _dotted(node.func) == f"self.{v_proj}":
            return True
        if isinstance(node, ast.Name):
            return node.id in held
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            return is_values(node.func.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            return is_values(node.left) != is_values(node.right)
        return False

    factors: list[tuple[ast.expr, int]] = []
    for stmt in subtree(forward):
        if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in held \
                and isinstance(stmt.op, ast.Mult) and not is_values(stmt.value):
            factors.append((stmt.value, stmt.lineno))
        if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
            continue
        targets = [n.id for n in subtree(stmt.targets[0]) if isinstance(n, ast.Name)]
        if not (isinstance(stmt.targets[0], ast.Name) and is_values(stmt.value)):
            held.difference_update(targets)  # reassigned to something else: no longer the values
            continue
        held.add(stmt.targets[0].id)
        for node in subtree(stmt.value):  # `self.v_proj(x).view(...) * s`, `v * s`
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and is_values(node):
                left = is_values(node.left)
                factors.append((node.right if left else node.left, stmt.lineno))
    if not factors:
        return
    if len(factors) > 1:
        out.problems.append(f"the values scaled {len(factors)} times (lines {', '.join(str(f[1]) for f in factors)})")
        return
    factor, line = factors[0]
    kept = {a: conditions.selected(v, config) for a, v in dataflow._init_assignments(init).items()}
    text = configexpr.expression(factor, {a: v for a, v in kept.items() if v is not None})
    number = configexpr.evaluate(text, config) if text else None
    if text is None and isinstance(factor, ast.Attribute) and isinstance(kept.get(factor.attr), ast.Constant):
        constant = kept[factor.attr].value
        number = constant if isinstance(constant, (int, float)) and not isinstance(constant, bool) else None
        text = repr(number) if number is not None else None
    if text is None or number is None:
        out.problems.append(f"the values scaled by {ast.unparse(factor)} ({out.file}:{line}), which the reader "
                            "does not follow to the config")
        return
    if number != 1.0:
        out.value_scale, out.value_scale_expr, out.value_scale_line = float(number), text, line


def sinks_condition(sources: dict, config: dict, layers_attr: str | None, param: str,
                    num_layers: int) -> tuple[str, list[int], str] | None:
    """(the condition over config and layer_idx, the layers it holds in, FILE:LINE) under which the attention's
    __init__ builds its sinks parameter `param` (`self.sinks = nn.Parameter(...) if is_swa else None`); None where
    it builds it unconditionally or in a form this does not follow."""
    found = dataflow.attention_class(sources, config, layers_attr)
    if found is None:
        return None
    flow, file, cls = found
    init = _method(cls, "__init__")
    made = outbias._parameter_condition(init, param) if init is not None else None
    if made is None or made[0] is None:
        return None
    expr = window.lift_to_layer(sources, flow, layers_attr, init, made[0])
    if expr is None or {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - window.READS:
        return None
    truth = [conditions.evaluate(expr, config, {"layer_idx": i}) for i in range(num_layers)]
    if None in truth:
        return None
    return ast.unparse(expr), [i for i, t in enumerate(truth) if t], f"{file}:{made[1]}"
