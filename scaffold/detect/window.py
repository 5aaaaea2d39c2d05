"""A sliding window the attention's code builds into its causal mask, on the layers a condition selects.

GPT-Neo keeps no `sliding_window` in its config: its attention's __init__ narrows the causal mask on its local
layers,

    bias = torch.tril(torch.ones((max_positions, max_positions), dtype=bool)).view(...)
    if attention_type == "local":
        bias = torch.bitwise_xor(bias, torch.tril(bias, -config.window_size))

so a query sees the keys 0 <= query - key < window_size: the last window_size positions, itself included, as
vLLM's sliding_window counts them. Which layers are local is the condition, followed from the attention's
constructor parameter through the modules that build it (the wrapper's `self.attention_type =
self.attention_layers[layer_id]`, the decoder layer's `layer_id`, the layer list's `for i in range(...)`) down to
config values and the layer's index, then evaluated on config.json per layer; the port evaluates the same
expression on its config at run time. Read as text, never run. A window whose form or condition this does not
follow is refused by name, not dropped.
"""

from __future__ import annotations

import ast
import copy

from scaffold.detect import conditions, dataflow
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import _dotted, _parsed, subtree
from scaffold.purecode import BUILTINS

# What the per-layer condition may read once followed to the layer list (as the port evaluates it).
READS = frozenset({"config", "layer_idx", "hasattr", "getattr", *BUILTINS})
MAX_STEPS = 8  # substitutions per level (self.a -> self.b[...] -> config.c)


class Window:
    def __init__(self, key: str, size: int, layers: list[int], expr: str, evidence: str):
        self.key, self.size, self.layers, self.expr, self.evidence = key, size, layers, expr, evidence


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)


def _band(call: ast.Call) -> str | None:
    """`tril(M, -config.K)` (or diagonal=-config.K): the key K of the band's width, else None."""
    if _dotted(call.func).rsplit(".", 1)[-1] != "tril":
        return None
    offset = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "diagonal"),
                                                         None)
    if not (isinstance(offset, ast.UnaryOp) and isinstance(offset.op, ast.USub)):
        return None
    name = _dotted(offset.operand)
    return name.rsplit(".", 1)[-1] if name.startswith(("config.", "self.config.")) and name.count(".") <= 2 else None


def _narrowed(stmt: ast.stmt) -> tuple[str, str] | None:
    """(local, key) for `M = bitwise_xor(M, tril(M, -config.K))` or `M = M & ~tril(M, -config.K)`: the causal mask
    M without the keys K or more positions back."""
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
        return None
    mask, value = stmt.targets[0].id, stmt.value
    if isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1] in ("bitwise_xor", "logical_xor") \
            and len(value.args) == 2:
        whole, band = value.args
    elif isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitXor):
        whole, band = value.left, value.right
    elif (isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitAnd) and isinstance(value.right, ast.UnaryOp)
          and isinstance(value.right.op, ast.Invert)):
        whole, band = value.left, value.right.operand
    else:
        return None
    if not (isinstance(whole, ast.Name) and whole.id == mask and isinstance(band, ast.Call)):
        return None
    key = _band(band)
    inner = band.args[0] if band.args else None
    return (mask, key) if key and isinstance(inner, ast.Name) and inner.id == mask else None


def _bind(func: ast.FunctionDef | None, call: ast.Call) -> dict[str, ast.expr]:
    """The parameters of `func` (self left out) -> the expressions `call` hands them."""
    if func is None:
        return {}
    params = [a.arg for a in func.args.posonlyargs + func.args.args][1:]
    bound = {p: a for p, a in zip(params, call.args) if not isinstance(a, ast.Starred)}
    bound.update({k.arg: k.value for k in call.keywords if k.arg in params or k.arg in
                  {a.arg for a in func.args.kwonlyargs}})
    return bound


class _Substitute(ast.NodeTransformer):
    """Names and self.X of one class's __init__ replaced by what they stand for one level up."""

    def __init__(self, params: dict, attrs: dict, local: dict):
        self.params, self.attrs, self.local = params, attrs, local

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr != "config" \
                and node.attr in self.attrs:
            return copy.deepcopy(self.attrs[node.attr])
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr == "config":
            return ast.Name("config", ast.Load())
        return self.generic_visit(node)

    def visit_Name(self, node):
        if node.id in self.local:
            return copy.deepcopy(self.local[node.id])
        if node.id in self.params:
            return copy.deepcopy(self.params[node.id])
        return node


def _lift(expr: ast.expr, init: ast.FunctionDef | None, params: dict) -> ast.expr:
    """`expr`, written in a class's __init__, in terms of what its constructor was called with (`params`)."""
    attrs = {a: conditions.selected(v, None) or v for a, v in dataflow._init_assignments(init).items()}
    local = dataflow._init_locals(init)
    for _ in range(MAX_STEPS):
        before = ast.dump(expr)
        expr = _Substitute({}, attrs, local).visit(copy.deepcopy(expr))
        if ast.dump(expr) == before:
            break
    # The __init__'s own names that are its parameters: the caller's expressions.
    return _Substitute(params, {}, {}).visit(expr)


def _builder(cls: ast.ClassDef, attr: str) -> ast.Call | None:
    value = dataflow._init_assignments(_init(cls)).get(attr)
    return value if isinstance(value, ast.Call) else None


def code_window(sources: dict, config: dict, layers_attr: str | None, num_layers: int, where,
                model_type: str | None) -> Window | None:
    """The window the attention's code narrows its causal mask to, and on which layers; None where its code
    builds no such mask. Refused (UnsupportedArchitecture) where it does but this cannot follow the condition."""
    found = dataflow.attention_class(sources, config, layers_attr)
    if found is None:
        return None
    flow, file, attn_cls = found
    init = _init(attn_cls)
    branch = None
    for node in subtree(init) if init is not None else ():
        if isinstance(node, ast.If):
            for stmt in node.body:
                if (narrowed := _narrowed(stmt)) is not None:
                    branch = (node, stmt, *narrowed)
                    break
                if any(isinstance(c, ast.Call) and _band(c) for c in subtree(stmt)):
                    raise unsupported(f"a causal mask narrowed to a window in a form the reader does not follow "
                                      f"({file}:{stmt.lineno}: {ast.unparse(stmt)[:80]})", where, model_type)
        if branch:
            break
    if branch is None:
        return None
    test, stmt, _mask, key = branch
    said = f"{file}:{stmt.lineno}: where {ast.unparse(test.test)}, {ast.unparse(stmt)}"
    size = config.get(key)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise unsupported(f"a sliding window of config.{key} ({said}), a key config.json does not hold as a "
                          "positive integer", where, model_type)
    expr = lift_to_layer(sources, flow, layers_attr, init, test.test)
    if expr is None:
        return None
    reads = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    text = ast.unparse(expr)
    if reads - READS:
        raise unsupported(f"a sliding window on the layers where {ast.unparse(test.test)} ({said}), followed to "
                          f"{text}, which reads {', '.join(sorted(reads - READS))}: not the config and the layer's "
                          "number alone", where, model_type)
    truth = [conditions.evaluate(expr, config, {"layer_idx": i}) for i in range(num_layers)]
    if None in truth:
        raise unsupported(f"a sliding window on the layers where {text} ({said}), which config.json does not "
                          "decide", where, model_type)
    layers = [i for i, t in enumerate(truth) if t]
    return Window(key, size, layers, text, said)


def _list_element(sources: dict, file: str, line: int) -> tuple[ast.Call, str | None] | None:
    """(the call building each layer, the comprehension's loop variable) of the nn.ModuleList at FILE:LINE."""
    for name, tree in _parsed(sources):
        if name != file:
            continue
        for node in subtree(tree):
            if isinstance(node, ast.Assign) and node.lineno == line and isinstance(node.value, ast.Call) \
                    and node.value.args:
                elt = node.value.args[0]
                if isinstance(elt, (ast.ListComp, ast.GeneratorExp)) and isinstance(elt.elt, ast.Call):
                    target = elt.generators[0].target
                    return elt.elt, target.id if isinstance(target, ast.Name) else None
    return None


def lift_to_layer(sources: dict, flow, layers_attr: str | None, init: ast.FunctionDef | None,
                  expr: ast.expr) -> ast.expr | None:
    """`expr`, written in the attention's __init__ (`init`), followed up through the modules that build it (the
    wrapper's, the decoder layer's constructor call, the layer list's `for i in range(...)`) to what it reads of
    the config and the layer's index (`layer_idx`); None where a step cannot be followed."""
    # Follow the condition up: attention -> (wrapper ->) decoder layer -> layer list.
    expr = _lift(expr, init, {})
    chain = []  # (class, the call in it that builds the module below), from the attention up
    layer_found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if layer_found is None:
        return None
    layer_file, layer_cls, list_line = layer_found
    if flow.attention_inner is not None:
        wrapper = dataflow._submodule_class(sources, _builder(layer_cls, flow.attention)) \
            if _builder(layer_cls, flow.attention) is not None else None
        if wrapper is None:
            return None
        chain.append((wrapper[1], _builder(wrapper[1], flow.attention_inner)))
    chain.append((layer_cls, _builder(layer_cls, flow.attention)))
    callee_init = init
    for holder, call in chain:
        if call is None:
            return None
        expr = _lift(expr, None, _bind(callee_init, call))
        callee_init = _init(holder)
        expr = _lift(expr, callee_init, {})
    return _to_layer_list(sources, layer_file, list_line, callee_init, expr)


def lift_from_layer(sources: dict, layers_attr: str | None, expr: ast.expr) -> ast.expr | None:
    """`expr`, written in the decoder layer's __init__ (DeepSeek-V3's `layer_idx >= config.first_k_dense_replace`
    choosing its MLP), followed to what it reads of the config and the layer's index; None where it cannot be."""
    layer_found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if layer_found is None:
        return None
    layer_file, layer_cls, list_line = layer_found
    init = _init(layer_cls)
    return _to_layer_list(sources, layer_file, list_line, init, _lift(expr, init, {}))


def _to_layer_list(sources: dict, layer_file: str, list_line: int, layer_init: ast.FunctionDef | None,
                   expr: ast.expr) -> ast.expr | None:
    """The layer list: `Layer(config, layer_id=i) for i in range(config.num_layers)`: the loop variable is the
    layer's index, the layer's constructor parameters what the list passes."""
    element = _list_element(sources, layer_file, list_line)
    if element is None:
        return None
    call, index = element
    expr = _lift(expr, None, {**_bind(layer_init, call)})
    expr = _Substitute({index: ast.Name("layer_idx", ast.Load())} if index else {}, {}, {}).visit(expr)
    return expr
