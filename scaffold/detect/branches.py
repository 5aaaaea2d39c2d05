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
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from scaffold.detect import codekeys, conditions, dataflow, window
from scaffold.detect.evaluate import CannotEvaluate, Interpreter, Obj
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


# ------------------------------------------------------------------ the cutoff, read to be ported
@dataclass(frozen=True)
class Cutoff:
    """A statistical cutoff on the gate projection's output before the activation (Gemma-3n's activation sparsity):
    relu(g - (mean(g) + std(g) * z)), z the standard normal quantile of the layer's fraction."""

    module: str  # the layer's MLP attribute
    method: str
    fraction: str  # the fraction as the code computes it, over config and layer_idx
    fractions: list  # each layer's fraction (0: not taken)
    layers: list
    evidence: str


class _CutoffRun(Interpreter):
    """The shared interpreter with torch.distributions.normal.Normal(mu, sigma).icdf, torch.std and relu."""

    def attribute(self, node, env):
        dotted = _dotted(node)
        head = dotted.split(".")[0]
        if head in ("torch", "nn", "F") and head not in env:
            if node.attr == "Normal":
                return ("normal",)
            if node.attr in ("std", "relu"):
                return ("cutoff_lib", node.attr)
        owner = self.expr(node.value, env) if not (head in ("torch", "nn", "F") and head not in env) else None
        if isinstance(owner, NormalDist) and node.attr == "icdf":
            return ("icdf", owner)
        if isinstance(owner, np.ndarray) and node.attr in ("std", "relu"):
            return ("cutoff_method", owner, node.attr)
        return super().attribute(node, env)

    def apply(self, func, args, kwargs, node):
        if isinstance(func, tuple) and func[:1] == ("normal",):
            mu = kwargs.get("loc", args[0] if args else 0.0)
            sigma = kwargs.get("scale", args[1] if len(args) > 1 else 1.0)
            return NormalDist(float(mu), float(sigma))
        if isinstance(func, tuple) and func[:1] == ("icdf",):
            value = np.asarray(args[0], dtype=np.float64)
            return np.vectorize(func[1].inv_cdf)(value) if value.ndim else np.asarray(func[1].inv_cdf(float(value)))
        if isinstance(func, tuple) and func[:1] in (("cutoff_lib",), ("cutoff_method",)):
            if func[0] == "cutoff_method":
                args = [func[1], *args]
            name = func[-1]
            if name == "relu":
                return np.maximum(args[0], 0.0)
            unbiased = kwargs.get("unbiased", kwargs.get("correction", 1) != 0)
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            return np.std(args[0], axis=dim, keepdims=bool(kwargs.get("keepdim")), ddof=1 if unbiased else 0)
        return super().apply(func, args, kwargs, node)


def _cutoff_computes(method: ast.FunctionDef, cls: ast.ClassDef, attr: str) -> str | None:
    """None where `method` computes relu(x - (mean(x) + std(x) * z)), z the normal quantile of self.<attr>, over the
    last axis (the population std); else what it computes otherwise."""
    functions = {}
    interp = _CutoffRun(functions, {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)})
    rng = np.random.default_rng(3)
    for fraction in (0.95, 0.3):
        x = rng.standard_normal((2, 3, 17)) * 1.7 + 0.4
        receiver = Obj({attr: fraction, "training": False}, name="self")
        try:
            out = interp.call_function(method, receiver, [x])
        except CannotEvaluate as exc:
            return f"the reader does not run it ({exc})"
        z = NormalDist().inv_cdf(fraction)
        want = np.maximum(x - (x.mean(-1, keepdims=True) + x.std(-1, keepdims=True) * z), 0.0)
        if not isinstance(out, np.ndarray) or out.shape != want.shape or not np.allclose(out, want, atol=1e-9):
            return "it does not compute relu(x - (mean(x) + std(x) * z)) over the last axis with the population std"
    return None


def read_cutoff(sources: dict, config: dict, num_layers: int, gate: str | None) -> Cutoff | None:
    """The cutoff as the port computes it (vLLM's GeluAndMulSparse, statistics over the whole gate width), read from
    the code; None where no module of the layer has one; Refused naming what differs."""
    for layer_file, _lc, list_line, layer_init, attr, call, file, cls in _layer_modules(sources):
        init = window._init(cls)
        for method in _methods(cls):
            calls = {_dotted(n.func).rsplit(".", 1)[-1] for n in subtree(method) if isinstance(n, ast.Call)}
            if not ({"mean"} <= calls and {"std"} & calls and set(NORMAL_QUANTILES) & calls
                    and {"relu", "clamp", "clamp_min"} & calls):
                continue
            where = f"{file}:{method.lineno}"
            reads = {n.attr for n in subtree(method) if isinstance(n, ast.Attribute) and _dotted(n.value) == "self"}
            if len(reads) != 1:
                raise Refused(f"activation sparsity: {cls.name}.{method.name} ({where}) reads {sorted(reads)} of its "
                              "module, not one fraction")
            fraction_attr = next(iter(reads))
            problem = _cutoff_computes(method, cls, fraction_attr)
            if problem:
                raise Refused(f"activation sparsity: {cls.name}.{method.name} ({where}): {problem}")
            # Where forward calls it: on the gate projection's output, under a test, before the activation.
            forward = next((m for m in _methods(cls) if m.name == "forward"), None)
            use = _cutoff_use(forward, method.name, gate) if forward is not None else None
            if use is None:
                raise Refused(f"activation sparsity: {cls.name}.{method.name} ({where}) is not applied to the gate "
                              f"projection's output ({gate}) before the activation in {cls.name}.forward")
            assigned = next((n.value for n in subtree(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                             and isinstance(n.targets[0], ast.Attribute) and n.targets[0].attr == fraction_attr
                             and _dotted(n.targets[0].value) == "self"), None) if init is not None else None
            lifted = _lifted(assigned, layer_file, list_line, layer_init, init, call, sources) \
                if assigned is not None else None
            fractions = [conditions._value(lifted, config, {"layer_idx": i}) if lifted is not None else None
                         for i in range(num_layers)]
            if lifted is None or any(not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 <= f < 1
                                     for f in fractions):
                raise Refused(f"activation sparsity: the fraction {cls.name}.{fraction_attr} ({where}) is not a "
                              "number config.json gives each layer")
            test = _lifted(use, layer_file, list_line, layer_init, init, call, sources)
            taken = [conditions.evaluate(test, config, {"layer_idx": i}) if test is not None else None
                     for i in range(num_layers)]
            if None in taken or any(bool(t) != (f > 0) for t, f in zip(taken, fractions)):
                raise Refused(f"activation sparsity: {cls.name}.forward applies {method.name} where "
                              f"{ast.unparse(use)}, not on exactly the layers whose fraction is above 0")
            return Cutoff(attr, method.name, ast.unparse(lifted), [float(f) for f in fractions],
                          [i for i, f in enumerate(fractions) if f > 0],
                          f"{where}: relu(g - (mean + std * icdf({fraction_attr}))) on {gate}'s output, "
                          f"{cls.name}.{fraction_attr} = {ast.unparse(lifted)}")
    return None


def _cutoff_use(forward: ast.FunctionDef, method: str, gate: str | None) -> ast.expr | None:
    """The test under which forward applies self.<method> to the gate projection's output, whose result the
    activation then takes: `g = self.<gate>(x); if TEST: g = self.<method>(g); a = self.act(g)`; None otherwise."""
    made: dict[str, str] = {}
    for stmt in forward.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target
            value = stmt.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                    and _dotted(value.func.value) == "self" and value.func.attr == gate:
                made[target.id] = "gate"
            continue
        if isinstance(stmt, ast.If) and len(stmt.body) == 1 and not stmt.orelse and isinstance(stmt.body[0], ast.Assign):
            inner = stmt.body[0]
            value = inner.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == method
                    and _dotted(value.func.value) == "self" and len(value.args) == 1
                    and isinstance(value.args[0], ast.Name) and made.get(value.args[0].id) == "gate"
                    and len(inner.targets) == 1 and isinstance(inner.targets[0], ast.Name)
                    and inner.targets[0].id == value.args[0].id):
                name = value.args[0].id
                # The activation takes it next.
                later = forward.body[forward.body.index(stmt) + 1:]
                for node in (n for s in later for n in ast.walk(s)):
                    # The activation: a module of the MLP's (self.act_fn) or a library function (F.gelu).
                    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Name) \
                            and node.args[0].id == name and _dotted(node.func) != f"self.{gate}" \
                            and (_dotted(node.func).startswith("self.") or _dotted(node.func).split(".")[0]
                                 in ("F", "nn", "torch", "functional")):
                        return stmt.test
                return None
    return None


class Refused(Exception):
    """A form of these the port would compute otherwise (the message names it)."""
