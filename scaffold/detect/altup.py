"""Alternating updates (Gemma-3n's AltUp) read from what the code computes, compared with vLLM's form of it.

Where scaffold.detect.streams finds the model's forward stacking N copies of the residual stream for its layers,
the model's forward and the decoder layer's are interpreted over numbers (scaffold.detect.evaluate, subclassed):
linears with random weights, every other module the code builds an opaque random map (each its own), the modules of
the layer the forward calls methods of (the AltUp module's predict / correct) and those that build linears of their
own (the low-rank residual branch, Laurel) interpreted from their own code. The reference is vLLM's Gemma-3n
(vllm/model_executor/models/gemma3n.py), followed value by value: at each step the module the code applied to the
reference's value is looked up among the calls the interpretation recorded, so the modules' roles come from the
values, not from their names:

- before the layers: copy 0 is the embeddings h0, copy i is proj_i(h0) rescaled to h0's root mean square:
  z * rms(h0) / sqrt(max(mean(z^2), eps)) (eps read as the number that reproduces the code where the floor
  acts);
- in each layer (active copy a):
  predict: c = P(tanh(R(n(x_a) / H))) as [N, N], x'_j = x_j + sum_k c[j, k] x_k;
  the layer on x'_a: h = norm_in(x'_a); l = h + norm_l(up(down(h))); s = (x'_a + norm_ao(attn(h)) + l) / sqrt(2);
  o = s + norm_mo(mlp(norm_mi(s)));
  correct: d = C(tanh(R(n(o) / H))) + 1, y_j = x'_j + d_j (o - x'_a);
  per-layer input: y_j += norm_p(proj(act(gate(y_a * scale)) * per_layer_input)) for j >= 1 (scale: a parameter
  of the AltUp module, where the code multiplies by it);
- after the layers: copy 0 as is, copy i unembed_i(y_i) rescaled to copy 0's root mean square as above, their mean
  the final norm's input.

`read` returns the form with every module's name as the checkpoint holds it, or raises Refused naming the step where
the code computes otherwise (or what the reader does not follow).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field, replace

import numpy as np

from scaffold.checkpoint import Checkpoint
from scaffold.detect import dataflow, layerinputs, streams
from scaffold.detect.common import unsupported
from scaffold.detect.evaluate import MODULES, VALUE_ERRORS, CannotEvaluate, Func, Interpreter, Limits, Obj, Sentinel
from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _dotted, _parsed, modeling_sources, subtree
from scaffold.spec import Source, Spec

TOKENS = 5
TOLERANCE = 1e-8
MAX_DEPTH = 6
TINY = 1e-4  # embeddings this small put the magnitude floor in force (mean squares ~1e-9 against eps ~1e-5)


class Refused(Exception):
    """AltUp computed otherwise than the port computes it (the message names what differs, with file:line)."""


@dataclass(frozen=True)
class AltUpForm:
    """What the port needs of AltUp, read from the code (module names as the checkpoint holds them)."""

    count: int
    count_expr: str | None  # config.K where the code reads the count from config.json
    active: int
    active_expr: str | None
    scale_output: bool  # the corrected active copy times the module's parameter before the per-layer gate
    scale_expr: str | None  # config.K where a config switch decides that
    eps: float  # the mean-square floor of the magnitude rescale
    module: str  # the layer's AltUp module
    prediction: str
    correction: str
    router: str
    router_norm: str
    output_scale: str  # the AltUp module's parameter
    projections: str  # the model's lists: copies 1.. before the layers, and after them
    unembed_projections: str
    laurel: str  # the layer's low-rank residual branch and its modules
    laurel_down: str
    laurel_up: str
    laurel_norm: str
    laurel_rank_expr: str | None
    roles: dict = field(default_factory=dict)  # the layer's modules by role: attn_norm, self_attn, ... (checked)
    evidence: str = ""


# ------------------------------------------------------------------ values of the interpretation
class _Lin:
    """A linear layer with random weights (nn.Linear, or a class the code's own linears read as one)."""

    def __init__(self, out_f: int, in_f: int, rng: np.random.Generator, bias: bool):
        self.weight = rng.standard_normal((out_f, in_f)) / math.sqrt(max(in_f, 1))
        self.bias = rng.standard_normal(out_f) * 0.1 if bias else None
        self.path = ""

    def __call__(self, x):
        out = np.asarray(x) @ self.weight.T
        return out + self.bias if self.bias is not None else out


class _Mod:
    """Any other module: an opaque random map of its input, its own for each module (by its path), lazily sized
    to the input's width; a tuple where the class's forward returns one (the attention's output, its weights)."""

    def __init__(self, cls: str, rng: np.random.Generator, returns: int = 0):
        self.cls, self.rng, self.returns, self.path = cls, rng, returns, ""
        self.maps: dict[int, tuple] = {}

    def __call__(self, x):
        x = np.asarray(x, dtype=np.float64)
        width = x.shape[-1]
        if width not in self.maps:
            self.maps[width] = (self.rng.standard_normal((width, width)) / math.sqrt(width),
                                self.rng.standard_normal(width) * 0.3)
        w, b = self.maps[width]
        out = np.tanh(x @ w + b) * 1.5 + 0.1 * x
        return (out,) + (None,) * (self.returns - 1) if self.returns > 1 else out


class _Inst(Obj):
    """An instance of one of the code's classes, interpreted: its attributes from its __init__, its methods."""

    def __init__(self, cls: ast.ClassDef, path: str):
        super().__init__({"training": False}, name="self")
        self.cls, self.path = cls, path
        self.methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


_ACT = Sentinel("ACT2FN")


class _Call:
    """A bound method of a value the interpreter keeps (a list's append, register_buffer)."""

    def __init__(self, fn):
        self.fn = fn
ARRAY_EXTRA = {"tanh", "clamp", "clamp_min", "clip", "mul", "add", "sub", "div"}
EXTRA = {"tanh", "mul", "multiply", "maximum", "minimum", "add", "sub", "subtract", "div", "divide"}


class _Run(Interpreter):
    """The shared interpreter with modules of its own: every module call is recorded (its path, input, output)."""

    def __init__(self, sources: dict, config: dict, rng: np.random.Generator, interpret: set[str]):
        functions = {n.name: n for _f, tree in _parsed(sources) for n in tree.body if isinstance(n, ast.FunctionDef)}
        super().__init__(functions, limits=Limits(steps=200000, depth=MAX_DEPTH))
        self.classes = {c.name: c for _f, tree in _parsed(sources) for c in subtree(tree)
                        if isinstance(c, ast.ClassDef)}
        self.linears = linear_classes(sources)
        self.config, self.rng, self.interpret = Obj(dict(config), name="config"), rng, interpret
        self.calls: list[tuple[str, np.ndarray, object]] = []

    # --- statements
    def stmt(self, stmt, env):
        if isinstance(stmt, ast.Raise):
            raise CannotEvaluate(f"line {stmt.lineno} raises")
        if isinstance(stmt, ast.Assert):
            return None
        return super().stmt(stmt, env)

    def assign(self, target, value, env):
        if isinstance(target, ast.Attribute):
            owner = self.expr(target.value, env)
            if isinstance(owner, Obj) and isinstance(value, (_Lin, _Mod, _Inst)) and not value.path:
                value.path = f"{getattr(owner, 'path', '')}.{target.attr}".lstrip(".")
            elif isinstance(owner, Obj) and isinstance(value, list):
                for k, item in enumerate(value):
                    if isinstance(item, (_Lin, _Mod, _Inst)) and not item.path:
                        item.path = f"{getattr(owner, 'path', '')}.{target.attr}.{k}".lstrip(".")
        super().assign(target, value, env)

    # --- names and attributes
    def name(self, node, env):
        if node.id in env:
            return env[node.id]
        if node.id == "ACT2FN":
            return _ACT
        if node.id in self.classes and node.id not in self.functions:
            return ("class", node.id)
        if node.id in self.linears:
            return ("ctor", node.id)
        return super().name(node, env)

    def attribute(self, node, env):
        dotted = _dotted(node)
        head = dotted.split(".")[0]
        if head in MODULES and head not in env:
            if node.attr in EXTRA:
                return ("library", node.attr)
            if node.attr[:1].isupper():
                return ("ctor", node.attr)
            return super().attribute(node, env)
        owner = self.expr(node.value, env)
        if isinstance(owner, _Inst):
            if node.attr in owner.attrs:
                return owner.attrs[node.attr]
            if node.attr in owner.methods:
                return Func(owner.methods[node.attr], owner)
            if node.attr == "register_buffer":
                return _Call(lambda args: owner.attrs.__setitem__(args[0], args[1]))
            raise CannotEvaluate(f"line {node.lineno}: self.{node.attr} is not set")
        if isinstance(owner, Obj) and owner.name == "config":
            if node.attr in owner.attrs:
                return owner.attrs[node.attr]
            raise CannotEvaluate(f"line {node.lineno}: config.{node.attr} is not in config.json")
        if isinstance(owner, np.ndarray) and node.attr in ARRAY_EXTRA:
            return ("method", owner, node.attr)
        if isinstance(owner, list) and node.attr == "append":
            return _Call(lambda args: owner.append(args[0]))
        if isinstance(owner, _Lin) and node.attr in ("weight", "bias"):
            return getattr(owner, node.attr)
        if owner is None and node.attr in ("device", "dtype"):
            raise CannotEvaluate(f"line {node.lineno}: attribute of None")
        return super().attribute(node, env)

    def subscript(self, node, env):
        value = self.expr(node.value, env)
        if value is _ACT:
            key = node.slice
            name = _dotted(key) if isinstance(key, ast.Attribute) else repr(getattr(key, "value", "?"))
            return _Mod(f"ACT2FN[{name}]", self.rng)
        return super().subscript(node, env)

    # --- calls
    def call(self, node, env):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("post_init", "apply", "gradient_checkpointing_enable"):
            raise CannotEvaluate(f"line {node.lineno}: {func.attr}")
        return super().call(node, env)

    def apply(self, func, args, kwargs, node):
        if isinstance(func, _Call):
            return func.fn(args)
        if isinstance(func, tuple) and func[:1] == ("ctor",):
            return self.construct(func[1], args, kwargs, node)
        if isinstance(func, tuple) and func[:1] == ("class",):
            return self.instance(func[1], args, kwargs, node)
        if isinstance(func, (_Lin, _Mod)):
            x = self._input(func, args, kwargs, node)
            out = func(x)
            self.calls.append((func.path, x, out[0] if isinstance(out, tuple) else out))
            return out
        if isinstance(func, _Inst):
            forward = func.methods.get("forward")
            if forward is None:
                raise CannotEvaluate(f"line {node.lineno}: {func.cls.name} has no forward")
            out = self.run(forward, func, args, kwargs)
            if args and isinstance(args[0], np.ndarray):
                self.calls.append((func.path, args[0], out))
            return out
        return super().apply(func, args, kwargs, node)

    def _input(self, module, args, kwargs, node):
        """The tensor a module call hands its module: the first argument (by its forward's first parameter where the
        module is of the code's own class)."""
        if args:
            x = args[0]
        else:
            cls = self.classes.get(module.cls) if isinstance(module, _Mod) else None
            forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None) \
                if cls is not None else None
            first = [a.arg for a in forward.args.args[1:2]] if forward is not None else []
            x = kwargs.get(first[0]) if first else next(iter(kwargs.values()), None)
        if not isinstance(x, np.ndarray):
            raise CannotEvaluate(f"line {node.lineno}: a module called on {type(x).__name__}")
        return x

    def construct(self, name, args, kwargs, node):
        """A library class built in __init__: linears, module lists, parameters and buffers; anything else is an
        opaque module."""
        kind = self.linears.get(name)
        if kind is not None:
            sizes = [int(a) for a in args[:2]] + [int(kwargs[k]) for k in ("in_features", "out_features")
                                                   if k in kwargs and len(args) < 2]
            if len(sizes) < 2:
                raise CannotEvaluate(f"line {node.lineno}: {name} without its widths")
            in_f, out_f = sizes[kind.in_arg], sizes[kind.out_arg]
            self.sized(in_f * out_f, node)
            bias = kwargs.get("bias", args[2] if len(args) > 2 else True)
            return _Lin(out_f, in_f, self.rng, bool(bias))
        if name in ("ModuleList", "Sequential") and args and isinstance(args[0], list):
            return list(args[0])
        if name == "Parameter":
            value = np.asarray(args[0] if args else kwargs.get("data"), dtype=np.float64)
            return self.rng.standard_normal(value.shape) * 0.5 + 0.5
        if name == "Buffer":
            return np.asarray(args[0] if args else kwargs.get("data"), dtype=np.float64)
        return _Mod(name, self.rng)

    def instance(self, name, args, kwargs, node):
        cls = self.classes[name]
        if name in self.interpret:
            inst = _Inst(cls, "")
            init = inst.methods.get("__init__")
            if init is not None:
                self.run(init, inst, args, kwargs)
            return inst
        forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
        returns = 0
        if forward is not None:
            outs = [n.value for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None]
            if outs and all(isinstance(o, ast.Tuple) for o in outs):
                returns = len(outs[0].elts)
        return _Mod(name, self.rng, returns)

    def library(self, name, args, kwargs, node):
        if name == "tanh":
            return np.tanh(args[0])
        if name in ("mul", "multiply"):
            return np.multiply(args[0], args[1])
        if name in ("add",):
            return np.add(args[0], args[1])
        if name in ("sub", "subtract"):
            return np.subtract(args[0], args[1])
        if name in ("div", "divide"):
            return np.divide(args[0], args[1])
        if name in ("maximum", "minimum"):
            return getattr(np, name)(np.asarray(args[0], dtype=np.float64), np.asarray(args[1], dtype=np.float64))
        if name == "Parameter":
            return self.construct("Parameter", args, kwargs, node)
        return super().library(name, args, kwargs, node)

    def method(self, owner, name, args, kwargs, node):
        if isinstance(owner, np.ndarray) and name == "tanh":
            return np.tanh(owner)
        if isinstance(owner, np.ndarray) and name in ("clamp", "clamp_min", "clip"):
            low = kwargs.get("min", args[0] if args else None)
            high = kwargs.get("max", args[1] if len(args) > 1 else None) if name != "clamp_min" else None
            return np.clip(owner, low, high)
        if isinstance(owner, np.ndarray) and name in ("mul", "add", "sub", "div"):
            return self.library(name, [owner, *args], kwargs, node)
        return super().method(owner, name, args, kwargs, node)


class _Tolerant(_Run):
    """The model's forward: statements the reader does not run (masks, caches, the rotary tables) are skipped and the
    names they assign forgotten; the layer loop is replaced by the stack the caller gives."""

    def __init__(self, *a, loop: ast.For, hidden: str, after_layers, **k):
        super().__init__(*a, **k)
        self.layer_loop, self.hidden, self.after_layers = loop, hidden, after_layers
        self.before: np.ndarray | None = None
        self.skipped: list[int] = []
        self.mark = 0

    def block(self, body, env):
        for stmt in body:
            self.step(stmt)
            if stmt is self.layer_loop:
                self.before = env.get(self.hidden)
                env[self.hidden] = self.after_layers.copy()
                self.mark = len(self.calls)
                continue
            if any(n is self.layer_loop for n in ast.walk(stmt)) and isinstance(stmt, (ast.If, ast.With, ast.For)):
                out = self._compound(stmt, env)
                if out is not None:
                    return out
                continue
            try:
                out = self.stmt(stmt, env)
            except (CannotEvaluate, *VALUE_ERRORS):
                # What the statement may have changed is unknown from here on: the names it assigns, the values
                # it assigns into (x[1:] = ..., x.a = ...) or calls a method of (x.mul_(2)).
                self.skipped.append(stmt.lineno)
                for name in _touched(stmt):
                    env.pop(name, None)
                continue
            if out is not None:
                return out
        return None

    def _compound(self, stmt, env):
        if isinstance(stmt, ast.If):
            return self.block(stmt.body if self.truth(self.expr(stmt.test, env)) else stmt.orelse, env)
        if isinstance(stmt, ast.With):
            return self.block(stmt.body, env)
        raise CannotEvaluate(f"line {stmt.lineno}: the layer loop inside another loop")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Starred)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _touched(stmt: ast.stmt) -> set[str]:
    """Names a statement may change: stored, stored into, or receiving a method call (but self)."""
    out = set()
    for node in ast.walk(stmt):
        if isinstance(getattr(node, "ctx", None), ast.Store):
            out.add(_root(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            out.add(_root(node.func.value))
    return out - {None, "self"}


# ------------------------------------------------------------------ the reading
def _rms(x):
    return np.sqrt(np.mean(x ** 2, axis=-1, keepdims=True))


def _rescale(z, target, eps):
    return z * _rms(target) / np.sqrt(np.maximum(np.mean(z ** 2, axis=-1, keepdims=True), eps))


def _close(a, b) -> bool:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=1e-7, atol=TOLERANCE))


def _found(calls, x, kinds=(_Lin, _Mod, _Inst), registry=None, exclude=()):
    """The first recorded call applied to x: (path, output)."""
    for path, seen, out in calls:
        if path in exclude or not _close(seen, x):
            continue
        module = registry.get(path) if registry is not None else None
        if registry is not None and not isinstance(module, kinds):
            continue
        return path, out
    return None


def _tree(obj, out: dict, prefix: str = "") -> dict:
    """path -> module for every module under an instance."""
    if isinstance(obj, _Inst):
        for v in obj.attrs.values():
            if isinstance(v, (_Lin, _Mod, _Inst)):
                out[v.path] = v
                _tree(v, out)
            elif isinstance(v, list):
                for item in v:
                    if isinstance(item, (_Lin, _Mod, _Inst)):
                        out[item.path] = item
                        _tree(item, out)
    return out


def _children(inst: _Inst) -> dict:
    return {k: v for k, v in inst.attrs.items() if isinstance(v, (_Lin, _Mod, _Inst, np.ndarray))}


def _short(path: str) -> str:
    return path.split(".", 1)[1] if "." in path else path


def _config_key(node_texts, config: dict, value) -> str | None:
    for text in node_texts:
        key = text.rsplit(".", 1)[-1]
        if text.split(".")[-2:-1] == ["config"] and key in config and config[key] == value \
                and isinstance(config[key], bool) == isinstance(value, bool):
            return f"config.{key}"
    return None


def read(sources: dict, config: dict, tensors=None) -> AltUpForm | None:
    """AltUp as the port computes it, read from the code; None where the model keeps one residual stream (or
    expands one into hyper-connections' streams); Refused naming what differs otherwise."""
    found = streams.read(sources)
    if found is None or found.expanded:
        return None
    owner = next(((f, c, s) for f, c, s in layerinputs._stack_owners(sources) if c.name == found.model_cls), None)
    layer = dataflow.layer_class(sources, owner[2] if owner else None)
    if owner is None or layer is None:
        raise Refused(f"{found}: the reader does not find the classes that compute it")
    file, model_cls, stack = owner
    layer_file, layer_cls, _line = layer
    where = f"{layer_file}:{layer_cls.lineno}"

    def refuse(what: str):
        raise Refused(f"alternating updates (AltUp) computed otherwise than the port computes them ({layer_cls.name}, "
                      f"{where}): {what}")

    # Which of the layer's modules are interpreted: those it calls methods of, and those building linears.
    interpret = _interpreted(sources, layer_cls)
    hidden = config.get("hidden_size")
    count_key = found.copies.rsplit(".", 1)[-1] if found.copies else None
    count = config.get(count_key) if count_key else None
    if count is None and found.copies and found.copies.isdigit():
        count = int(found.copies)
    if count is None and isinstance(hidden, int):  # the copies built by a comprehension: 1 + the lists' length
        count = _list_count(sources, config, model_cls, hidden)
        keys = {n.attr for c in (model_cls, layer_cls) for n in subtree(c) if isinstance(n, ast.Attribute)
                and _dotted(n.value).endswith("config") and config.get(n.attr) == count
                and not isinstance(config.get(n.attr), bool)}
        count_key = next(iter(keys)) if len(keys) == 1 else None
    if not isinstance(hidden, int) or not isinstance(count, int) or count < 2:
        refuse(f"the copies' count ({found.copies}) or hidden_size is not a number config.json gives")
    rng = np.random.default_rng(7)
    layer_form = _layer(sources, config, layer_cls, layer_file, interpret, hidden, count, rng, refuse)
    model_form = _model(sources, config, file, model_cls, stack, hidden, count, refuse)
    return AltUpForm(count=count, count_expr=f"config.{count_key}" if count_key in config else None,
                     **layer_form, **model_form,
                     evidence=f"{found.where}; {layer_file}:{layer_cls.lineno} ({layer_cls.name}.forward)")


def _list_count(sources, config, model_cls, hidden) -> int | None:
    """1 + the length of the model's lists of [hidden, hidden] linears, where they have one length."""
    init = next((n for n in model_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return None
    interp = _Tolerant(sources, config, np.random.default_rng(0), set(), loop=None, hidden="", after_layers=None)
    model = _Inst(model_cls, "model")
    model.attrs["config"] = interp.config
    params = [a.arg for a in init.args.args[1:]]
    try:
        interp.block(init.body, {"self": model, **{p: interp.config for p in params[:1]}})
    except CannotEvaluate:
        return None
    lengths = {len(v) for v in model.attrs.values() if isinstance(v, list) and v
               and all(isinstance(m, _Lin) and m.weight.shape == (hidden, hidden) for m in v)}
    return next(iter(lengths)) + 1 if len(lengths) == 1 else None


def _interpreted(sources: dict, layer_cls: ast.ClassDef) -> set[str]:
    init = next((n for n in layer_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    forward = next((n for n in layer_cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    called = {n.func.value.attr for n in subtree(forward) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Attribute)
              and _dotted(n.func.value.value) == "self"} if forward is not None else set()
    linears = linear_classes(sources)
    classes = {c.name: c for _f, tree in _parsed(sources) for c in subtree(tree) if isinstance(c, ast.ClassDef)}
    out = {layer_cls.name}
    for attr, value in dataflow._init_assignments(init).items():
        if not isinstance(value, ast.Call):
            continue
        name = _dotted(value.func).rsplit(".", 1)[-1]
        cls = classes.get(name)
        if cls is None:
            continue
        sub_init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        built = sum(isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] in linears
                    for n in subtree(sub_init)) if sub_init is not None else 0
        # The modules the layer calls methods of (AltUp's predict / correct), and those of one or two linears (a
        # low-rank branch): the attention and the MLP (more linears) stay opaque, their forms other detectors' reads.
        if attr in called or 1 <= built <= 2:
            out.add(name)
    return out


def _layer(sources, config, layer_cls, layer_file, interpret, hidden, count, rng, refuse) -> dict:
    """The decoder layer's forward against vLLM's Gemma-3n layer; the roles and AltUp's numbers."""
    interp = _Run(sources, config, rng, interpret)
    layer = _Inst(layer_cls, "layer")
    init = layer.methods.get("__init__")
    forward = layer.methods.get("forward")
    if init is None or forward is None:
        refuse("the layer has no __init__ or forward")
    params = [a.arg for a in forward.args.args[1:]]
    ctor = {"config": interp.config, "layer_idx": 0, "layer_index": 0, "idx": 0, "layer_id": 0}
    init_params = [a.arg for a in init.args.args[1:]]
    try:
        interp.call_function(init, layer, [], {p: ctor[p] for p in init_params if p in ctor})
    except CannotEvaluate as exc:
        refuse(f"the reader does not build the layer's modules ({exc})")
    modules = _tree(layer, {})
    # The per-layer input's width: the layer's own linear from the hidden width into a narrower one (its gate).
    widths = {v.weight.shape[0] for v in _children(layer).values() if isinstance(v, _Lin)
              and v.weight.shape[1] == hidden and v.weight.shape[0] != hidden}
    width = next(iter(widths)) if len(widths) == 1 else None
    x = rng.standard_normal((count, 1, TOKENS, hidden))
    # The per-layer input: the parameter the layer multiplies by its gate's output (tried in turn).
    candidates = [p for p in params[1:]]
    per_layer = rng.standard_normal((1, TOKENS, width)) if isinstance(width, int) else None
    out, used = None, None
    for p in candidates:
        interp.calls = []
        try:
            out = interp.call_function(forward, layer, [x.copy()], {p: per_layer} if per_layer is not None else {})
        except CannotEvaluate as exc:
            last = exc
            continue
        used = p
        break
    if used is None:
        refuse(f"the reader does not run the layer's forward ({last})")
    if isinstance(out, tuple):
        out = out[0]
    calls = interp.calls
    # The AltUp module: an interpreted module of the layer with a [count, hidden] linear (the router).
    altup = [m for m in _children(layer).values() if isinstance(m, _Inst)
             and any(isinstance(v, _Lin) and v.weight.shape == (count, hidden) for v in _children(m).values())]
    if len(altup) != 1:
        refuse(f"{len(altup)} modules of the layer hold a [{count}, {hidden}] router over the copies")
    alt = altup[0]
    kids = _children(alt)
    lin = {k: v for k, v in kids.items() if isinstance(v, _Lin)}
    router = next((k for k, v in lin.items() if v.weight.shape == (count, hidden)), None)
    prediction = next((k for k, v in lin.items() if v.weight.shape == (count * count, count)), None)
    correction = next((k for k, v in lin.items() if v.weight.shape == (count, count)), None)
    norms = [k for k, v in kids.items() if isinstance(v, _Mod)]
    scales = [k for k, v in kids.items() if isinstance(v, np.ndarray) and v.shape == (hidden,)]
    if None in (router, prediction, correction) or len(norms) != 1 or len(scales) != 1:
        refuse(f"{alt.cls.name} does not hold a router [{count}, {hidden}], prediction [{count}^2, {count}] and "
               f"correction [{count}, {count}] linears, one norm and one [{hidden}] parameter")
    R, P, C, n, scale = lin[router], lin[prediction], lin[correction], kids[norms[0]], kids[scales[0]]

    def route(v):
        return np.tanh(R(n(v) * (1.0 / hidden)))

    best = None
    for active in range(count):
        coefs = P(route(x[active])).reshape(*x.shape[1:3], count, count)  # [b, t, j, k]
        pred = np.einsum("btjk,kbth->jbth", coefs, x) + x
        a = pred[active]
        step = _follow(calls, modules, a, pred, x, active, count, route, C, scale, per_layer, out, alt, layer)
        if isinstance(step, dict):
            best = (active, step)
            break
        best = best or (active, step)
    active, step = best
    if not isinstance(step, dict):
        refuse(step)
    roles, scaled = step["roles"], step["scaled"]
    laurel = modules[f"layer.{roles['laurel']}"]
    lk = _children(laurel)
    down = next((k for k, v in lk.items() if isinstance(v, _Lin) and v.weight.shape[1] == hidden
                 and v.weight.shape[0] != hidden), None)
    up = next((k for k, v in lk.items() if isinstance(v, _Lin) and v.weight.shape[0] == hidden
               and v.weight.shape[1] != hidden), None)
    lnorm = next((k for k, v in lk.items() if isinstance(v, _Mod)), None)
    # Config keys the code reads for the active copy and the scale switch.
    texts = [_dotted(n.slice) for c in (layer_cls, alt.cls) for n in subtree(c)
             if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Attribute)]
    active_expr = _config_key(texts, config, active)
    switch = None
    for node in subtree(forward):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Attribute) and any(
                isinstance(n, ast.Attribute) and _dotted(n.value).endswith(roles["altup"]) for s in node.body
                for n in ast.walk(s)):
            key = node.test.attr
            if isinstance(config.get(key), bool) and config[key] == scaled:
                switch = f"config.{key}"
    rank_key = next((k for k, v in config.items() if isinstance(v, int) and not isinstance(v, bool)
                     and v == laurel.attrs[down].weight.shape[0] and "rank" in k), None) if down else None
    return {"active": active, "active_expr": active_expr, "scale_output": scaled, "scale_expr": switch, "module": roles["altup"],
                "prediction": prediction, "correction": correction, "router": router, "router_norm": norms[0],
                "output_scale": scales[0], "laurel": roles["laurel"], "laurel_down": down, "laurel_up": up, "laurel_norm": lnorm,
                "laurel_rank_expr": f"config.{rank_key}" if rank_key else None,
                "roles": {k: v for k, v in roles.items() if k not in ("altup", "laurel")}}


def _follow(calls, modules, a, pred, x, active, count, route, C, scale, per_layer, out, alt, layer):
    """vLLM's layer followed over the recorded calls: the roles (dict) where every step is found and the output
    matches, else a sentence naming the first step that is not."""
    roles = {"altup": alt.path.split(".", 1)[1]}
    own = {p for p in modules if p.startswith(alt.path + ".")}

    def find(value, kinds, what, exclude=()):
        hit = _found(calls, value, kinds, modules, exclude=set(exclude) | own)
        if hit is None:
            raise _Miss(f"no module of the layer is applied to {what}")
        return hit

    try:
        attn_norm, h = find(a, (_Mod,), "the active copy's prediction (vLLM's input_layernorm)")
        laurel, lo = find(h, (_Inst,), "the normed active copy by a module of linears (the low-rank branch, Laurel)")
        lk = _children(modules[laurel])
        lins = [v for v in lk.values() if isinstance(v, _Lin)]
        lnorms = [v for v in lk.values() if isinstance(v, _Mod)]
        if len(lins) != 2 or len(lnorms) != 1:
            raise _Miss(f"{modules[laurel].cls.name} holds {len(lins)} linears and {len(lnorms)} other modules, not "
                        "down, up and a norm")
        down = next((v for v in lins if v.weight.shape[1] == a.shape[-1]), None)
        up = next((v for v in lins if v is not down), None)
        if down is None or not _close(lo, h + lnorms[0](up(down(h)))):
            raise _Miss(f"{modules[laurel].cls.name} does not compute h + norm(up(down(h)))")
        attention, att = find(h, (_Mod,), "the normed active copy besides the low-rank branch (the attention)",
                              exclude={attn_norm, laurel})
        attn_post, att = find(att, (_Mod,), "the attention's output (post_attention_layernorm)")
        s = (a + att + lo) / math.sqrt(2.0)
        mlp_norm, m = find(s, (_Mod,), "(prediction + attention + Laurel) / sqrt(2) (pre_feedforward_layernorm)")
        mlp, m = find(m, (_Mod,), "the MLP's normed input", exclude={mlp_norm})
        mlp_post, m = find(m, (_Mod,), "the MLP's output (post_feedforward_layernorm)")
        o = s + m
        d = C(route(o)) + 1.0  # [b, t, count]
        corrected = np.moveaxis(d, -1, 0)[..., None] * (o - a)[None] + pred
        first = corrected[active]
        results = []
        for scaled in (True, False):
            y = first * scale if scaled else first
            hit = _found(calls, y, (_Lin,), modules)
            if hit is None:
                continue
            gate, g = hit
            act, g = find(g, (_Mod,), "the per-layer gate's output (its activation)")
            proj_in = g * per_layer
            proj, z = find(proj_in, (_Lin,), "act(gate(y)) * per_layer_input (the per-layer projection)")
            post, z = find(z, (_Mod,), "the per-layer projection's output (its norm)")
            want = corrected.copy()
            want[1:] += z
            if _close(out, want):
                results.append({"scaled": scaled, "roles": {
                    "altup": roles["altup"], "laurel": _short(laurel), "attn_norm": _short(attn_norm),
                    "self_attn": _short(attention), "attn_post_norm": _short(attn_post), "mlp_norm": _short(mlp_norm),
                    "mlp": _short(mlp), "mlp_post_norm": _short(mlp_post), "per_layer_input_gate": _short(gate),
                    "per_layer_input_act": _short(act), "per_layer_input_proj": _short(proj),
                    "per_layer_input_norm": _short(post)}})
            else:
                raise _Miss("what the layer returns is not the corrected copies with norm(proj(act(gate(y_a)) * "
                            "per_layer_input)) added to copies 1..")
        if not results:
            raise _Miss("no linear of the layer is applied to the corrected active copy (times the AltUp module's "
                        "parameter, or as it is): vLLM's correct step is y_j = x'_j + (C(tanh(R(n(o) / H))) + 1)_j "
                        "(o - x'_a)")
        return results[0]
    except _Miss as exc:
        return str(exc)


class _Miss(Exception):
    pass


def _model(sources, config, file, model_cls, stack, hidden, count, refuse) -> dict:
    """The model's forward around the layers: the copies built before them and merged after them."""
    forward = next((n for n in model_cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    init = next((n for n in model_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    found = streams._layer_loop(forward, stack) if forward is not None else None
    if found is None or init is None:
        refuse(f"the reader does not find {model_cls.name}'s layer loop")
    loop, call = found
    hidden_name = streams._hidden_argument(call)
    literals = sorted({n.value for n in subtree(model_cls) if isinstance(n, ast.Constant)
                       and isinstance(n.value, float) and 0 < n.value < 1e-2})
    outcome = {}
    for scale in (1.0, TINY):
        rng = np.random.default_rng(11)
        after = rng.standard_normal((count, 1, TOKENS, hidden))
        interp = _Tolerant(sources, config, rng, set(), loop=loop, hidden=hidden_name, after_layers=after)
        model = _Inst(model_cls, "model")
        model.attrs["config"] = interp.config  # PreTrainedModel.__init__(config) keeps it
        params = [a.arg for a in init.args.args[1:]]
        try:
            interp.block(init.body, {"self": model, **{p: interp.config for p in params[:1]}})
        except CannotEvaluate as exc:
            refuse(f"the reader does not build {model_cls.name}'s modules ({exc})")
        lists = {k: v for k, v in model.attrs.items() if isinstance(v, list) and len(v) == count - 1
                 and all(isinstance(m, _Lin) and m.weight.shape == (hidden, hidden) for m in v)}
        embed = _embedding(model, forward)
        if embed is None:
            refuse(f"the reader does not find the embedding {model_cls.name}.forward starts the stream with")
        h0 = rng.standard_normal((1, TOKENS, hidden)) * scale
        embed_mod = model.attrs[embed]
        embed_mod.__class__ = _Fixed
        embed_mod.value = h0
        fparams = [a.arg for a in forward.args.args[1:]]
        env = {"self": model, **{p: None for p in fparams}}
        env[fparams[0]] = np.zeros((1, TOKENS))
        try:
            interp.block(forward.body, env)
        except CannotEvaluate as exc:
            refuse(f"the reader does not run {model_cls.name}.forward ({exc})")
        before = interp.before
        if not isinstance(before, np.ndarray) or before.shape != (count, 1, TOKENS, hidden):
            refuse(f"{model_cls.name}.forward hands its layers "
                   f"{getattr(before, 'shape', type(before).__name__)}, not [{count}, batch, tokens, {hidden}] copies")
        final = [c for c in interp.calls[interp.mark:] if isinstance(c[1], np.ndarray) and c[1].shape[-1] == hidden]
        outcome[scale] = (lists, h0, before, after, final[-1][1] if final else None)
    lists, h0, before, after, _merged = outcome[1.0]
    pick = None
    for proj in lists:
        for unembed in lists:
            if proj == unembed:
                continue
            ok = True
            for scale in (1.0, TINY):
                ls, z0, bef, aft, mer = outcome[scale]
                eps_ok = [e for e in (literals or [1e-5]) if _close(bef, np.stack(
                    [z0] + [_rescale(m(z0), z0, e) for m in ls[proj]])) and mer is not None and _close(mer, np.mean(
                        np.stack([aft[0]] + [_rescale(m(aft[i + 1]), aft[0], e) for i, m in enumerate(ls[unembed])]),
                        axis=0))]
                if scale == TINY:
                    ok = ok and len(eps_ok) == 1
                    if ok:
                        pick = (proj, unembed, eps_ok[0])
                else:
                    ok = ok and bool(eps_ok)
    if pick is None:
        refuse(f"{model_cls.name}.forward does not build copy i as proj_i(h0) rescaled to h0's root mean square "
               "(sqrt(max(mean(z^2), eps))) and merge the copies as the mean of copy 0 and unembed_i(y_i) rescaled "
               f"to copy 0's (lists of {count - 1} [{hidden}, {hidden}] linears: {', '.join(lists) or 'none'})")
    return {"projections": pick[0], "unembed_projections": pick[1], "eps": float(pick[2])}


class _Fixed(_Mod):
    """The embedding that starts the stream: the same embeddings whatever the ids (the comparison's h0)."""

    value: np.ndarray

    def __call__(self, x):
        return self.value.copy()


def _embedding(model: _Inst, forward: ast.FunctionDef) -> str | None:
    """The attribute of the first module the forward calls on its first parameter (the token ids)."""
    first = forward.args.args[1].arg if len(forward.args.args) > 1 else None
    for node in sorted((n for n in subtree(forward) if isinstance(n, ast.Call)), key=lambda n: n.lineno):
        if isinstance(node.func, ast.Attribute) and _dotted(node.func.value) == "self" and node.args \
                and isinstance(node.args[0], ast.Name) and node.args[0].id == first \
                and isinstance(model.attrs.get(node.func.attr), _Mod):
            return node.func.attr
    return None


# ------------------------------------------------------------------ the detectors' view
def view(ckpt: Checkpoint, spec: Spec) -> Checkpoint:
    """`ckpt` without AltUp's tensors (the base model's two lists, each layer's AltUp module and low-rank branch),
    where the code computes vLLM's AltUp (read, above; the policy refused any other form), with spec.altup_* and
    laurel_* set; `ckpt` itself otherwise. The detectors then read the layer the port runs on the active copy."""
    sources = modeling_sources(ckpt)
    form = read(sources, ckpt.config, ckpt.tensors) if sources else None
    if form is None:
        spec.set("altup_num_inputs", 0, Source("default", "one residual stream"))
        return ckpt
    where, n = form.evidence, form.count
    lists = re.compile(rf"(?:\A|\.)({re.escape(form.projections)}|{re.escape(form.unembed_projections)})\.(\d+)\."
                       r"weight\Z")
    inside = re.compile(rf"\.(\d+)\.({re.escape(form.module)}|{re.escape(form.laurel)})\.(.+)\Z")
    kept, listed, held = {}, {}, {}
    for name, info in ckpt.tensors.items():
        if (m := lists.search(name)) is not None:
            listed.setdefault(m.group(1), {})[int(m.group(2))] = info.shape
        elif (m := inside.search(name)) is not None:
            held.setdefault(int(m.group(1)), {})[f"{m.group(2)}.{m.group(3)}"] = info.shape
        else:
            kept[name] = info
    hidden = spec.hidden_size or ckpt.config.get("hidden_size")
    square = [hidden, hidden]
    for attr in (form.projections, form.unembed_projections):
        if sorted(listed.get(attr, {})) != list(range(n - 1)) or any(list(s) != square
                                                                    for s in listed[attr].values()):
            raise unsupported(f"alternating updates whose list {attr} the checkpoint does not hold as {n - 1} "
                              f"[{hidden}, {hidden}] linears", ckpt.config_file, spec.model_type)
    rank = None
    m, lr = form.module, form.laurel
    for layer in range(spec.num_layers or ckpt.config.get("num_hidden_layers", 0)):
        shapes = held.get(layer, {})
        down = shapes.get(f"{lr}.{form.laurel_down}.weight")
        rank = rank or (down[0] if down else None)
        want = {f"{m}.{form.router}.weight": [n, hidden], f"{m}.{form.prediction}.weight": [n * n, n],
                f"{m}.{form.correction}.weight": [n, n], f"{m}.{form.router_norm}.weight": [hidden],
                f"{m}.{form.output_scale}": [hidden], f"{lr}.{form.laurel_down}.weight": [rank, hidden],
                f"{lr}.{form.laurel_up}.weight": [hidden, rank], f"{lr}.{form.laurel_norm}.weight": [hidden]}
        got = {k: list(v) for k, v in shapes.items()}
        if got != want:
            extra = sorted(set(got) ^ set(want)) or sorted(k for k in want if got.get(k) != want[k])
            raise unsupported(f"alternating updates whose tensors in layer {layer} are not the AltUp module's and the "
                              f"low-rank branch's the code builds (e.g. {extra[0]})", ckpt.config_file,
                              spec.model_type)
    code = Source("code", where)
    spec.set("altup_num_inputs", n, Source("code", where, form.count_expr))
    spec.set("altup_active_idx", form.active, Source("code", where, form.active_expr))
    spec.set("altup_correct_scale", form.scale_output,
             Source("config" if form.scale_expr else "code",
                    f"config.json {form.scale_expr.split('.', 1)[1]}" if form.scale_expr else where, form.scale_expr))
    spec.set("altup_eps", form.eps, Source("code", f"{where}: the copies' magnitude floor"))
    for field_name, value in (("altup_module", m), ("altup_router", form.router),
                              ("altup_router_norm", form.router_norm), ("altup_prediction", form.prediction),
                              ("altup_correction", form.correction), ("altup_output_scale", form.output_scale),
                              ("altup_projections", form.projections),
                              ("altup_unembed_projections", form.unembed_projections),
                              ("laurel_module", lr), ("laurel_down", form.laurel_down), ("laurel_up", form.laurel_up),
                              ("laurel_norm", form.laurel_norm)):
        spec.set(field_name, value, code)
    spec.set("laurel_rank", int(rank), Source("tensor", f"{lr}.{form.laurel_down}.weight: {rank} rows",
                                              form.laurel_rank_expr))
    return replace(ckpt, tensors=kept)
