"""Forms a decoder layer's modules compute that the port's layer does not, named where a refusal stands before them
(scaffold.detect.policy: behind several copies of the residual stream), so that the refusal lists what a port of
the model still needs:

- a low-rank residual branch (Gemma-3n's Laurel): a module the decoder layer builds whose forward returns its input
  plus what two linears compute through a narrower width, one applied directly to the other's output (hidden -> r ->
  hidden, r a config value, no activation between: not an MLP with its residual inside);
- a statistical cutoff on a projection's output (Gemma-3n's activation sparsity): a method of a module the layer
  builds that subtracts mean + std * z from its input and keeps the positive part (a gaussian top-k, z an inverse
  normal CDF of a fraction), named with the layers where config.json takes the branch that calls it.

Read from what the code computes (the linears' widths, the returned sum, the statistics and the relu), not from the
modules' names; the condition on the layer is followed to the config and the layer's index (window's steps) and
decided per layer.
"""

from __future__ import annotations

import ast

from scaffold.detect import codekeys, conditions, dataflow, window
from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _dotted, subtree

NORMAL_QUANTILES = ("icdf", "erfinv", "ndtri", "ppf")


def _methods(cls: ast.ClassDef) -> list[ast.FunctionDef]:
    return [n for n in cls.body if isinstance(n, ast.FunctionDef)]


def _layer_modules(sources: dict):
    """(layer file, layer class, list line, layer __init__, attr, the call building it, file, class) of each module
    of the sources' own classes the decoder layer builds."""
    found = dataflow.layer_class(sources)
    if found is None:
        return
    layer_file, layer_cls, list_line = found
    layer_init = window._init(layer_cls)
    for attr, call in dataflow._init_assignments(layer_init).items():
        sub = dataflow._submodule_class(sources, call)
        if sub is not None:
            yield layer_file, layer_cls, list_line, layer_init, attr, call, sub[0], sub[1]


def low_rank_branch(sources: dict, hidden: str = "config.hidden_size") -> str | None:
    """'a low-rank residual branch ...' naming the module, its linears and width, else None."""
    linear = linear_classes(sources)
    for *_layer, attr, _call, file, cls in _layer_modules(sources):
        init, forward = window._init(cls), next((m for m in _methods(cls) if m.name == "forward"), None)
        if init is None or forward is None:
            continue
        down, up = {}, {}  # attr -> (rank expression, line)
        for node in subtree(init):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute) and isinstance(node.value, ast.Call)):
                continue
            kind = linear.get(codekeys.callee(node.value))
            if kind is None or len(node.value.args) <= max(kind.in_arg, kind.out_arg):
                continue
            features_in = codekeys.config_expr(node.value.args[kind.in_arg], init)
            features_out = codekeys.config_expr(node.value.args[kind.out_arg], init)
            if not features_in or not features_out:
                continue
            if features_in[0] == hidden and features_out[0] != hidden:
                down[node.targets[0].attr] = (features_out[0], node.lineno)
            elif features_out[0] == hidden and features_in[0] != hidden:
                up[node.targets[0].attr] = (features_in[0], node.lineno)
        pairs = [(d, u) for d in down for u in up if down[d][0] == up[u][0]]
        params = [a.arg for a in forward.args.args[1:]]
        returns = [n for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None]
        if len(pairs) != 1 or not params or len(returns) != 1:
            continue
        ret = returns[0].value
        if not (isinstance(ret, ast.BinOp) and isinstance(ret.op, ast.Add) and any(
                isinstance(side, ast.Name) and side.id == params[0] for side in (ret.left, ret.right))):
            continue
        d, u = pairs[0]
        if _composed(forward, d, u):
            return (f"a low-rank residual branch (Laurel): the decoder layer's {attr} ({cls.name}, {file}:"
                    f"{returns[0].lineno}) returns its input plus what {u}({d}(x)) computes through {down[d][0]} "
                    "features")
    return None


def _composed(forward: ast.FunctionDef, down: str, up: str) -> bool:
    """Whether the forward applies self.<up> directly to what self.<down> computed (no activation, no other factor
    between them: a low-rank product), following its locals in order."""
    made: dict[str, str] = {}  # local -> the linear whose output it holds as is

    def source(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return made.get(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _dotted(node.func.value) == "self" \
                and node.func.attr in (down, up) and len(node.args) == 1:
            return node.func.attr if node.func.attr == down or source(node.args[0]) == down else None
        return None

    for stmt in forward.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == up \
                    and _dotted(node.func.value) == "self" and len(node.args) == 1 and source(node.args[0]) == down:
                return True
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    found = source(stmt.value) if stmt.value is not None else None
                    if found is None:
                        made.pop(target.id, None)
                    else:
                        made[target.id] = found
    return False


def _lifted(expr: ast.expr, layer_file: str, list_line: int, layer_init, init, call, sources: dict) -> ast.expr | None:
    expr = window._lift(expr, init, {})
    expr = window._lift(expr, None, window._bind(init, call))
    expr = window._lift(expr, layer_init, {})
    return window._to_layer_list(sources, layer_file, list_line, layer_init, expr)


def gate_cutoff(sources: dict, config: dict, num_layers: int) -> str | None:
    """'a statistical cutoff ...' naming the method and the layers config.json takes it on, else None (also where
    no layer of this checkpoint takes it)."""
    for layer_file, _lc, list_line, layer_init, attr, call, file, cls in _layer_modules(sources):
        init = window._init(cls)
        for method in _methods(cls):
            calls = {_dotted(n.func).rsplit(".", 1)[-1] for n in subtree(method) if isinstance(n, ast.Call)}
            if not ({"mean"} <= calls and {"std"} & calls and set(NORMAL_QUANTILES) & calls
                    and {"relu", "clamp", "clamp_min"} & calls):
                continue
            # Where the module's own methods call it, and under which condition.
            for other in _methods(cls):
                for node in subtree(other):
                    if not isinstance(node, ast.If):
                        continue
                    calls_it = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                   and n.func.attr == method.name and _dotted(n.func.value) == "self"
                                   for stmt in node.body for n in ast.walk(stmt))
                    if not calls_it:
                        continue
                    test = _lifted(node.test, layer_file, list_line, layer_init, init, call, sources)
                    truth = [conditions.evaluate(test, config, {"layer_idx": i}) if test is not None else None
                             for i in range(num_layers)]
                    layers = [i for i, t in enumerate(truth) if t]
                    said = ast.unparse(test) if test is not None else ast.unparse(node.test)
                    if None in truth:
                        return (f"a statistical cutoff on a projection's output (activation sparsity): {cls.name}."
                                f"{method.name} ({file}:{method.lineno}) keeps relu(x - (mean + std * z)), called "
                                f"by the layer's {attr} where {said}, which config.json does not decide per layer")
                    if layers:
                        return (f"a statistical cutoff on a projection's output (activation sparsity): {cls.name}."
                                f"{method.name} ({file}:{method.lineno}) keeps relu(x - (mean + std * z)), called "
                                f"by the layer's {attr} where {said}: layers {layers}")
    return None
