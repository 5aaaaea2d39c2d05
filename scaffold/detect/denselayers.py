"""Which layers keep a dense MLP in a mixture-of-experts model, as the decoder layer's code decides.

The checkpoint says which layers hold experts; the code says why, in the decoder layer's constructor:

    if layer_idx >= config.first_k_dense_replace:          # DeepSeek-V3, GLM-4-MoE
        self.mlp = DeepseekV3MoE(config)
    else:
        self.mlp = DeepseekV3MLP(config)

    self.mlp = MiMoV2FlashMoE(config) if config.mlp_layer_types[layer_idx] == "sparse" else MiMoV2FlashMLP(config)

The condition is followed to the config and the layer's index (scaffold.detect.window.lift_from_layer),
evaluated on config.json for every layer, and kept only where it selects exactly the layers whose tensors hold
no experts. The port then evaluates the same expression on its config at run time, so a checkpoint of the family
with other layer counts or another first_k_dense_replace loads as its config says. Where the code chooses
otherwise, or config.json does not decide it, the port keeps the checkpoint's list as a literal. Read as text,
never run.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import conditions, dataflow, window
from scaffold.detect.sourcecode import _dotted, subtree


@dataclass(frozen=True)
class DenseCondition:
    expr: str  # true on the layers with a dense MLP, over `config` and `layer_idx`
    evidence: str  # FILE:LINE and the code's own condition


def _built(stmts: list[ast.stmt], attr: str) -> ast.Call | None:
    """The call a branch assigns to self.ATTR (the last one), else None."""
    found = None
    for stmt in stmts:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and _dotted(stmt.targets[0]) == f"self.{attr}" and isinstance(stmt.value, ast.Call)):
            found = stmt.value
    return found


def _choices(init: ast.FunctionDef, attr: str) -> list[tuple[ast.expr, int]]:
    """(test, line) of every place __init__ picks self.ATTR's class by a condition: an if/else whose two branches
    build different classes, or a conditional expression doing so."""
    out = []
    for node in subtree(init):
        if isinstance(node, ast.If):
            then, other = _built(node.body, attr), _built(node.orelse, attr)
            if then is not None and other is not None and _dotted(then.func) != _dotted(other.func):
                out.append((node.test, node.lineno))
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and _dotted(node.targets[0]) == f"self.{attr}"
              and isinstance(node.value, ast.IfExp) and isinstance(node.value.body, ast.Call)
              and isinstance(node.value.orelse, ast.Call)
              and _dotted(node.value.body.func) != _dotted(node.value.orelse.func)):
            out.append((node.value.test, node.lineno))
    return out


def code_dense_layers(sources: dict, config: dict, layers_attr: str | None, mlp: str, num_layers: int,
                      dense: list[int]) -> DenseCondition | None:
    """The decoder layer's own condition for a dense MLP at self.MLP, where config.json makes it select exactly
    `dense` among `num_layers` layers; None otherwise (the port then keeps the list)."""
    found = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if found is None or not dense:
        return None
    file, cls, _ = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    choices = _choices(init, mlp) if init is not None else []
    if len(choices) != 1:
        return None
    test, line = choices[0]
    expr = window.lift_from_layer(sources, layers_attr, test)
    if expr is None or {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - window.READS:
        return None
    truth = [conditions.evaluate(expr, config, {"layer_idx": i}) for i in range(num_layers)]
    if None in truth:
        return None
    chosen = [i for i, t in enumerate(truth) if t]
    text = ast.unparse(expr)
    evidence = f"{file}:{line}: the MLP's class chosen by `{ast.unparse(test)}`"
    if chosen == sorted(dense):
        return DenseCondition(text, evidence)
    if [i for i in range(num_layers) if i not in chosen] == sorted(dense):
        return DenseCondition(ast.unparse(negated(expr)), evidence)
    return None


_OPPOSITE = {ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.Lt: ast.GtE, ast.GtE: ast.Lt, ast.Gt: ast.LtE,
             ast.LtE: ast.Gt, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def negated(expr: ast.expr) -> ast.expr:
    """`not expr`, written as vLLM's code would (`layer_idx < config.first_k_dense_replace`, not
    `not (layer_idx >= ...)`): a single comparison flipped, a `not` dropped, else `not (...)`."""
    if isinstance(expr, ast.Compare) and len(expr.ops) == 1 and type(expr.ops[0]) in _OPPOSITE:
        return ast.Compare(expr.left, [_OPPOSITE[type(expr.ops[0])]()], expr.comparators)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        return expr.operand
    return ast.UnaryOp(ast.Not(), expr)
