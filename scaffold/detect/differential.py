"""Differential attention read from what the attention's code computes (DiffLlama's; arXiv 2410.05258).

The port's form, per layer (H query heads, KV key/value heads, head width d):

    v_lo, v_hi = the first and the second half of the value heads;  v1 = [v_lo, v_lo], v2 = [v_hi, v_hi]
    o1 = attention(q, k, v1), o2 = attention(q, k, v2)             (the same q and k, GQA over KV heads)
    o = [o1 | o2] per head (2d wide);  a, b = o's first and second H/2 heads   (head i pairs with i + H/2)
    lam = exp(sum(p1 * p2)) - exp(sum(p3 * p4)) + init(layer)        (p: vectors of the attention's own)
    out = (1 - init(layer)) * RMSNorm_2d(a - lam * b)  (no weight)   -> o_proj

`blocks.differential_attention` finds the weighted difference `A - S * B`; this module decides whether the
attention computes the form above. It does not match names: the attention class's __init__ and forward are
interpreted over numbers (numpy, float64: projections as random matrices, the attention calls as softmax
attention over causal positions, the rotary embedding as the identity it is to this comparison), at two sample
sizes and layer indices, and the value handed to the output projection is compared with the form above for each
way of pairing the four parameters. What is read for the port: the parameters' order (which pair is added,
which subtracted), `init` as an expression of the layer index (the code's own, plain arithmetic of numbers,
math.exp/log/sqrt and the index; anything else is named), and the norm's eps (its constructor's argument). A
form that computes otherwise (Microsoft's original pairs adjacent heads of 2H half-width queries and subtracts
the attention maps before multiplying by v; a norm with a weight) is refused naming what differs.
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass

import numpy as np

from scaffold.detect.evaluate import BUILTINS, DTYPE, MODULES, CannotEvaluate, Interpreter, Limits, Obj, Sentinel
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree
from scaffold.spec import init_problem

TOLERANCE = 1e-9
MAX_DEPTH = 4  # module-level helper calls followed
# The torch functions (and tensor methods) of the shared interpreter's library this reader follows; any other call
# of torch or nn, or of a class, builds a module the attention does not need (opaque until it is called).
FOLLOWED = frozenset({"chunk", "split", "cat", "concat", "concatenate", "stack", "exp", "sqrt", "log", "rsqrt",
                      "sigmoid", "sum", "mean", "matmul", "bmm", "softmax", "dropout"})
# (query heads, KV heads, head width, layer index) at which the attention is interpreted.
SAMPLES = ((4, 2, 4, 0), (8, 4, 6, 3))
TOKENS = 5
# Attention functions called the transformers way: f(module, q, k, v, mask, ...) -> (out [b, s, h, d], weights).
HF_ATTENTION = {"eager_attention_forward", "sdpa_attention_forward", "flash_attention_forward",
                "flex_attention_forward"}


@dataclass(frozen=True)
class Differential:
    """What the attention computes (see the module's docstring)."""

    lambdas: tuple[str, str, str, str]  # exp(sum(l0 * l1)) - exp(sum(l2 * l3))
    init: str  # the code's expression of layer_idx
    init_line: str  # file:line of that expression
    norm: str  # the attention's attribute holding the norm over each head pair
    eps: float
    eps_expr: str | None  # config.KEY the norm's eps is read from; None: a number of the code
    where: str  # file:line of the forward


_ROPE = Sentinel("rotary cos/sin")
_HF_ATTN = Sentinel("attention interface")


@dataclass
class _Linear:
    weight: np.ndarray
    bias: np.ndarray | None
    attr: str

    def __call__(self, x):
        out = x @ self.weight.T
        return out + self.bias if self.bias is not None else out


@dataclass
class _Norm:
    width: int
    eps: float
    weight: np.ndarray | None
    attr: str = ""

    def __call__(self, x):
        if x.shape[-1] != self.width:
            raise CannotEvaluate(f"a norm of width {self.width} over a last dimension of {x.shape[-1]}")
        out = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return out * self.weight if self.weight is not None else out


@dataclass
class _Opaque:
    cls: str
    line: int


def _is_self(value) -> bool:
    return isinstance(value, Obj) and value.name == "self"


def _attention(q, k, v, scale, transpose_out: bool):
    """Causal softmax attention with GQA (query head h reads KV head h // (H / KV)) over q, k, v laid out
    [b, h, s, d]; the output [b, h, s, d], or [b, s, h, d] where `transpose_out` (transformers' interface)."""
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4 or q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
        raise CannotEvaluate(f"attention over shapes {q.shape}, {k.shape}, {v.shape}")
    groups = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, groups, axis=1), np.repeat(v, groups, axis=1)
    scores = q @ np.swapaxes(k, -1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    s = scores.shape[-1]
    scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    out = weights @ v
    return np.swapaxes(out, 1, 2) if transpose_out else out


def _shape(args: list) -> list[int]:
    shape = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
    return [int(s) for s in shape if not isinstance(s, Sentinel)]


class _AttentionInterpreter(Interpreter):
    """The shared interpreter (evaluate.py) over the attention's methods, with the values of its own: its linears
    and norms (random weights from `rng`), the attention calls (causal softmax with GQA), the rotary embedding
    (the identity), the modules it builds and does not need (opaque until called). What reaches the output
    projection, the attention calls' and the norms' lines are kept in `captured`."""

    def __init__(self, functions: dict[str, ast.FunctionDef], rng: np.random.Generator, captured: dict):
        super().__init__(functions, limits=Limits(depth=MAX_DEPTH))  # the methods run as blocks: helpers only
        self.rng, self.captured = rng, captured

    def stmt(self, stmt: ast.stmt, env: dict) -> tuple | None:
        if isinstance(stmt, ast.Raise):
            raise CannotEvaluate(f"line {stmt.lineno} raises")
        if isinstance(stmt, ast.Assert):
            return None
        return super().stmt(stmt, env)

    @staticmethod
    def truth(value) -> bool:
        if isinstance(value, np.ndarray):
            raise CannotEvaluate("a condition on a tensor")
        return bool(value)

    def assign(self, target: ast.expr, value, env: dict) -> None:
        if isinstance(target, ast.Attribute):
            if not (isinstance(target.value, ast.Name) and _is_self(env.get(target.value.id))):
                raise CannotEvaluate(f"line {target.lineno}: assignment to {ast.unparse(target)}")
            if isinstance(value, (_Linear, _Norm)):
                value.attr = target.attr
        super().assign(target, value, env)

    def name(self, node: ast.Name, env: dict):
        if node.id not in env and (node.id in self.functions or node.id in HF_ATTENTION):
            return ("function", node.id)
        return super().name(node, env)

    def attribute(self, node: ast.Attribute, env: dict):
        dotted = _dotted(node)
        if dotted.split(".")[0] in ("torch", "np", "numpy") and node.attr.startswith(("float", "int", "bfloat",
                                                                                       "half", "double")):
            return DTYPE
        if isinstance(node.value, ast.Name) and node.value.id not in env:
            return ("attribute", dotted)
        owner = self.expr(node.value, env)
        if isinstance(owner, Obj) and owner.name in ("self", "config"):
            if node.attr in owner.attrs:
                return owner.attrs[node.attr]
            raise CannotEvaluate(f"line {node.lineno}: " + (f"self.{node.attr} is not set" if owner.name == "self"
                                                            else f"config.{node.attr} is not in config.json"))
        if isinstance(owner, np.ndarray) and node.attr in ("shape", "dtype", "device", "T"):
            return super().attribute(node, env)
        if isinstance(owner, _Linear) and node.attr in ("weight", "bias"):
            return getattr(owner, node.attr)
        raise CannotEvaluate(f"line {node.lineno}: attribute {dotted}")

    def call(self, node: ast.Call, env: dict):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "__init__" or isinstance(func, ast.Name) and (
                func.id == "super" and func.id not in env):
            return None  # super().__init__()
        name = _dotted(func).rsplit(".", 1)[-1] if not isinstance(func, ast.Call) else ""
        root = _dotted(func).split(".")[0] if isinstance(func, ast.Attribute) else ""
        # A method of a value: a tensor's, ALL_ATTENTION_FUNCTIONS.get_interface.
        on_self = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and _is_self(
            env.get(func.value.id))
        if not on_self and isinstance(func, ast.Attribute) and (root not in MODULES or root in env):
            if isinstance(func.value, ast.Name) and func.value.id not in env:
                # ALL_ATTENTION_FUNCTIONS.get_interface(...): transformers' attention, called its way.
                if name in ("get_interface", "get") and "ATTENTION" in func.value.id.upper():
                    return _HF_ATTN
                raise CannotEvaluate(f"line {node.lineno}: call {_dotted(func)}")
            receiver = self.expr(func.value, env)
            args, kwargs = self.call_args(node, env)
            if isinstance(receiver, (_Linear, _Norm)) and name == "forward":
                return receiver(*args)
            if isinstance(receiver, (np.ndarray, np.generic, float)):
                return self.method(np.asarray(receiver), name, [a for a in args if not isinstance(a, Sentinel)],
                                   kwargs, node)
            raise CannotEvaluate(f"line {node.lineno}: method {name} of {type(receiver).__name__}")
        if isinstance(func, ast.Name) and func.id in env:
            callee = env[func.id]
        elif isinstance(func, ast.Name) and (func.id in self.functions or func.id in HF_ATTENTION):
            callee = ("function", func.id)
        elif on_self:
            callee = self.expr(func, env)
        else:
            callee = None
        args, kwargs = self.call_args(node, env)
        # The rotary embedding: whatever takes the cos/sin of the positions hands q and k back (identity here).
        if any(a is _ROPE for a in args) or any(v is _ROPE for v in kwargs.values()):
            tensors = [a for a in args if isinstance(a, np.ndarray)]
            return tensors[0] if len(tensors) == 1 else tuple(tensors)
        if callee is _HF_ATTN or (isinstance(callee, tuple) and callee[:1] == ("function",)
                                  and callee[1] in HF_ATTENTION):
            self.captured.setdefault("attention_lines", []).append(node.lineno)
            if len(args) < 4:
                raise CannotEvaluate(f"line {node.lineno}: an attention call with {len(args)} arguments")
            return _attention(args[1], args[2], args[3], kwargs.get("scaling"), True), None
        if isinstance(callee, (_Linear, _Norm)):
            if len(args) != 1 or not isinstance(args[0], np.ndarray):
                raise CannotEvaluate(f"line {node.lineno}: {ast.unparse(func)} called with {len(args)} arguments")
            if isinstance(callee, _Linear) and callee.attr == self.captured.get("o_proj"):
                self.captured["o_proj_input"] = args[0]
                self.captured["o_proj_line"] = node.lineno
            if isinstance(callee, _Norm):
                self.captured.setdefault("norm_calls", []).append(callee.attr)
            return callee(args[0])
        if isinstance(callee, _Opaque):
            raise CannotEvaluate(f"line {node.lineno}: {ast.unparse(func)} ({callee.cls}, built at line {callee.line}) "
                                 "is called on the attention's values")
        if isinstance(callee, tuple) and callee[:1] == ("function",):
            return self.run(self.functions[callee[1]], None, args, kwargs)
        if callee is not None and not isinstance(callee, tuple):
            raise CannotEvaluate(f"line {node.lineno}: call of {ast.unparse(func)}")
        if isinstance(func, ast.Name) and func.id in BUILTINS and func.id not in ("getattr", "setattr", "hasattr"):
            return self.apply(BUILTINS[func.id], args, kwargs, node)
        if isinstance(func, ast.Name) and func.id == "bool":
            return bool(*args)
        return self.library(name, args, kwargs, node)

    def method(self, owner, name: str, args: list, kwargs: dict, node: ast.Call):
        if name == "softmax":
            self.captured.setdefault("softmax_lines", []).append(node.lineno)
        return super().method(owner, name, args, kwargs, node)

    def library(self, name: str, args: list, kwargs: dict, node: ast.Call):
        dotted = _dotted(node.func)
        if name == "softmax":
            self.captured.setdefault("softmax_lines", []).append(node.lineno)
        if name == "scaled_dot_product_attention":
            self.captured.setdefault("attention_lines", []).append(node.lineno)
            q, k, v = args[:3]
            if not kwargs.get("is_causal", len(args) > 5 and args[5]) and kwargs.get("attn_mask") is None:
                raise CannotEvaluate(f"line {node.lineno}: an attention without a causal mask")
            return _attention(q, k, v, kwargs.get("scale"), False)
        if name == "Linear":
            in_f, out_f = int(args[0]), int(args[1])
            bias = kwargs.get("bias", args[2] if len(args) > 2 else True)
            self.sized(in_f * out_f, node)
            return _Linear(self.rng.standard_normal((out_f, in_f)) / math.sqrt(in_f),
                           self.rng.standard_normal(out_f) * 0.1 if bias else None, "")
        if name == "RMSNorm" and dotted in ("nn.RMSNorm", "torch.nn.RMSNorm"):
            width = args[0] if args else kwargs["normalized_shape"]
            width = width[0] if isinstance(width, (list, tuple)) else width
            eps = kwargs.get("eps", args[1] if len(args) > 1 else None)
            if eps is None:
                raise CannotEvaluate(f"line {node.lineno}: an RMSNorm without an eps (torch's default: the dtype's)")
            affine = kwargs.get("elementwise_affine", args[2] if len(args) > 2 else True)
            self.sized(int(width), node)
            return _Norm(int(width), float(eps), 1.0 + 0.1 * self.rng.standard_normal(int(width)) if affine else None)
        if name == "Parameter":
            value = args[0] if args else kwargs.get("data")
            if not isinstance(value, np.ndarray):
                raise CannotEvaluate(f"line {node.lineno}: a parameter of {type(value).__name__}")
            return self.rng.standard_normal(value.shape) * 0.3
        if name in ("zeros", "ones", "empty", "randn", "rand"):
            # A parameter's initial value: its shape is what matters (Parameter draws the values).
            return np.zeros(self.shape_sized(_shape([a for a in args if not isinstance(a, Sentinel)]
                                                    or [kwargs["size"]]), node))
        if name == "normal" and "size" in kwargs:
            return np.zeros(self.shape_sized(_shape([kwargs["size"]]), node))
        if name == "getattr" and args and isinstance(args[0], Obj) and args[0].name in ("self", "config"):
            return args[0].attrs.get(args[1], args[2] if len(args) > 2 else None)
        if name in FOLLOWED:
            return super().library(name, args, kwargs, node)
        if dotted.split(".")[0] in ("nn", "torch") or name[:1].isupper():
            return _Opaque(dotted, node.lineno)  # a module the attention builds (dropout, a rotary class, ...)
        raise CannotEvaluate(f"line {node.lineno}: call {dotted or name}")


def _reference(q_w, k_w, v_w, q_b, k_b, v_b, x, heads, kv, d, lambdas, init, eps):
    """The port's form (the module's docstring) over the same weights and input."""
    def project(w, b, n):
        out = x @ w.T + (b if b is not None else 0.0)
        return np.swapaxes(out.reshape(x.shape[0], x.shape[1], n, d), 1, 2)  # [b, h, s, d]
    q, k, v = project(q_w, q_b, heads), project(k_w, k_b, kv), project(v_w, v_b, kv)
    lo, hi = v[:, : kv // 2], v[:, kv // 2:]
    o1 = _attention(q, k, np.concatenate([lo, lo], 1), None, True)  # [b, s, h, d]
    o2 = _attention(q, k, np.concatenate([hi, hi], 1), None, True)
    o = np.concatenate([o1, o2], -1)
    a, b = o[:, :, : heads // 2], o[:, :, heads // 2:]
    lam = math.exp(float(np.sum(lambdas[0] * lambdas[1]))) - math.exp(float(np.sum(lambdas[2] * lambdas[3]))) + init
    y = a - lam * b
    y = y / np.sqrt(np.mean(y * y, -1, keepdims=True) + eps)
    return ((1 - init) * y).reshape(x.shape[0], x.shape[1], heads * d)


def _init_expression(functions: dict, file: str, init: ast.FunctionDef, layer_param: str) -> tuple[str, str, str]:
    """(attribute, expression over layer_idx, file:line) of the one value __init__ computes from the layer index
    (`self.lambda_init = lambda_init_fn(layer_idx)`, or written in place); raises CannotEvaluate naming what is not plain
    arithmetic of numbers, math.exp/log/sqrt and the index."""
    found = []
    for node in subtree(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and not isinstance(node.value, ast.Name)
                and any(isinstance(n, ast.Name) and n.id == layer_param for n in subtree(node.value))):
            found.append(node)
    if len(found) != 1:
        raise CannotEvaluate(f"{len(found)} values computed from the layer index in {file}:{init.lineno}, not one")
    node, where = found[0], f"{file}:{found[0].lineno}"
    expr = node.value
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in functions:
        func = functions[expr.func.id]
        body = [s for s in func.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        params = [a.arg for a in func.args.args]
        if (len(body) != 1 or not isinstance(body[0], ast.Return) or len(params) != 1 or len(expr.args) != 1
                or not (isinstance(expr.args[0], ast.Name) and expr.args[0].id == layer_param)):
            raise CannotEvaluate(f"{where}: {ast.unparse(node)} calls {func.name}, which is not one returned expression of "
                           "the layer index")
        expr, param, where = body[0].value, params[0], f"{file}:{func.lineno} ({func.name})"
    else:
        param = layer_param
    text = ast.unparse(_Rename(param).visit(ast.parse(ast.unparse(expr), mode="eval")).body)
    problem = init_problem(text)
    if problem:
        raise CannotEvaluate(f"{where}: {problem}")
    return node.targets[0].attr, text, where


class _Rename(ast.NodeTransformer):
    def __init__(self, param: str):
        self.param = param

    def visit_Name(self, node: ast.Name) -> ast.Name:
        return ast.Name("layer_idx", ast.Load()) if node.id == self.param else node


def evaluate_init(text: str, layer: int) -> float:
    """The value of a checked init expression (spec.init_problem) at `layer`, numbers as floats, computed by the
    shared interpreter (numbers, layer_idx, + - * / ** and math.exp/log/sqrt: what init_problem lets through)."""
    if init_problem(text):
        raise CannotEvaluate(init_problem(text))
    tree = ast.parse(text, mode="eval")
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant):
            n.value = float(n.value)
    try:
        return float(Interpreter({}).evaluate(tree.body, {"layer_idx": float(layer)}))
    except CannotEvaluate as exc:
        raise CannotEvaluate(f"{text} at layer {layer}: {exc}") from None


def _norm_eps(init: ast.FunctionDef, attr: str) -> tuple[str | None, str]:
    """The eps argument of `self.<attr> = Norm(...)`: (config.KEY or None, its text)."""
    for node in subtree(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == attr and isinstance(node.value, ast.Call)):
            eps = next((k.value for k in node.value.keywords if k.arg == "eps"),
                       node.value.args[1] if len(node.value.args) > 1 else None)
            text = ast.unparse(eps) if eps is not None else ""
            if isinstance(eps, ast.Attribute) and _dotted(eps.value) == "config":
                return f"config.{eps.attr}", text
            return None, text
    return None, ""


def read(sources: dict, attention_cls: str, config: dict, projections: tuple[str, str, str, str],
         params: list[str]) -> Differential | str:
    """What `attention_cls` computes, if it is the port's differential attention (module docstring); else why not,
    naming file:line. `projections`: the attention's q, k, v and output projection attributes (as the dataflow
    read them); `params`: its own parameters the checkpoint holds (the four vectors)."""
    q, k, v, o_proj = projections
    found = _classes(sources).get(attention_cls)
    if found is None:
        return f"the attention class {attention_cls} is not in the modeling code"
    file, cls = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if init is None or forward is None:
        return f"{file}:{cls.lineno}: {attention_cls} has no __init__ or forward"
    where = f"{file}:{forward.lineno}"
    functions = {n.name: n for _f, tree in _parsed(sources) for n in tree.body if isinstance(n, ast.FunctionDef)}
    # __init__(self, config, layer_idx, ...): the config first; the layer index the one other parameter, or among
    # several the one named for it.
    init_params = [a.arg for a in init.args.args[1:]]
    rest = init_params[1:]
    layer_param = rest[0] if len(rest) == 1 else next(
        (p for p in rest if any(w in p for w in ("layer", "idx", "index", "depth"))), None)
    if not init_params or layer_param is None:
        return f"{file}:{init.lineno}: {attention_cls}.__init__ takes no layer index"
    try:
        init_attr, init_text, init_where = _init_expression(functions, file, init, layer_param)
    except CannotEvaluate as exc:
        return f"the weight's offset from the layer index is not read: {exc}"
    if len(params) != 4:
        return f"the weight is computed from {len(params)} parameters of the attention's own ({', '.join(params)}), " \
               "not four vectors"
    results = []
    for heads, kv, d, layer in SAMPLES:
        rng = np.random.default_rng(heads * 100 + layer)
        values = dict(config)
        hidden = heads * d
        values.update({"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": d})
        captured: dict = {"o_proj": o_proj}
        run = _AttentionInterpreter(functions, rng, captured)
        me = Obj({"training": False, "is_causal": True}, "self")
        env = {"self": me}
        for p in init_params:
            env[p] = Obj(values, "config") if p == init_params[0] else layer if p == layer_param else None
        for a, d_ in zip(init.args.args[len(init.args.args) - len(init.args.defaults):], init.args.defaults):
            if env.get(a.arg) is None and a.arg != layer_param:
                env[a.arg] = run.evaluate(d_, {})
        try:
            run.call_block(init.body, env)
        except CannotEvaluate as exc:
            return f"{file}:{init.lineno}: {attention_cls}.__init__ is not followed at {heads} heads ({exc})"
        x = rng.standard_normal((1, TOKENS, hidden))
        fparams = [a.arg for a in forward.args.args[1:]]
        fenv = {"self": me}
        for i, p in enumerate(fparams):
            fenv[p] = x if i == 0 else (_ROPE, _ROPE) if any(w in p for w in ("position_embeddings", "rotary",
                                                                                 "freqs", "cos_sin")) else None
        if forward.args.kwarg is not None:
            fenv[forward.args.kwarg.arg] = {}
        try:
            run.call_block(forward.body, fenv)
        except CannotEvaluate as exc:
            return f"{where}: {attention_cls}.forward is not followed ({exc})"
        if "o_proj_input" not in captured:
            return f"{where}: {attention_cls}.forward does not call self.{o_proj}"
        linears = {v.attr: v for v in me.attrs.values() if isinstance(v, _Linear)}
        norms = [v for v in me.attrs.values() if isinstance(v, _Norm)]
        results.append((heads, kv, d, layer, x, linears, me, captured, norms))
    # What differs from the port's form, before comparing numbers.
    heads, kv, d, layer, x, linears, me, captured, norms = results[0]
    lines = captured.get("attention_lines", [])
    if len(lines) != 2:
        softmax = captured.get("softmax_lines", [])
        return (f"{where}: the forward computes {len(lines)} attention call(s)"
                + (f" and its own softmax (line {', '.join(map(str, softmax))})" if softmax else "")
                + "; the port computes two attentions over the same q and k, one per half of the value heads, and "
                  "subtracts their outputs (attention maps subtracted before multiplying by v, over heads paired "
                  "otherwise, are not that form)")
    if not norms or any(n.weight is not None for n in norms) or len(set(captured.get("norm_calls", []))) != 1:
        return (f"{where}: the difference is not normed by one RMSNorm without a weight (norms: "
                f"{', '.join(f'{n.attr} weighted' if n.weight is not None else n.attr for n in norms) or 'none'})")
    norm_attr = captured["norm_calls"][0]
    norm = next(n for n in norms if n.attr == norm_attr)
    eps_expr, eps_text = _norm_eps(init, norm_attr)
    if eps_expr is None:
        try:
            float(ast.literal_eval(eps_text))
        except (ValueError, SyntaxError):
            return f"{file}:{init.lineno}: the norm's eps ({eps_text or 'not given'}) is neither a config key nor a number"
    try:
        init_values = [evaluate_init(init_text, r[3]) for r in results]
    except CannotEvaluate as exc:
        return f"{init_where}: {exc}"
    if any(abs(r[6].attrs.get(init_attr, math.nan) - v) > TOLERANCE for r, v in zip(results, init_values)):
        return f"{init_where}: self.{init_attr} is not the value of {init_text}"
    if not {q, k, v} <= set(linears):
        return f"{where}: the q, k and v projections ({q}, {k}, {v}) are not linears the attention builds"
    matched = []
    for pair in itertools.combinations(params, 2):
        rest = tuple(p for p in params if p not in pair)
        order = (*pair, *rest)
        ok = True
        for (heads, kv, d, layer, x, lin, me, captured, _n), init_value in zip(results, init_values):
            try:
                expected = _reference(lin[q].weight, lin[k].weight, lin[v].weight, lin[q].bias, lin[k].bias,
                                      lin[v].bias, x, heads, kv, d, [me.attrs[p] for p in order], init_value,
                                      next(n.eps for n in _n if n.attr == norm_attr))
            except (ValueError, KeyError):
                ok = False
                break
            got = captured["o_proj_input"]
            if got.shape != expected.shape or not np.allclose(got, expected, atol=TOLERANCE, rtol=0):
                ok = False
                break
        if ok:
            matched.append(order)
    if len(matched) != 1:
        return (f"{where}: what reaches {o_proj} (line {captured['o_proj_line']}) is not "
                "(1 - init) * RMSNorm(a - (exp(sum(p1 * p2)) - exp(sum(p3 * p4)) + init) * b) with a, b the first and "
                "second half of the heads of [attention(q, k, [v_lo, v_lo]) | attention(q, k, [v_hi, v_hi])] for any "
                f"pairing of {', '.join(params)}")
    return Differential(matched[0], init_text, init_where, norm_attr, norm.eps, eps_expr, where)

