"""A norm the decoder layer builds as an identity on the layers a condition selects (ModernBERT-decoder's

    self.attn_norm = (
        nn.LayerNorm(config.hidden_size, eps=config.norm_eps, bias=config.norm_bias)
        if layer_idx != 0
        else nn.Identity()
    )

: its first layer's attention reads the embeddings' norm as they are). Read as text, never run: the assignment
(a conditional expression, or an `if` / `else` each assigning the attribute) in the layer's __init__, one branch
building nn.Identity(); the condition followed to the config and the layer's index as window.py follows a
window's, then evaluated on config.json for each layer. A condition the reader does not follow, or one config.json
does not decide, is refused by name.
"""

from __future__ import annotations

import ast

from scaffold.detect import conditions, dataflow, window
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import _dotted, subtree

IDENTITIES = frozenset({"Identity"})


class Identity:
    def __init__(self, attr: str, layers: list[int], expr: str, evidence: str):
        self.attr, self.layers, self.expr, self.evidence = attr, layers, expr, evidence


def _identity(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in IDENTITIES
            and not node.args and not node.keywords)


def _assigned(stmts: list[ast.stmt], attr: str) -> ast.expr | None:
    """The value of the one statement of `stmts`, where it is `self.<attr> = value`."""
    if len(stmts) != 1 or not isinstance(stmts[0], ast.Assign) or len(stmts[0].targets) != 1:
        return None
    target = stmts[0].targets[0]
    if isinstance(target, ast.Attribute) and _dotted(target.value) == "self" and target.attr == attr:
        return stmts[0].value
    return None


def _identity_condition(init: ast.FunctionDef, attr: str) -> tuple[ast.expr, int] | None:
    """(the condition under which `self.<attr>` is an identity, line) in the layer's __init__; None where it is
    never built as one."""
    for node in subtree(init):
        pair = None
        if isinstance(node, ast.Assign) and _assigned([node], attr) is not None and isinstance(node.value, ast.IfExp):
            pair = (node.value.test, node.value.body, node.value.orelse)
        elif isinstance(node, ast.If):
            body, orelse = _assigned(node.body, attr), _assigned(node.orelse, attr)
            if body is not None and orelse is not None:
                pair = (node.test, body, orelse)
        if pair is None:
            continue
        test, yes, no = pair
        if _identity(yes) and not _identity(no):
            return test, node.lineno
        if _identity(no) and not _identity(yes):
            return ast.UnaryOp(ast.Not(), test), node.lineno
    return None


def identity_layers(sources: dict, config: dict, layers_attr: str | None, attr: str, num_layers: int, where,
                    model_type: str | None) -> Identity | None:
    """The layers whose decoder layer builds `self.<attr>` (a norm) as nn.Identity(); None where none does.
    Refused (UnsupportedArchitecture) where the code builds one under a condition this does not decide."""
    found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if found is None:
        return None
    file, cls, list_line = found
    init = window._init(cls)
    made = _identity_condition(init, attr) if init is not None else None
    if made is None:
        return None
    test, line = made
    said = f"{file}:{line}: self.{attr} is nn.Identity() where {ast.unparse(test)}"
    element = window._list_element(sources, file, list_line)
    if element is None:
        raise unsupported(f"a layer norm built as an identity on some layers ({said}), in a layer list the reader "
                          "does not follow", where, model_type)
    call, index = element
    expr = window._lift(test, init, {})
    expr = window._lift(expr, None, window._bind(init, call))
    expr = window._Substitute({index: ast.Name("layer_idx", ast.Load())} if index else {}, {}, {}).visit(expr)
    text = ast.unparse(expr)
    reads = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    if "layer_idx" not in reads:
        return None  # the same module in every layer, as config.json selects it (conditions.selected reads that)
    truth = [conditions.evaluate(expr, config, {"layer_idx": i}) for i in range(num_layers)]
    if reads - window.READS or None in truth:
        raise unsupported(f"a layer norm built as an identity on the layers where {text} ({said}), which config.json "
                          "does not decide", where, model_type)
    layers = [i for i, t in enumerate(truth) if t]
    # None where config.json selects the module in every layer (HyperCLOVA X's `... if config.use_post_norm else
    # nn.Identity()` with use_post_norm true): no layer is an identity.
    return Identity(attr, layers, text, said) if layers else None
