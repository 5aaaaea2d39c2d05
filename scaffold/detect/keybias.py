"""A per-key bias on the attention scores computed from the keys' own values, and residuals scaled by parameters of
the layer (Doge's dynamic mask attention and its learned residuals), read from what the code computes.

Doge's attention hands its attention function a mask built from the values:

    dt = self.dt_proj(values of every key, [B, K, KVH * D])          # one number per key and KV head
    bias = exp(self.A * softplus(dt))                                 # [B, KVH, K]
    mask = bias[:, :, None, :].expand(...) masked_fill(causal, min)   # the same for every query
    if K > keep_window_size: keep the top keep_window_size keys of each query's row

An additive bias b_j of key j is what vLLM's attention computes where each head is widened by one column:
q' = [q, 1], k' = [k, b_j / scale]; the bias then rides in the KV cache with its key. Where a query sees at most
keep_window_size keys, the top-k keeps every one of them, so the port serves up to that many tokens and refuses a
longer max_model_len at load.

The bias is not matched as text: the statements from the projection of the values to the mask the attention call
receives (the helper methods and functions they call inlined) are interpreted over numbers at one visible key
(the causal mask 0 there, True as a boolean mask) and one hidden key, at sample points of the parameter and the
projection's output, and compared with exp(P * softplus(x)); the key axis must be the mask's last (the query axis
inserted before it). A branch whose condition the numbers do not decide is taken both ways and must agree, except
a length test guarding a top-k of the keys (the keep window, followed to its config key). Anything else is named,
not guessed.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from scaffold.detect import formcode as forms
from scaffold.detect import sourcecode
from scaffold.detect.blocks import _method, _parameters
from scaffold.detect.sourcecode import subtree

# Sample points of the parameter (P) and of the projection's output (x).
SAMPLES = [(a, x) for a in (-1.7, -0.3, 0.45, 1.2) for x in (-6.0, -0.8, 0.0, 0.9, 3.5, 25.0)]
HIDDEN_LIMIT = -1e30  # a hidden key's mask at or below this is masked (finfo(float32).min is -3.4e38)
FLOAT_MIN = -3.4028234663852886e38
SHAPE_METHODS = {"transpose", "permute", "view", "reshape", "expand", "expand_as", "contiguous", "unsqueeze",
                 "squeeze", "flatten", "to", "float", "type_as", "repeat", "clone", "repeat_interleave", "detach",
                 "view_as", "reshape_as", "movedim"}
FUNCTIONS = {"exp": math.exp, "log": math.log, "sigmoid": lambda v: 1 / (1 + math.exp(-v)), "tanh": math.tanh,
             "softplus": lambda v: v if v > 20 else math.log1p(math.exp(v)), "abs": abs,
             "relu": lambda v: max(v, 0.0), "sqrt": math.sqrt}


@dataclass(frozen=True)
class KeyBias:
    proj: str  # the attention's projection of the values (Doge's dt_proj)
    param: str  # the parameter the softplus is multiplied by (Doge's A)
    window: str | None  # the config key of the keep window (keep_window_size), None: no top-k
    window_value: int | None  # a number the code sets itself, where it reads no config key
    evidence: str


class Unmatched(Exception):
    """A mask computed from the attention's parameters that is not this bias: the message names what differs."""


class _Unknown(Exception):
    pass


class _Causal:
    """The causal mask at one key: visible (0 as an additive mask, True as a boolean one) or hidden."""

    def __init__(self, visible: bool):
        self.visible = visible

    def number(self) -> float:
        return 0.0 if self.visible else FLOAT_MIN


_UNKNOWN = object()


class _Frame:
    def __init__(self, file: str, cls: ast.ClassDef, env: dict, exprs: dict):
        self.file, self.cls, self.env, self.exprs = file, cls, env, exprs


class _Interp:
    def __init__(self, classes: dict, module_functions: dict, params: set[str], sample: dict[str, float]):
        self.classes, self.functions, self.params, self.sample = classes, module_functions, params, sample
        self.used: set[str] = set()
        self.windows: list[tuple[ast.If, ast.AST, _Frame]] = []
        self.query_axis: list[ast.AST] = []
        self.key_axis_last_violations: list[ast.AST] = []
        self.depth = 0

    # ---------------------------------------------------------------- statements
    def run(self, body: list[ast.stmt], frame: _Frame):
        """Runs statements; returns ("return", value) or ("end", None)."""
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.Return):
                return "return", self.value(stmt.value, frame) if stmt.value is not None else None
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if stmt.value is None:
                    continue
                try:
                    value = self.value(stmt.value, frame)
                except _Unknown:
                    value = _UNKNOWN
                for target in targets:
                    self.bind(target, value, stmt.value, frame)
                continue
            if isinstance(stmt, ast.If):
                window = self._window(stmt, frame)
                if window is not None:
                    self.windows.append(window)
                    continue  # the port serves the lengths this branch leaves alone
                try:
                    test = self.truth(stmt.test, frame)
                except _Unknown:
                    test = None
                if test is not None:
                    outcome = self.run(stmt.body if test else stmt.orelse, frame)
                    if outcome[0] == "return":
                        return outcome
                    continue
                # Undecided: both ways, each with what follows; they must agree on what is returned, and a name
                # they leave different is unknown after it.
                results = []
                for branch in (stmt.body, stmt.orelse):
                    sub = _Frame(frame.file, frame.cls, dict(frame.env), dict(frame.exprs))
                    results.append((self.run(branch + body[i + 1:], sub), sub))
                ((kind0, value0), sub0), ((kind1, value1), sub1) = results
                if kind0 != kind1 or kind0 == "return" and not _same(value0, value1):
                    raise _Unknown(stmt)
                for name in set(sub0.env) | set(sub1.env):
                    a, b = sub0.env.get(name, _UNKNOWN), sub1.env.get(name, _UNKNOWN)
                    frame.env[name] = a if _same(a, b) else _UNKNOWN
                    if name in sub0.exprs:
                        frame.exprs[name] = sub0.exprs[name]
                return kind0, value0
            if isinstance(stmt, (ast.Expr, ast.Pass, ast.Assert)):
                continue
            raise _Unknown(stmt)
        return "end", None

    def bind(self, target: ast.AST, value, expr: ast.AST, frame: _Frame) -> None:
        if isinstance(target, ast.Name):
            frame.env[target.id] = value
            frame.exprs[target.id] = expr
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self.bind(element, _UNKNOWN, expr, frame)

    # ---------------------------------------------------------------- the keep window
    def _window(self, stmt: ast.If, frame: _Frame):
        """`if <length of the keys> > W:` around a top-k: (the if, W's expression, the frame)."""
        if not any(isinstance(n, ast.Call) and forms._callee(n) == "topk" for s in stmt.body for n in subtree(s)):
            return None
        test = stmt.test
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1
                and isinstance(test.ops[0], (ast.Gt, ast.GtE, ast.Lt, ast.LtE))):
            raise Unmatched(f"a top-k of the keys under a condition the port does not follow "
                            f"({forms._where(frame.file, stmt)}: {forms._line(test, 60)})")
        left, right = test.left, test.comparators[0]
        length = left if isinstance(test.ops[0], (ast.Gt, ast.GtE)) else right
        bound = right if length is left else left
        if not any(isinstance(n, ast.Attribute) and n.attr == "shape" or isinstance(n, ast.Call)
                   and forms._callee(n) == "size" for n in subtree(length)):
            raise Unmatched(f"a top-k of the keys under a condition that is not the keys' count "
                            f"({forms._where(frame.file, stmt)}: {forms._line(test, 60)})")
        return stmt, bound, frame

    # ---------------------------------------------------------------- expressions
    def truth(self, node: ast.AST, frame: _Frame) -> bool:
        value = self.value(node, frame)
        if isinstance(value, _Causal):
            return value.visible
        if value is _UNKNOWN or not isinstance(value, (bool, int, float)):
            raise _Unknown(node)
        return bool(value)

    def number(self, node: ast.AST, frame: _Frame) -> float:
        value = self.value(node, frame)
        if isinstance(value, _Causal):
            return value.number()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Unknown(node)
        return float(value)

    def value(self, node: ast.AST, frame: _Frame):
        if isinstance(node, ast.Constant):
            if node.value is None or isinstance(node.value, (int, float, bool)):
                return node.value
            raise _Unknown(node)
        if isinstance(node, ast.Name):
            if node.id not in frame.env or frame.env[node.id] is _UNKNOWN:
                raise _Unknown(node)
            return frame.env[node.id]
        if isinstance(node, ast.Attribute):
            if forms._dotted(node.value) == "self" and node.attr in self.params:
                self.used.add(node.attr)
                return self.sample[node.attr]
            if node.attr == "min" and isinstance(node.value, ast.Call) and forms._callee(node.value) == "finfo":
                return FLOAT_MIN
            raise _Unknown(node)
        if isinstance(node, ast.BinOp):
            left, right = self.number(node.left, frame), self.number(node.right, frame)
            try:
                if isinstance(node.op, ast.Add):
                    return left + right
                if isinstance(node.op, ast.Sub):
                    return left - right
                if isinstance(node.op, ast.Mult):
                    return left * right
                if isinstance(node.op, ast.Div):
                    return left / right
                if isinstance(node.op, ast.Pow):
                    return left ** right
            except (ZeroDivisionError, OverflowError):
                raise _Unknown(node) from None
            raise _Unknown(node)
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return -self.number(node.operand, frame)
            if isinstance(node.op, ast.UAdd):
                return self.number(node.operand, frame)
            if isinstance(node.op, (ast.Not, ast.Invert)):
                return not self.truth(node.operand, frame)
            raise _Unknown(node)
        if isinstance(node, ast.BoolOp):
            values = [self.truth(v, frame) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare) and len(node.ops) == 1:
            op, right = node.ops[0], node.comparators[0]
            if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value is None:
                left = self.value(node.left, frame)
                return (left is None) == isinstance(op, ast.Is)
            ops = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
                   ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
            if type(op) not in ops:
                raise _Unknown(node)
            return ops[type(op)](self.number(node.left, frame), self.number(right, frame))
        if isinstance(node, ast.Subscript):
            self._axes(node)
            return self.value(node.value, frame)
        if isinstance(node, ast.Call):
            return self.call(node, frame)
        raise _Unknown(node)

    def _axes(self, node: ast.Subscript) -> None:
        """Where a subscript inserts an axis (None): before the last one is the query axis (the mask per key);
        as the last one, the values would be per query."""
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        nones = [i for i, e in enumerate(elements) if isinstance(e, ast.Constant) and e.value is None]
        if not nones:
            return
        if nones[-1] == len(elements) - 1:
            self.key_axis_last_violations.append(node)
        elif len(elements) - 2 in nones and not any(isinstance(e, ast.Constant) and e.value is Ellipsis
                                                    for e in elements[:-2]) or (
                elements and isinstance(elements[0], ast.Constant) and elements[0].value is Ellipsis
                and nones == [len(elements) - 2]):
            self.query_axis.append(node)

    def call(self, node: ast.Call, frame: _Frame):
        name = forms._callee(node)
        func = node.func
        receiver = func.value if isinstance(func, ast.Attribute) and not _namespace(func.value) else None
        if receiver is not None and forms._dotted(receiver) == "self":
            return self.inline_method(node, frame)
        if receiver is not None:
            if name in SHAPE_METHODS:
                if name == "unsqueeze" and node.args:
                    axis = node.args[0]
                    if isinstance(axis, ast.Constant) and axis.value == -1 or isinstance(axis, ast.UnaryOp) and \
                            isinstance(axis.operand, ast.Constant) and axis.operand.value == 1:
                        self.key_axis_last_violations.append(node)
                    elif ast.unparse(axis) in ("-2", "2"):
                        self.query_axis.append(node)
                return self.value(receiver, frame)
            if name == "masked_fill" and len(node.args) == 2:
                return self.value(node.args[1], frame) if self.truth(node.args[0], frame) \
                    else self.value(receiver, frame)
            if name in FUNCTIONS and not node.args:
                return self._apply(name, self.number(receiver, frame), node)
            if name == "logical_not" and not node.args:
                return not self.truth(receiver, frame)
            raise _Unknown(node)
        if name == "float" and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) \
                and node.args[0].value in ("-inf", "inf"):
            return float(node.args[0].value)
        if name in SHAPE_METHODS and node.args:
            return self.value(node.args[0], frame)
        if name in FUNCTIONS and len(node.args) == 1:
            return self._apply(name, self.number(node.args[0], frame), node)
        if name == "isinstance" and len(node.args) == 2 and isinstance(self.value(node.args[0], frame), _Causal):
            # The causal mask is a dense tensor (eager and SDPA attention's), not a block mask.
            return forms._dotted(node.args[1]).endswith("Tensor")
        if name in ("full", "full_like") and len(node.args) >= 2:
            return self.value(node.args[1], frame)
        if name == "tensor" and len(node.args) == 1:
            return self.value(node.args[0], frame)
        if name == "where" and len(node.args) == 3:
            return self.value(node.args[1] if self.truth(node.args[0], frame) else node.args[2], frame)
        if name == "logical_not" and len(node.args) == 1:
            return not self.truth(node.args[0], frame)
        if isinstance(func, ast.Name) and func.id in self.functions:
            file, fn = self.functions[func.id]
            return self.inline(fn, None, node, frame, file, frame.cls)
        raise _Unknown(node)

    def _apply(self, name: str, value: float, node: ast.AST) -> float:
        try:
            return FUNCTIONS[name](value)
        except (ValueError, OverflowError):
            raise _Unknown(node) from None

    def inline_method(self, node: ast.Call, frame: _Frame):
        method = _method(frame.cls, node.func.attr)
        if method is None:
            raise _Unknown(node)
        return self.inline(method, "self", node, frame, frame.file, frame.cls)

    def inline(self, fn: ast.FunctionDef, bound: str | None, node: ast.Call, frame: _Frame, file: str,
               cls: ast.ClassDef):
        if self.depth > 4:
            raise _Unknown(node)
        params = [a.arg for a in fn.args.args]
        if bound is not None and params and params[0] == "self":
            params = params[1:]
        defaults = dict(zip([a.arg for a in fn.args.args][::-1], fn.args.defaults[::-1]))
        env, exprs = {}, {}
        given: dict[str, ast.AST] = dict(zip(params, node.args))
        given.update({k.arg: k.value for k in node.keywords if k.arg})
        for p in params + [a.arg for a in fn.args.kwonlyargs]:
            expr = given.get(p, defaults.get(p))
            if expr is None:
                env[p] = None if p in defaults or p not in given else _UNKNOWN
                continue
            try:
                env[p] = self.value(expr, frame)
            except _Unknown:
                env[p] = _UNKNOWN
            exprs[p] = _resolve(expr, frame)
        self.depth += 1
        try:
            kind, value = self.run(fn.body, _Frame(file, cls, env, exprs))
        finally:
            self.depth -= 1
        if kind != "return" or value is _UNKNOWN:
            raise _Unknown(node)
        return value


def _resolve(expr: ast.AST, frame: _Frame) -> ast.AST:
    """A name's expression where it was bound in the caller (to follow the keep window to self.X)."""
    if isinstance(expr, ast.Name) and expr.id in frame.exprs:
        return frame.exprs[expr.id]
    return expr


def _namespace(node: ast.AST) -> bool:
    return forms._dotted(node) in ("torch", "F", "nn", "nn.functional", "torch.nn.functional", "functional", "math")


def _fail(node: ast.AST):
    raise _Unknown(node)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or abs(a - b) <= 1e-12 * max(abs(a), abs(b))
    if isinstance(a, _Causal) and isinstance(b, _Causal):
        return a.visible == b.visible
    return a is b or a == b


# ------------------------------------------------------------------ the attention's bias
def key_bias(sources: dict, config: dict) -> KeyBias | None:
    """The per-key bias of an attention whose mask is computed from its own parameters, where it is
    exp(P * softplus(L(values))) over every KV head's values; None where no mask reads the attention's parameters;
    Unmatched naming what differs otherwise."""
    classes = forms._classes(sources)
    for name, file, cls, forward in forms.attention_forwards(sources):
        found = _in_attention(sources, classes, name, file, cls, forward, config)
        if found is not None:
            return found
    return None


def _in_attention(sources, classes, name, file, cls, forward, config) -> KeyBias | None:
    built = forms._built(cls)
    linears = {a for a, (c, _) in built.items() if c == "Linear"}
    params = _parameters(cls)
    own = params | linears
    for call, mask, qkv, _got in forms.parameter_masks(forward, own):
        return _read_bias(sources, classes, name, file, cls, forward, call, mask, qkv, params, linears, config)
    return None


def _read_bias(sources, classes, name, file, cls, forward, call, mask, qkv, params, linears, config) -> KeyBias:
    where = f"{name}.forward hands {forms._line(mask, 40)} to {forms._callee(call)} ({forms._where(file, call)})"
    if len(qkv) < 3:
        raise Unmatched(f"{where}: the values it attends over are not an argument the reader follows")
    body = forward.body
    # The values the attention reads, and the names they are computed from in the forward (v before a transpose or
    # a repeat over the query heads), up to the projection that computes them.
    values = {n.id for n in subtree(qkv[2]) if isinstance(n, ast.Name)}
    for _ in range(3):
        for stmt in body:
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id in values for t in stmt.targets) \
                    and not any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                and forms._dotted(n.func.value) == "self" for n in subtree(stmt.value)):
                values |= {n.id for n in forms._value_reads(stmt.value) if isinstance(n, ast.Name)}
    # The statement projecting the values: X = self.L(<the values>), L a Linear of the attention's own.
    start = None
    for i, stmt in enumerate(body):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and isinstance(stmt.value, ast.Call):
            inner = stmt.value
            if isinstance(inner.func, ast.Attribute) and forms._dotted(inner.func.value) == "self" \
                    and inner.func.attr in linears and inner.args and any(
                        isinstance(n, ast.Name) and n.id in values for n in subtree(inner.args[0])):
                start = i
                break
    if start is None:
        raise Unmatched(f"{where}: the mask is not computed from a projection of the values "
                        f"({forms._line(qkv[2], 40)}) by a "
                        "linear layer of the attention's own; the port's bias is exp(P * softplus(proj(values)))")
    proj = body[start].value.func.attr
    target = body[start].targets[0].id
    end = next((i for i, s in enumerate(body) if i > start and call in set(subtree(s))), None)
    if end is None:
        raise Unmatched(f"{where}: the mask is built inside a block the reader does not follow")
    functions = {fn.name: (f, fn) for f, tree in sourcecode._parsed(sources)
                 for fn in tree.body if isinstance(fn, ast.FunctionDef)}
    chain = body[start + 1:end]
    # The causal mask the forward receives: its argument named so, else the one argument besides the hidden states
    # (the first) the statements building the mask read.
    arguments = [a.arg for a in forward.args.args if a.arg != "self"]
    mask_name = next((a for a in arguments if "mask" in a), None)
    if mask_name is None:
        read = {n.id for stmt in chain for n in subtree(stmt) if isinstance(n, ast.Name)} & set(arguments[1:])
        mask_name = next(iter(read)) if len(read) == 1 else None
    outputs = {}
    interp = None
    for a, x in SAMPLES:
        for visible in (True, False):
            interp = _Interp(classes, functions, params, {p: a for p in params})
            env = {target: x, "self": None}
            if mask_name:
                env[mask_name] = _Causal(visible)
            frame = _Frame(file, cls, env, {})
            try:
                kind, _ = interp.run(chain, frame)
                result = interp.number(mask, frame)
            except Unmatched as exc:
                raise Unmatched(f"{where}: {exc}") from None
            except _Unknown as stop:
                node = stop.args[0] if stop.args else mask
                raise Unmatched(f"{where}: the reader does not follow how the mask is computed "
                                f"({forms._where(file, node) if hasattr(node, 'lineno') else file}: "
                                f"{forms._line(node, 60)})") from None
            if kind == "return":
                raise Unmatched(f"{where}: the forward returns before it")
            outputs[(a, x, visible)] = (result, set(interp.used), list(interp.windows),
                                        list(interp.query_axis), list(interp.key_axis_last_violations))
    used = set().union(*(o[1] for o in outputs.values()))
    if len(used) != 1:
        raise Unmatched(f"{where}: the bias reads {', '.join(sorted(used)) or 'no parameter'} of the attention's own "
                        "besides the projection; the port's bias is exp(P * softplus(proj(values))) with one P")
    param = next(iter(used))
    for (a, x, visible), (result, *_rest) in outputs.items():
        if visible:
            expected = math.exp(a * FUNCTIONS["softplus"](x))
            if not math.isclose(result, expected, rel_tol=1e-9, abs_tol=1e-12):
                raise Unmatched(f"{where}: the bias it adds to a visible key is not exp({param} * softplus({proj}(v))) "
                                f"(at {param} = {a}, {proj}(v) = {x}: {result:.6g}, not {expected:.6g}); the port "
                                "computes that one form")
        elif result > HIDDEN_LIMIT:
            raise Unmatched(f"{where}: a key the causal mask hides is not masked out in it ({result:.3g})")
    _result, _used, windows, query_axis, per_query = outputs[(SAMPLES[0][0], SAMPLES[0][1], True)]
    if per_query or not query_axis:
        node = per_query[0] if per_query else mask
        raise Unmatched(f"{where}: the bias is not laid along the keys, the same for every query "
                        f"({forms._line(node, 60)}); the port's bias rides with each key")
    window_key = window_value = None
    if windows:
        stmt, bound, wframe = windows[0]
        window_key, window_value = _window_key(cls, _resolve(bound, wframe))
        if window_key is None and window_value is None:
            raise Unmatched(f"a top-k of the keys beyond a count the reader does not follow "
                            f"({forms._where(wframe.file, stmt)}: {forms._line(stmt.test, 60)})")
    evidence = (f"{name}.forward ({forms._where(file, body[start])}): exp({param} * softplus({proj}(v))) added to "
                f"each key's scores" + (f", a top-k of the keys beyond {window_key or window_value} "
                                        f"({forms._where(windows[0][2].file, windows[0][0])})" if windows else ""))
    return KeyBias(proj, param, window_key, window_value, evidence)


def _window_key(cls: ast.ClassDef, bound: ast.AST) -> tuple[str | None, int | None]:
    """The config key (or number) a keep window reads: `self.X` assigned `config.K` in __init__, or `config.K`."""
    if isinstance(bound, ast.Constant) and isinstance(bound.value, int):
        return None, bound.value
    dotted = forms._dotted(bound)
    if dotted.startswith("config.") and dotted.count(".") == 1:
        return dotted.split(".", 1)[1], None
    if dotted.startswith("self.") and dotted.count(".") == 1:
        init = _method(cls, "__init__")
        for n in subtree(init) if init is not None else ():
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and forms._dotted(n.targets[0]) == dotted:
                return _window_key(cls, n.value)
    if isinstance(bound, ast.Call) and forms._callee(bound) == "getattr" and len(bound.args) >= 2 \
            and forms._dotted(bound.args[0]) == "config" and isinstance(bound.args[1], ast.Constant):
        return str(bound.args[1].value), None
    return None, None


# ------------------------------------------------------------------ residuals scaled by the layer's parameters
def residual_scales(sources: dict, attn: str | None = None, mlp: str | None = None) -> dict[str, str] | None:
    """{"attn": P, "mlp": Q} where the decoder layer adds a sublayer's output to its residual multiplied by a
    parameter of the layer's own (`self.P * residual + h`), the sublayer told by the module call its output comes
    from last (the attention's, the MLP's: `attn` / `mlp` where the names are known, else the first and second
    module called). None where the layer scales no residual; Unmatched where it scales something the port does not
    (a sublayer's output, a sum the reader cannot place)."""
    layer = forms._decoder_layer(sources)
    if layer is None:
        return None
    file, cls = layer
    forward = _method(cls, "forward")
    own = _parameters(cls)
    if forward is None or not own:
        return None
    methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    modules = {n.func.attr for n in subtree(forward) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and forms._dotted(n.func.value) == "self" and n.func.attr not in methods | own}
    last: dict[str, str | None] = {}  # name -> the module call its value comes from last
    hits: list[tuple[str, str, ast.stmt]] = []
    others: list[ast.stmt] = []

    def origin(node: ast.AST) -> str | None:
        best = None
        for n in ast.walk(node):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and forms._dotted(n.func.value) == "self" \
                    and n.func.attr in modules:
                return n.func.attr
            if isinstance(n, ast.Name) and last.get(n.id):
                best = last[n.id]
        return best

    for stmt in forms._statements(forward.body):
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Return)) or stmt.value is None:
            continue
        value = stmt.value
        scaled = _scaled_sum(value, own)
        if scaled is not None:
            param, residual, branch = scaled
            sub = origin(branch)
            if sub is None or origin(residual) == sub:
                raise Unmatched(f"{cls.name}.forward multiplies by a parameter of its own ({param}) in a sum the port "
                                f"does not place ({forms._where(file, stmt)}: {forms._line(stmt)})")
            hits.append((param, sub, stmt))
        elif any(isinstance(n, ast.Attribute) and forms._dotted(n.value) == "self" and n.attr in own
                 for n in ast.walk(value)):
            others.append(stmt)
        got = origin(value)
        for target in (stmt.targets if isinstance(stmt, ast.Assign) else [] if isinstance(stmt, ast.Return)
                       else [stmt.target]):
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    last[n.id] = got
    if not hits:
        return None
    if others:
        raise Unmatched(f"{cls.name}.forward also computes with a parameter of its own in a form the port does not "
                        f"({forms._where(file, others[0])}: {forms._line(others[0])})")
    found: dict[str, str] = {}
    for k, (param, sub, stmt) in enumerate(hits):
        role = ("attn" if sub == attn else "mlp" if sub == mlp else None) if attn and mlp else \
            ("attn", "mlp")[k] if k < 2 else None
        if role is None or role in found:
            raise Unmatched(f"{cls.name}.forward scales a residual by {param} beside {sub}'s output, which the "
                            f"reader does not place as the attention's or the MLP's ({forms._where(file, stmt)})")
        found[role] = param
    return found


def _scaled_sum(value: ast.AST, own: set[str]) -> tuple[str, ast.AST, ast.AST] | None:
    """`self.P * r + h` (either order, either side): (P, r, h)."""
    if not (isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add)):
        return None
    for side, other in ((value.left, value.right), (value.right, value.left)):
        if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult):
            for factor, rest in ((side.left, side.right), (side.right, side.left)):
                if isinstance(factor, ast.Attribute) and forms._dotted(factor.value) == "self" and factor.attr in own:
                    return factor.attr, rest, other
    return None
