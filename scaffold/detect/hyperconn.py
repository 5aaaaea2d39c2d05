"""Hyper-connections (HY-V4's, DeepSeek-V4's manifold-constrained ones): the residual kept as N streams per token,
[tokens, N, hidden]. Before each sublayer a module of the layer reads every stream and gives the sublayer's input
(a mix of the streams) and the weights its output is written back with; a head collapses the streams before the
final norm. The form the port computes (vLLM's mhc_pre / mhc_post, in float32; HY-V4's without the mixing matrix):

    m     = (fn @ flat) * rsqrt(mean(flat^2) + e_norm)            flat = the N streams concatenated, [N * hidden]
    pre   = sigmoid(m[:N] * scale[0] + base[:N]) + e_pre
    post  = p * sigmoid(m[N:2N] * scale[1] + base[N:2N]) + e_post
    comb  = sinkhorn(softmax(m[2N:] * scale[2] + base[2N:]) + e_s, k, e_s)   (only where fn has 2N + N*N rows)
    x     = sum_i pre_i * stream_i;   y = sublayer(norm(x))
    out_j = post_j * y + sum_i comb_ij * stream_i                   (comb the identity where there is none)
    head  = sum_i (sigmoid(m_h * scale_h + base_h) + e_h)_i * stream_i,   then the final norm

Read from what the code computes, not from names: the model's forward expands the embeddings into the streams
(scaffold.detect.streams); each module of the decoder layer and the module the model calls on the last layer's
streams are interpreted over numbers (scaffold.detect.evaluate) on random parameters of the shapes their __init__
declares, with every float config key the class reads set to a probe value of its own, and their outputs are
fitted to the form above: the numbers e_norm, e_pre, p, e_post, e_s, k are each a probe value (the config key the
port reads at run time), a number of the class's code, or zero; anything else is refused naming the class. The
decoder layer's forward is then interpreted with those modules and every other module opaque (a random map, the
call's order kept), and compared with the port's layer: mixer, norm, sublayer, write-back, twice.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import dataclass, field

import numpy as np

from scaffold.detect import dataflow, layerinputs, renamings, streams
from scaffold.detect.evaluate import DTYPE, CannotEvaluate, Interpreter, Limits, Obj, Sentinel
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, modeling_sources, subtree
from scaffold.spec import Source

TOKENS = 3
TOL = 1e-7
EXACT = 1e-12  # the same operations in float64
MAX_SINKHORN = 64


class Refused(Exception):
    """Hyper-connections the port does not compute, named with what differs."""


@dataclass(frozen=True)
class Number:
    """One number of the form: its value under config.json, and where it comes from (a config key the port reads,
    a number of the code)."""

    value: float
    key: str | None  # config key
    detail: str


@dataclass
class Mixer:
    attr: str  # the module's attribute in the decoder layer (or the model, for the head)
    cls: str
    where: str  # file:line of the class
    params: tuple[str, str, str]  # the matrix, the bias and the scales, by their attribute names
    numbers: dict[str, Number] = field(default_factory=dict)  # norm_eps, pre_eps (, post_scale, post_eps, ...)


@dataclass
class HyperConnections:
    streams: Number
    attn: Mixer
    mlp: Mixer
    head: Mixer
    model_cls: str
    layer_cls: str
    attn_chain: tuple[str, ...]  # the modules the layer calls between the attention's mixer and its write-back
    mlp_chain: tuple[str, ...]
    where: str  # file:line of the expansion


class _Sub(np.ndarray):
    """An opaque module's output: unpacked into a tuple, its first item (the attention's (out, weights))."""


class _Opaque:
    def __init__(self, attr: str, rng: np.random.Generator, calls: list):
        self.attr, self.rng, self.calls, self.maps = attr, rng, calls, {}

    def __call__(self, args: list, kwargs: dict):
        arrays = [a for a in list(args) + list(kwargs.values()) if isinstance(a, np.ndarray) and a.ndim >= 1]
        if not arrays:
            raise CannotEvaluate(f"self.{self.attr} called without a tensor")
        x = np.asarray(arrays[0], dtype=np.float64)
        width = x.shape[-1]
        if width not in self.maps:
            self.maps[width] = self.rng.standard_normal((width, width)) / math.sqrt(width)
        self.calls.append((self.attr, x.copy()))
        return np.tanh(x @ self.maps[width]).view(_Sub)


@dataclass
class _Module:
    cls: ast.ClassDef
    obj: Obj


class _Interp(Interpreter):
    """evaluate.py's interpreter with modules: classes of the sources built and called (their forward), parameters
    drawn at random, other modules opaque (random maps, their calls recorded in order)."""

    def __init__(self, classes: dict, functions: dict, rng: np.random.Generator, opaque: set[str] | None = None):
        super().__init__(functions, limits=Limits(depth=8))
        self.classes, self.rng, self.opaque = classes, rng, opaque
        self.calls: list = []  # (attr, input) of every module call on a layer's self, in order

    @staticmethod
    def truth(value) -> bool:
        if isinstance(value, np.ndarray) and value.size != 1:
            raise CannotEvaluate("a condition on a tensor")
        return bool(value)

    def stmt(self, stmt, env):
        if isinstance(stmt, ast.Raise):
            raise CannotEvaluate(f"line {stmt.lineno} raises")
        if isinstance(stmt, ast.Assert):
            return None
        return super().stmt(stmt, env)

    def assign(self, target, value, env):
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, _Sub):
            value = (np.asarray(value),) + (None,) * (len(target.elts) - 1)
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            owner = env.get(target.value.id)
            if isinstance(owner, Obj):
                owner.attrs[target.attr] = value
                return
        super().assign(target, value, env)

    def name(self, node, env):
        if node.id not in env and node.id in self.classes:
            return ("class", node.id)
        if node.id not in env and node.id in ("maybe_autocast", "autocast"):
            return ("context",)
        return super().name(node, env)

    def attribute(self, node, env):
        dotted = _dotted(node)
        if dotted.split(".")[0] in ("torch", "np", "numpy") and node.attr in ("float32", "float64", "bfloat16",
                                                                               "float16", "float", "long", "int64"):
            return DTYPE
        if isinstance(node.value, ast.Name) and node.value.id not in env and node.value.id not in (
                "torch", "np", "numpy", "nn", "F", "math"):
            return ("attribute", dotted)
        owner = self.expr(node.value, env)
        if isinstance(owner, _Module):
            owner = owner.obj
        if isinstance(owner, Obj):
            if node.attr in owner.attrs:
                return owner.attrs[node.attr]
            methods = getattr(owner, "methods", {})
            if node.attr in methods:
                return ("bound", owner, methods[node.attr])
            raise CannotEvaluate(f"line {node.lineno}: {owner.name}.{node.attr} is not set")
        if isinstance(owner, np.ndarray) and node.attr in ("dtype", "device"):
            return DTYPE
        if owner is DTYPE:
            return DTYPE
        return super().attribute(node, env)

    def call(self, node, env):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "__init__" or isinstance(func, ast.Name) and (
                func.id == "super" and func.id not in env):
            return Obj(name="super")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id not in env \
                and func.value.id in ("F", "nn", "torch") and func.attr in ("linear",):
            args, kwargs = self.call_args(node, env)
            weight = args[1] if len(args) > 1 else kwargs["weight"]
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            out = np.asarray(args[0]) @ np.asarray(weight).T
            return out + bias if bias is not None else out
        callee = self.expr(func, env) if not (isinstance(func, ast.Attribute) and func.attr in METHODS_EXTRA) \
            else None
        args, kwargs = self.call_args(node, env)
        if isinstance(func, ast.Attribute) and func.attr in METHODS_EXTRA:
            owner = self.expr(func.value, env)
            if isinstance(owner, np.ndarray):
                return METHODS_EXTRA[func.attr](np.asarray(owner), args, kwargs)
            callee = self.expr(func, env)
        if callee == ("context",):
            return Sentinel("context")
        if isinstance(callee, tuple) and callee[:1] == ("class",):
            return self.build(callee[1], args, kwargs, node)
        if isinstance(callee, tuple) and callee[:1] == ("bound",):
            return self.run(callee[2], callee[1], args, kwargs)
        if isinstance(callee, _Module):
            forward = _method(callee.cls, "forward")
            if forward is None:
                raise CannotEvaluate(f"line {node.lineno}: {callee.cls.name} has no forward")
            if self.opaque is not None and self.depth == 1 and isinstance(func, ast.Attribute) \
                    and _dotted(func.value) == "self":  # a call of the layer's own forward
                self.calls.append((func.attr, None))
            return self.run(forward, callee.obj, args, kwargs)
        if isinstance(callee, _Opaque):
            return callee(args, kwargs)
        if isinstance(callee, tuple) and callee[:1] == ("attribute",):
            raise CannotEvaluate(f"line {node.lineno}: call {callee[1]}")
        return self.apply(callee, args, kwargs, node)

    def build(self, name: str, args, kwargs, node=None):
        """An instance of a class of the sources: its __init__ run over `self` (an Obj with its methods)."""
        _, cls = self.classes[name]
        obj = Obj({"training": False}, "self")
        obj.methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        init = obj.methods.get("__init__")
        if init is not None:
            self.run(init, obj, args, kwargs)
        return _Module(cls, obj)

    def library(self, name, args, kwargs, node):
        dotted = _dotted(node.func)
        if name == "Parameter":
            value = args[0] if args else kwargs.get("data")
            if not isinstance(value, np.ndarray):
                raise CannotEvaluate(f"line {node.lineno}: a parameter of {type(value).__name__}")
            return self.rng.standard_normal(value.shape) * 0.5
        if name in ("zeros", "ones", "empty", "full", "randn"):
            shape = [a for a in args if not isinstance(a, Sentinel)]
            if name == "full":
                shape = shape[:1]
            shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (list, tuple)) else shape
            return np.zeros(self.shape_sized([int(s) for s in shape], node))
        if name == "square":
            return np.square(args[0])
        if name == "softmax":
            return self.method(np.asarray(args[0]), "softmax", args[1:], kwargs, node)
        if dotted.split(".")[0] in ("nn",) and name[:1].isupper():
            raise CannotEvaluate(f"line {node.lineno}: {dotted} built by a mixer")
        return super().library(name, args, kwargs, node)


def _square(x, args, kwargs):
    return np.square(x)


METHODS_EXTRA = {"square": _square, "t": lambda x, a, k: x.T if x.ndim == 2 else np.swapaxes(x, -1, -2),
                 "abs": lambda x, a, k: np.abs(x), "norm": None}
METHODS_EXTRA.pop("norm")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _functions(sources: dict) -> dict:
    return {n.name: n for _, tree in _parsed(sources) for n in tree.body if isinstance(n, ast.FunctionDef)}


def _config_key(expr: str | None, config: dict) -> str | None:
    """`self.config.K` / `config.K` / `self.cfg.K` (a dotted name ending in a key of config.json) -> K."""
    if not expr:
        return None
    parts = expr.split(".")
    if len(parts) >= 2 and all(p.isidentifier() for p in parts) and parts[-1] in config:
        return parts[-1]
    return None


def _probe_config(config: dict) -> tuple[Obj, dict[float, str]]:
    """config.json's values, every float (not a bool) replaced by a probe value of its own."""
    attrs, probes = {}, {}
    i = 0
    for key, value in config.items():
        if isinstance(value, float) and not isinstance(value, bool):
            probe = round(0.0113 + 0.0077 * i + 0.00013 * i * i, 6)
            i += 1
            attrs[key] = probe
            probes[probe] = key
        else:
            attrs[key] = value
    return Obj(attrs, "config"), probes


def _literals(cls: ast.ClassDef) -> set[float]:
    return {float(n.value) for n in ast.walk(cls) if isinstance(n, ast.Constant)
            and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)}


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _name_number(value: float, probes: dict[float, str], literals: set[float], config: dict, what: str,
                 cls: str) -> Number:
    """The probe value (a config key), a number of the code or zero that `value` is."""
    keys = [k for p, k in probes.items() if abs(value - p) <= 1e-6 * max(1.0, abs(p))]
    if len(keys) == 1:
        return Number(float(config[keys[0]]), keys[0], f"config.json {keys[0]}")
    codes = [c for c in literals | {0.0} if abs(value - c) <= 1e-6 * max(1.0, abs(c))]
    if codes:
        return Number(float(codes[0]), None, f"{cls}: the number {codes[0]:g} in its code")
    raise Refused(f"hyper-connections: {cls} computes its {what} with {value:.6g}, neither a config key it reads "
                  "nor a number of its code")


def _outputs(out, n: int, d: int, cls: str) -> dict[str, np.ndarray]:
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    found: dict[str, np.ndarray] = {}
    for item in items:
        if not isinstance(item, np.ndarray):
            continue
        a = np.asarray(item)
        if a.ndim >= 1 and a.shape[-1] == 1 and a.ndim == 4:
            a = a[..., 0]
        shape = a.shape[-2:] if a.ndim >= 4 else a.shape[-1:]
        kind = ("comb" if a.ndim == 4 and tuple(a.shape[-2:]) == (n, n)
                else "x" if a.ndim == 3 and a.shape[-1] == d
                else "post" if a.ndim == 3 and a.shape[-1] == n else None)
        if kind is None or kind in found:
            raise Refused(f"hyper-connections: {cls}.forward returns a tensor of shape {tuple(item.shape)} the port's "
                          f"form does not give ({shape})")
        found[kind] = a
    return found


def _params(module: _Module, n: int, d: int, head: bool) -> tuple[str, str, str]:
    """The matrix [R, N * hidden], the bias [R] and the scales the module holds, by attribute."""
    arrays = {k: v for k, v in module.obj.attrs.items() if isinstance(v, np.ndarray)}
    mats = [k for k, v in arrays.items() if v.ndim == 2 and v.shape[1] == n * d]
    rows = {arrays[k].shape[0] for k in mats}
    if len(mats) != 1:
        raise Refused(f"hyper-connections: {module.cls.name} holds {len(mats)} matrices over the concatenated "
                      "streams; the port's form has one")
    r = arrays[mats[0]].shape[0]
    biases = [k for k, v in arrays.items() if v.ndim == 1 and v.shape[0] == r]
    scales = [k for k, v in arrays.items() if v.ndim == 1 and k not in biases
              and v.shape[0] == (1 if head else (3 if r == 2 * n + n * n else 2))]
    if head and r != n or not head and r not in (2 * n, 2 * n + n * n) or len(biases) != 1 or len(scales) != 1:
        raise Refused(f"hyper-connections: {module.cls.name} holds {', '.join(f'{k} {arrays[k].shape}' for k in arrays)}"
                      f"; the port's form has a [{'N' if head else '2N or 2N + N*N'}, N * hidden] matrix, its bias "
                      "and one scale per part")
    del rows
    return mats[0], biases[0], scales[0]


def _fit(module: _Module, where: str, attr: str, interp: _Interp, n: int, d: int, head: bool, probes: dict,
         config: dict, streams_key: str | None = None) -> Mixer:
    """The module's numbers, fitted to the form (the module's docstring) from what it computes."""
    cls = module.cls.name
    fn_name, base_name, scale_name = _params(module, n, d, head)
    fn, base, scale = (np.asarray(module.obj.attrs[k]) for k in (fn_name, base_name, scale_name))
    if not head and fn.shape[0] == 2 * n + n * n:
        # Peaked mixing logits: Sinkhorn converges slowly from them, so the count of its iterations shows.
        scale = scale.copy()
        scale[2] = 6.0
        module.obj.attrs[scale_name] = scale
    forward = _method(module.cls, "forward")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, TOKENS, n, d)) * 0.3
    try:
        out = interp.call_function(forward, module.obj, [x])
    except CannotEvaluate as exc:
        raise Refused(f"hyper-connections: {cls}.forward ({where}) is not read: {exc}") from None
    found = {"x": np.asarray(out)} if head and isinstance(out, np.ndarray) else _outputs(out, n, d, cls)
    if "x" not in found or not head and "post" not in found or ("comb" in found) != (fn.shape[0] > 2 * n):
        raise Refused(f"hyper-connections: {cls}.forward ({where}) returns "
                      f"{', '.join(sorted(found)) or 'nothing the port reads'}; the port's form gives the sublayer's "
                      "input, the write-back weights and, with a matrix of 2N + N*N rows, the streams' mixing")
    literals = _literals(module.cls)
    flat = x.reshape(1, TOKENS, n * d)
    xs = x[0]  # [T, N, D]
    pre_true = np.stack([np.linalg.lstsq(xs[t].T, found["x"][0, t], rcond=None)[0] for t in range(TOKENS)])
    fitted = None
    for eps in sorted({*probes, *literals, 0.0}):
        m = (flat @ fn.T)[0] / np.sqrt(np.mean(flat[0] ** 2, axis=-1, keepdims=True) + eps)
        gate = _sigmoid(m[:, :n] * scale[0] + base[:n])
        diff = pre_true - gate
        if np.ptp(diff) < TOL and np.allclose(found["x"][0], np.einsum("tn,tnd->td", pre_true, xs), atol=1e-9):
            fitted = (eps, m, float(diff.mean()))
            break
    if fitted is None:
        raise Refused(f"hyper-connections: {cls}.forward ({where}) does not mix the streams into the sublayer's input "
                      "as sigmoid(rms-normed streams @ matrix x scale + bias) + eps, the port's form")
    eps, m, pre_eps = fitted
    numbers = {"norm_eps": _name_number(eps, probes, literals, config, "rms norm's eps", cls),
               "pre_eps": _name_number(pre_eps, probes, literals, config, "input weights' eps", cls)}
    if not head:
        gate = _sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n]).ravel()
        post = found["post"][0].ravel()
        design = np.stack([gate, np.ones_like(gate)], axis=1)
        (p, c), *_ = np.linalg.lstsq(design, post, rcond=None)
        if np.max(np.abs(design @ np.array([p, c]) - post)) > TOL:
            raise Refused(f"hyper-connections: {cls}.forward ({where}) computes the write-back weights otherwise than "
                          "p * sigmoid(rms-normed streams @ matrix x scale + bias) + eps, the port's form")
        numbers["post_scale"] = _name_number(float(p), probes, literals, config, "write-back weights' scale", cls)
        numbers["post_eps"] = _name_number(float(c), probes, literals, config, "write-back weights' eps", cls)
        if "comb" in found:
            numbers.update(_sinkhorn(found["comb"][0], m[:, 2 * n:], scale[2], base[2 * n:], n, probes, literals,
                                     config, cls, where, streams_key, module.cls))
    return Mixer(attr, cls, where, (fn_name, base_name, scale_name), numbers)


def _sinkhorn(comb: np.ndarray, logits, scale, base, n, probes, literals, config, cls, where,
              streams_key: str | None, cls_node: ast.ClassDef) -> dict:
    """k and e_s of sinkhorn(softmax(logits * scale + base) + e_s, k, e_s), as vLLM's mhc_pre computes it."""
    z = logits.reshape(-1, n, n) * scale + base.reshape(n, n)
    z = np.exp(z - z.max(-1, keepdims=True))
    z = z / z.sum(-1, keepdims=True)
    ints = {key: v for key, v in config.items() if isinstance(v, int) and not isinstance(v, bool)}
    reads = {node.attr for node in ast.walk(cls_node) if isinstance(node, ast.Attribute)}  # the class's config reads
    for eps in sorted({*probes, *literals, 0.0}):
        c = z + eps
        c = c / (c.sum(-2, keepdims=True) + eps)
        matched = []  # every count reproducing it to float64's rounding (a converged Sinkhorn repeats itself)
        for k in range(1, MAX_SINKHORN + 1):
            if k > 1:
                c = c / (c.sum(-1, keepdims=True) + eps)
                c = c / (c.sum(-2, keepdims=True) + eps)
            if np.max(np.abs(c - comb)) < EXACT:
                matched.append(k)
        if not matched:
            continue
        keys = sorted(key for key, v in ints.items() if v in matched and key != streams_key and key in reads)
        if len(keys) == 1:
            source = Number(float(ints[keys[0]]), keys[0], f"config.json {keys[0]}")
        elif len(matched) == 1 or not keys and matched[0] in literals:
            source = Number(float(matched[0]), None, f"{cls}: {matched[0]} iterations")
        else:
            raise Refused(f"hyper-connections: {cls}.forward ({where}) runs Sinkhorn iterations whose count the "
                          f"reader does not tell apart ({', '.join(map(str, matched[:4]))}: "
                          f"{', '.join(keys) or 'no config key'})")
        return {"sinkhorn_iters": source,
                "sinkhorn_eps": _name_number(eps, probes, literals, config, "mixing matrix's eps", cls)}
    raise Refused(f"hyper-connections: {cls}.forward ({where}) mixes the streams with a matrix the port's form does "
                  "not compute (softmax + eps, then Sinkhorn normalisation: columns, then rows and columns k - 1 "
                  "times)")


_READ: dict = {}  # (sources, config) -> read()'s answer: policy, forms, layout and detect each ask


def read(sources: dict, config: dict) -> HyperConnections | None:
    """The model's hyper-connections in the port's form; None where the model has none (streams.read finds no
    expansion); Refused naming what differs."""
    key = (tuple(sorted(sources.items())), json.dumps(config, sort_keys=True, default=str))
    if key not in _READ:
        try:
            _READ[key] = _read(sources, config)
        except Refused as exc:
            _READ[key] = exc
        if len(_READ) > 8:
            _READ.pop(next(iter(_READ)))
    found = _READ[key]
    if isinstance(found, Refused):
        raise Refused(str(found))
    return found


def _read(sources: dict, config: dict) -> HyperConnections | None:
    found = streams.read(sources)
    if found is None or not found.expanded:
        return None
    key = _config_key(found.copies, config)
    n = config.get(key) if key else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise Refused(f"{found}: the count of streams ({found.copies}) is not a config key config.json sets")
    d = config.get("hidden_size")
    if not isinstance(d, int) or d <= n:
        raise Refused(f"{found}: no hidden_size in config.json the reader can use")
    layer = dataflow.layer_class(sources)
    owners = layerinputs._stack_owners(sources)
    if layer is None or not owners:
        raise Refused(f"{found}: the decoder layer is not found")
    layer_file, layer_cls, _ = layer
    _, model_cls, _ = owners[0]
    classes = _classes(sources)
    functions = _functions(sources)
    probe, probes = _probe_config(config)
    rng = np.random.default_rng(0)
    interp = _Interp(classes, functions, rng)

    def modules_of(cls: ast.ClassDef) -> dict[str, tuple[str, ast.ClassDef, int]]:
        init = _method(cls, "__init__")
        out = {}
        for node in subtree(init) if init is not None else ():
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                    and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call):
                name = _dotted(node.value.func).rsplit(".", 1)[-1]
                if name in classes and _holds_parameters(classes[name][1], classes):
                    out[node.targets[0].attr] = (classes[name][0], classes[name][1], node.lineno)
        return out

    def instance(cls: ast.ClassDef, file: str) -> _Module:
        try:
            return interp.build(cls.name, [probe], {})
        except CannotEvaluate as exc:
            raise Refused(f"hyper-connections: {cls.name}.__init__ ({file}:{cls.lineno}) is not read: {exc}") from None
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise Refused(f"hyper-connections: {cls.name}.__init__ ({file}:{cls.lineno}) is not read: {exc}") from None

    # The layer's mixers: the modules of classes holding parameters of their own the layer's forward calls with the
    # streams (the others, the attention, the MLP and the norms, are the sublayers).
    layer_forward = _method(layer_cls, "forward")
    candidates = {a: v for a, v in modules_of(layer_cls).items() if _is_mixer_class(v[1], n, d, classes)}
    mixers: dict[str, Mixer] = {}
    built: dict[str, _Module] = {}
    for attr, (file, cls, _) in candidates.items():
        module = instance(cls, file)
        built[attr] = module
        mixers[attr] = _fit(module, f"{file}:{cls.lineno}", attr, interp, n, d, False, probes, config, key)
    # The layer's forward over numbers, the mixers as read, every other module opaque.
    calls = _layer_calls(layer_cls, layer_forward, built, classes, functions, n, d, layer_file)
    order = [a for a, _ in calls]
    mix_at = [i for i, a in enumerate(order) if a in mixers]
    if len(mix_at) != 2:
        raise Refused(f"hyper-connections: {layer_cls.name}.forward ({layer_file}:{layer_forward.lineno}) calls "
                      f"{len(mix_at)} stream mixers ({', '.join(order)}); the port's layer has one before the "
                      "attention and one before the MLP")
    first, second = order[mix_at[0]], order[mix_at[1]]
    chain1, chain2 = tuple(order[mix_at[0] + 1:mix_at[1]]), tuple(order[mix_at[1] + 1:])
    if len(chain1) != 2 or len(chain2) != 2:
        raise Refused(f"hyper-connections: {layer_cls.name}.forward ({layer_file}:{layer_forward.lineno}) runs "
                      f"{', '.join(chain1)} after self.{first} and {', '.join(chain2)} after self.{second}; the port's "
                      "layer runs a norm and the sublayer after each")
    _check_layer(layer_cls, layer_forward, built, mixers, (first, chain1), (second, chain2), classes, functions, n, d,
                 layer_file, {k: p for p, k in probes.items()})
    # The head: the module the model's forward calls on the last layer's streams, in the same form (pre only).
    heads = {a: v for a, v in modules_of(model_cls).items() if _is_mixer_class(v[1], n, d, classes, head=True)}
    if len(heads) != 1:
        raise Refused(f"{found}: {model_cls.name} builds {len(heads)} modules collapsing the streams "
                      f"({', '.join(heads) or 'none'}); the port's model has one head before the final norm")
    (head_attr, (head_file, head_cls, _)), = heads.items()
    head = _fit(instance(head_cls, head_file), f"{head_file}:{head_cls.lineno}", head_attr, interp, n, d, True,
                probes, config)
    for mixer in (mixers[first], mixers[second]):
        if mixer.params != mixers[first].params:
            raise Refused(f"hyper-connections: self.{first} and self.{second} hold their parameters under other names")
    return HyperConnections(Number(float(n), key, f"config.json {key}"), mixers[first], mixers[second], head,
                            model_cls.name, layer_cls.name, chain1, chain2, found.where)


def _holds_parameters(cls: ast.ClassDef, classes: dict) -> bool:
    return any(isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == "Parameter" for n in ast.walk(cls))


def _is_mixer_class(cls: ast.ClassDef, n: int, d: int, classes: dict, head: bool = False) -> bool:
    """A class whose __init__ declares three parameters or more and no linear layer, and whose forward returns a
    tuple (a mixer) or one value (a head): what a mixer or a head is built as (the attention, the MLP and the norms
    are not). The shapes of its parameters are held to the form once it is built (_params)."""
    init = _method(cls, "__init__")
    if init is None or any(isinstance(c, ast.Call) and _dotted(c.func).rsplit(".", 1)[-1] in ("Linear",)
                           for c in ast.walk(init)):
        return False
    forward = _method(cls, "forward")
    if forward is None:
        return False
    returns = [r for r in ast.walk(forward) if isinstance(r, ast.Return) and r.value is not None]
    tuple_out = any(isinstance(r.value, ast.Tuple) for r in returns)
    params = [c for c in ast.walk(init) if isinstance(c, ast.Call) and _dotted(c.func).rsplit(".", 1)[-1] == "Parameter"]
    return len(params) >= 3 and tuple_out != head


def _layer_calls(layer_cls, forward, built, classes, functions, n, d, file) -> list:
    interp = _Interp(classes, functions, np.random.default_rng(3), opaque=set())
    me = _layer_self(layer_cls, built, interp)
    x = np.random.default_rng(5).standard_normal((1, TOKENS, n, d)) * 0.3
    try:
        interp.call_function(forward, me, [x])
    except CannotEvaluate as exc:
        raise Refused(f"hyper-connections: {layer_cls.name}.forward ({file}:{forward.lineno}) is not read: "
                      f"{exc}") from None
    return interp.calls


def _layer_self(layer_cls, built, interp) -> Obj:
    """The layer's self: the mixers as read, every other module it builds opaque."""
    me = Obj({"training": False}, "self")
    me.methods = {f.name: f for f in layer_cls.body if isinstance(f, ast.FunctionDef)}
    init = _method(layer_cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and _dotted(node.targets[0].value) == "self":
            attr = node.targets[0].attr
            if attr in built:
                me.attrs[attr] = built[attr]
            elif isinstance(node.value, (ast.Call, ast.IfExp)):
                me.attrs[attr] = _Opaque(attr, interp.rng, interp.calls)
    return me


def _check_layer(layer_cls, forward, built, mixers, first, second, classes, functions, n, d, file, probed) -> None:
    """The layer's forward over numbers against the port's layer on the same modules."""
    interp = _Interp(classes, functions, np.random.default_rng(3), opaque=set())
    me = _layer_self(layer_cls, built, interp)
    x = np.random.default_rng(5).standard_normal((1, TOKENS, n, d)) * 0.3
    try:
        got = interp.call_function(forward, me, [x])
    except CannotEvaluate as exc:
        raise Refused(f"hyper-connections: {layer_cls.name}.forward ({file}:{forward.lineno}) is not read: "
                      f"{exc}") from None
    if isinstance(got, tuple) and got and isinstance(got[0], np.ndarray):
        got = got[0]  # (streams, what else the layer hands on: HY-V4's top-k indices)
    got = np.asarray(got)
    streams_ = x[0]
    for attr, chain in (first, second):
        mixer, module = mixers[attr], built[attr]
        inp, post, comb = port_mixer(mixer, module.obj.attrs, streams_, n, probed)
        y = inp[None]
        for name in chain:
            y = me.attrs[name]([y], {})
            y = np.asarray(y)
        y = y[0]
        mixed = streams_ if comb is None else np.einsum("tij,tid->tjd", comb, streams_)
        streams_ = post[..., None] * y[:, None, :] + mixed
    if got.shape != (1, TOKENS, n, d) or np.max(np.abs(got[0] - streams_)) > 1e-7:
        raise Refused(f"hyper-connections: {layer_cls.name}.forward ({file}:{forward.lineno}) writes the sublayers' "
                      "outputs back into the streams otherwise than the port's layer (post_j * output + "
                      "sum_i comb_ij * stream_i)")


def port_mixer(mixer: Mixer, attrs: dict, streams_: np.ndarray, n: int, probed: dict | None = None):
    """What the port's mixer computes (the module's docstring) from the numbers read; a config key's number at
    `probed`'s value where given (the probe the module was read with)."""
    fn, base, scale = (np.asarray(attrs[k]) for k in mixer.params)
    flat = streams_.reshape(streams_.shape[0], -1)
    nums = mixer.numbers
    value = {k: (v.value if v.key is None else (probed or {}).get(v.key, v.value)) for k, v in nums.items()}
    m = (flat @ fn.T) / np.sqrt(np.mean(flat ** 2, -1, keepdims=True) + value["norm_eps"])
    pre = _sigmoid(m[:, :n] * scale[0] + base[:n]) + value["pre_eps"]
    post = value["post_scale"] * _sigmoid(m[:, n:2 * n] * scale[1] + base[n:2 * n]) + value["post_eps"]
    comb = None
    if "sinkhorn_iters" in nums:
        eps = value["sinkhorn_eps"]
        z = m[:, 2 * n:].reshape(-1, n, n) * scale[2] + base[2 * n:].reshape(n, n)
        z = np.exp(z - z.max(-1, keepdims=True))
        c = z / z.sum(-1, keepdims=True) + eps
        c = c / (c.sum(-2, keepdims=True) + eps)
        for _ in range(int(nums["sinkhorn_iters"].value) - 1):
            c = c / (c.sum(-1, keepdims=True) + eps)
            c = c / (c.sum(-2, keepdims=True) + eps)
        comb = c
    return np.einsum("tn,tnd->td", pre, streams_), post, comb




def ported(sources: dict, config: dict) -> HyperConnections | None:
    """read(), None where it refuses (policy.check names the refusal)."""
    try:
        return read(sources, config)
    except Refused:
        return None


def renamed(ckpt, found: HyperConnections, model: str, layers: str) -> dict[str, str]:
    """Checkpoint suffix -> the code's, for the mixers' and the head's parameters the checkpoint keeps under other
    names (transformers' conversion table, scaffold.detect.renamings: HY-V4's `.hc_pre.hc_attn_layer.hc_fn` for the
    code's `.attn_hc.fn`, `.hc_pre.hc_head.hc_head_fn` for `.hc_head.hc_fn`)."""
    table = renamings.renamings(ckpt)
    if not table:
        return {}
    wanted = {f"{m.attr}.{p}" for m in (found.attn, found.mlp) for p in m.params}
    top = {f"{found.head.attr}.{p}" for p in found.head.params}
    out: dict[str, str] = {}
    for name in ckpt.tensors:
        code = renamings.code_name(table, name)
        if code == name:
            continue
        for whole in (f"{model}.{layers}.", f"{model}."):
            if not (name.startswith(whole) and code.startswith(whole)):
                continue
            rest, rest_code = name[len(whole):], code[len(whole):]
            if whole.endswith(f"{layers}.") and "." in rest:  # inside a layer: past the layer's index
                index, rest = rest.split(".", 1)
                index_code, rest_code = rest_code.split(".", 1)
                if index != index_code:
                    break
                if rest_code in wanted:
                    out[f".{rest}"] = f".{rest_code}"
            elif rest_code in top:
                out[f".{rest}"] = f".{rest_code}"
            break
    return out


def detect(ckpt, spec) -> None:
    """Set the hyper_* fields (none where the model keeps one residual stream)."""
    found = ported(modeling_sources(ckpt), ckpt.config) if ckpt.config.get("model_type") else None
    if found is None:
        spec.set("hyper_streams", 0, Source("default", "one residual stream (no hyper-connections)"))
        return
    n = found.streams
    spec.set("hyper_streams", int(n.value), Source("config", f"{n.detail}: {found.model_cls}.forward expands the "
                                                   f"embeddings into that many streams ({found.where})",
                                                   f"config.{n.key}"))
    attn, mlp, head = found.attn, found.mlp, found.head
    what = (f"{found.layer_cls}.forward: self.{attn.attr} and self.{mlp.attr} ({attn.cls}, {attn.where}) read over "
            "numbers")
    spec.set("hyper_mixers", [attn.attr, mlp.attr], Source("code", what))
    spec.set("hyper_params", list(attn.params), Source("code", f"{attn.cls}'s parameters: matrix, bias, scales"))
    spec.set("hyper_head", head.attr, Source("code", f"{found.model_cls}.forward collapses the streams with "
                                                     f"self.{head.attr} ({head.cls}, {head.where})"))
    spec.set("hyper_head_params", list(head.params), Source("code", f"{head.cls}'s parameters: matrix, bias, scale"))

    def number(field_name: str, num: Number, where: str) -> None:
        value = int(num.value) if field_name == "hyper_sinkhorn_iters" else float(num.value)
        spec.set(field_name, value, Source("config" if num.key else "code", f"{num.detail} ({where})",
                                           f"config.{num.key}" if num.key else None))

    for mixer in (attn, mlp):
        if mixer.numbers != attn.numbers:
            raise Refused(f"hyper-connections: self.{attn.attr} and self.{mlp.attr} compute with other numbers")
    for key, field_name in (("norm_eps", "hyper_norm_eps"), ("pre_eps", "hyper_pre_eps"),
                            ("post_scale", "hyper_post_scale"), ("post_eps", "hyper_post_eps"),
                            ("sinkhorn_iters", "hyper_sinkhorn_iters"), ("sinkhorn_eps", "hyper_sinkhorn_eps")):
        if key in attn.numbers:
            number(field_name, attn.numbers[key], attn.cls)
        else:
            spec.set(field_name, 0, Source("code", f"{attn.cls} keeps the streams unmixed"))
    names = spec.names
    if (names.get("attn_norm"), names.get("self_attn")) != found.attn_chain or (
            names.get("mlp_norm"), names.get("mlp")) != found.mlp_chain:
        raise Refused(f"hyper-connections: {found.layer_cls}.forward runs {', '.join(found.attn_chain)} and "
                      f"{', '.join(found.mlp_chain)} between its mixers and their write-backs; the port runs the "
                      "attention's norm and the attention, then the MLP's norm and the MLP")
    moved = renamed(ckpt, found, names["model"], names["layers"])
    spec.set("hyper_renamed", moved, Source("code", "transformers' conversion table for the model type "
                                                    "(conversion_mapping.py)" if moved else "the code's names"))
    number("hyper_head_norm_eps", head.numbers["norm_eps"], head.cls)
    number("hyper_head_eps", head.numbers["pre_eps"], head.cls)
