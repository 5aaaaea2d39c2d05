"""Keys chosen by a top-k (DeepSeek-V3.2's lightning indexer): what reaches the attention from a top-k over scores.

DeepSeek Sparse Attention scores every key for each query with a small module of its own, keeps the `index_topk`
best (`scores.topk(min(index_topk, T), dim=-1).indices`) and masks every other key out of the attention (a mask
scattered at those indices and folded into the causal mask, or the indices handed to a sparse kernel). Where a
query sees at most k keys, the top-k keeps them all, whatever the scores: the attention is then exactly dense, the
scores are not needed, and the port computes dense attention for contexts up to k tokens (it refuses, at load time,
a longer max_model_len).

The reader follows values, not names, through the attention's forward, the forwards of the modules it calls and the
functions of the file (their parameters bound to the call's arguments): a top-k call; its indices (`.indices`,
`[1]`, the second of an unpacked pair); a mask built from them (`ones.scatter(-1, idx, False)`: True at the keys
dropped, `zeros.scatter(-1, idx, True)`: True at the keys kept, `full(-inf).scatter(-1, idx, 0)`: additive); that
mask folded into the attention's (`mask & keep`, `mask & ~drop`, `masked_fill(drop, min)`, `where(keep, mask, min)`,
`mask + additive`); and what the attention call (or a softmax) receives. k must be the config's value, alone or
`min(config value, the scores' last size)`; any other k, a mask that keeps the unselected keys, or a selection the
reader does not follow on its way into the attention is refused naming its line. Indices that reach the attention
from outside it (a previous layer's, GLM-5's shared layers) are followed as the same selection.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.blocks import _method
from scaffold.detect.formcode import ATTENTION_CALLS, _built, _callee, _line, _mask_argument, _statements
from scaffold.detect.sourcecode import _classes, _dotted, _parsed

# Tags a value carries: a top-k call's result, its indices, a boolean mask True at the kept (or dropped) keys, an
# additive mask (0 kept, -inf dropped), and a mask the selection narrowed ("sel"); ("?", line) a selection the
# reader lost at that line.
SELECTION = {"idx", "keep", "drop", "add"}
PASS_METHODS = {"long", "int", "to", "unsqueeze", "squeeze", "view", "reshape", "expand", "expand_as", "contiguous",
                "bool", "float", "clone", "type", "type_as", "detach", "unsqueeze_", "squeeze_", "flatten"}
FILLS = {"ones": True, "new_ones": True, "ones_like": True, "zeros": False, "new_zeros": False, "zeros_like": False}
FULLS = {"full", "new_full", "full_like"}


class Unfollowed(Exception):
    """A top-k selection of keys the reader does not follow, or one the port does not compute: the message names
    the line."""


@dataclass(frozen=True)
class KeySelection:
    key: str                 # the config key k reads (index_topk)
    modules: tuple[str, ...]  # the attention's modules that compute the selection, as its attributes
    evidence: str            # FILE:LINE of the top-k and of what hands the selection to the attention
    reads: tuple[str, ...] = ()  # config keys the selector's own classes read (its sizes), besides k


@dataclass
class _Ctx:
    file: str
    cls: ast.ClassDef | None
    func: ast.FunctionDef
    env: dict
    bindings: dict  # parameter -> (argument expression, the caller's _Ctx)
    depth: int


@dataclass
class _TopK:
    call: ast.Call
    ctx: _Ctx


def _neg_fill(node: ast.AST) -> bool:
    """A value that masks a score out: -inf, float("-inf"), finfo(...).min, a large negative literal."""
    text = ast.unparse(node).replace(" ", "")
    if "finfo(" in text and text.endswith(".min"):
        return True
    if text in ("float('-inf')", 'float("-inf")', "-float('inf')", '-float("inf")', "-math.inf", "-torch.inf",
                "-np.inf", "-inf"):
        return True
    try:
        value = ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value <= -1e4


class _Reader:
    def __init__(self, sources: dict[str, str]):
        self.classes = _classes(sources)
        self.functions = {node.name: (file, node) for file, tree in _parsed(sources) for node in tree.body
                          if isinstance(node, ast.FunctionDef)}
        self.topks: list[_TopK] = []
        self.selectors: set[str] = set()  # the attention's modules whose result carries the selection
        self.sinks: list[tuple[str, ast.AST, set]] = []
        self.top: _Ctx | None = None

    # ---------------------------------------------------------------- functions
    def run(self, file: str, cls: ast.ClassDef | None, func: ast.FunctionDef, args: list, depth: int,
            caller: _Ctx | None = None, call: ast.Call | None = None) -> set:
        params = [a.arg for a in func.args.args]
        if params and params[0] == "self" and cls is not None:
            params = params[1:]
        env: dict = {}
        bindings: dict = {}
        for name, tags in zip(params, args):
            env[name] = set(tags)
        if call is not None and caller is not None:
            for name, expr in zip(params, call.args):
                bindings[name] = (expr, caller)
            for kw in call.keywords:
                if kw.arg:
                    bindings[kw.arg] = (kw.value, caller)
                    if kw.arg in params:
                        env[kw.arg] = self.tags(kw.value, caller)
        ctx = _Ctx(file, cls, func, env, bindings, depth)
        if self.top is None:
            self.top = ctx
        returned: set = set()
        for stmt in _statements(func.body):
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                returned |= self.tags(stmt.value, ctx)
            elif isinstance(stmt, ast.Assign):
                value = stmt.value
                for target in stmt.targets:
                    self.assign(target, value, ctx)
            elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
                self.assign(stmt.target, stmt.value, ctx)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
                got = self.tags(ast.BinOp(stmt.target, stmt.op, stmt.value, lineno=stmt.lineno,
                                          col_offset=stmt.col_offset), ctx)
                ctx.env[stmt.target.id] = ctx.env.get(stmt.target.id, set()) | got
            elif isinstance(stmt, ast.Expr):
                self.tags(stmt.value, ctx)
        return returned

    def assign(self, target: ast.expr, value: ast.expr, ctx: _Ctx) -> None:
        got = self.tags(value, ctx)
        if isinstance(target, ast.Name):
            ctx.env[target.id] = ctx.env.get(target.id, set()) | got
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Name):
                    part = ({"idx"} if i == 1 else set()) if "topk" in got else got - {"topk"}
                    ctx.env[elt.id] = ctx.env.get(elt.id, set()) | part

    # ---------------------------------------------------------------- expressions
    def tags(self, node: ast.AST, ctx: _Ctx) -> set:
        if isinstance(node, ast.Name):
            return set(ctx.env.get(node.id, set()))
        if isinstance(node, ast.Attribute):
            inner = self.tags(node.value, ctx)
            if node.attr == "indices" and "topk" in inner:
                return {"idx"}
            if node.attr in ("shape", "dtype", "device", "values") or "topk" in inner:
                return set()
            return inner
        if isinstance(node, ast.Subscript):
            inner = self.tags(node.value, ctx)
            if "topk" in inner:
                index = node.slice
                return {"idx"} if isinstance(index, ast.Constant) and index.value == 1 else set()
            return inner
        if isinstance(node, ast.UnaryOp):
            inner = self.tags(node.operand, ctx)
            return self.invert(inner) if isinstance(node.op, (ast.Invert, ast.Not)) else inner
        if isinstance(node, ast.BinOp):
            return self.combine(node.op, self.tags(node.left, ctx), self.tags(node.right, ctx), node, ctx)
        if isinstance(node, ast.IfExp):
            self.tags(node.test, ctx)
            return self.tags(node.body, ctx) | self.tags(node.orelse, ctx)
        if isinstance(node, (ast.Tuple, ast.List)):
            return set().union(*(self.tags(e, ctx) for e in node.elts)) if node.elts else set()
        if isinstance(node, ast.Call):
            return self.call(node, ctx)
        if isinstance(node, (ast.Compare, ast.BoolOp)):
            for child in ast.iter_child_nodes(node):
                self.tags(child, ctx)
            return set()
        return set()

    @staticmethod
    def invert(tags: set) -> set:
        swap = {"keep": "drop", "drop": "keep"}
        return {swap.get(t, t) if isinstance(t, str) else t for t in tags}

    def lost(self, tags: set, node: ast.AST, ctx: _Ctx) -> set:
        """What a step the reader does not follow leaves of a selection: the line it was lost at."""
        if tags & SELECTION or "sel" in tags or _lost(tags):
            return {("?", f"{ctx.file}:{node.lineno}", f"{_line(node, 70)}, which the reader does not follow")}
        return set()

    def combine(self, op: ast.operator, left: set, right: set, node: ast.AST, ctx: _Ctx) -> set:
        both = left | right
        if isinstance(op, ast.BitAnd):
            if "drop" in both:
                return _wrong(ctx, node, "keeps the keys the top-k drops")
            if "keep" in both:
                return {"sel"}
            return both
        if isinstance(op, ast.Add):
            if "add" in both:
                return {"sel"}
            if both & (SELECTION | {"topk"}):
                return self.lost(both, node, ctx)
            return both
        if both & (SELECTION | {"topk"}) or _lost(both):
            return self.lost(both, node, ctx)
        return both

    def call(self, node: ast.Call, ctx: _Ctx) -> set:
        func = node.func
        name = _callee(node)
        args = [self.tags(a, ctx) for a in node.args]
        kwargs = {k.arg: self.tags(k.value, ctx) for k in node.keywords if k.arg}
        owner = self.tags(func.value, ctx) if isinstance(func, ast.Attribute) else set()
        torch_call = isinstance(func, ast.Attribute) and _dotted(func.value) in ("torch", "F", "nn.functional",
                                                                                  "torch.nn.functional")
        if name == "topk":
            self.topks.append(_TopK(node, ctx))
            return {"topk"}
        if name in ATTENTION_CALLS or name == "softmax" or (name and name.endswith("attention_forward")):
            self.sink(node, ctx, args, kwargs, owner)
            return set()
        if name in FILLS or name in FULLS:
            fill = self.fill_value(node, name)
            return {("fill", fill)} if fill is not None else set()
        if name in ("scatter", "scatter_"):
            return self.scatter(node, ctx, args, kwargs, owner, torch_call)
        if name in ("masked_fill", "masked_fill_"):
            base, cond = (args[0], args[1]) if torch_call else (owner, args[0] if args else set())
            value = node.args[-1] if node.args else None
            if "drop" in cond and value is not None and _neg_fill(value):
                return {"sel"}
            if cond & SELECTION:
                return _wrong(ctx, node, "masks the keys the top-k keeps")
            return (base - {"topk"}) | set(_lost(cond))
        if name == "where" and torch_call and len(node.args) == 3:
            cond, a, b = args
            if "keep" in cond and _neg_fill(node.args[2]) or "drop" in cond and _neg_fill(node.args[1]):
                return {"sel"}
            if cond & SELECTION:
                return _wrong(ctx, node, "does not keep the keys the top-k keeps")
            return a | b | set(_lost(cond))
        if name in ("logical_and", "mul") and torch_call and len(args) == 2:
            return self.combine(ast.BitAnd(), args[0], args[1], node, ctx)
        if name == "logical_not" and torch_call and args:
            return self.invert(args[0])
        if isinstance(func, ast.Attribute) and name in PASS_METHODS and not torch_call:
            return owner
        if torch_call and name in ("unsqueeze", "squeeze", "reshape", "flatten") and args:
            return args[0]
        # self.M(...): the attention's module; f(...): a function of the file.
        if (isinstance(func, ast.Attribute) and _dotted(func.value) == "self" and ctx.cls is not None
                and ctx.depth < 3):
            built = _modules(ctx.cls, self.classes).get(func.attr)
            if built is not None:
                file, cls = self.classes[built]
                forward = _method(cls, "forward")
                if forward is not None:
                    got = self.run(file, cls, forward, args, ctx.depth + 1, ctx, node)
                    if ctx is self.top and got & (SELECTION | {"sel"}):
                        self.selectors.add(func.attr)
                    return got
            method = _method(ctx.cls, func.attr)
            if method is not None:
                return self.run(ctx.file, ctx.cls, method, args, ctx.depth + 1, ctx, node)
        if isinstance(func, ast.Name) and func.id in self.functions and ctx.depth < 3:
            file, function = self.functions[func.id]
            return self.run(file, None, function, args, ctx.depth + 1, ctx, node)
        everything = owner.union(*args, *kwargs.values())
        return self.lost(everything, node, ctx)

    @staticmethod
    def fill_value(node: ast.Call, name: str):
        """The value a constructor fills its tensor with: True / False for ones / zeros (as booleans or numbers),
        "neg" for -inf; None where the reader cannot tell."""
        if name in FILLS:
            return FILLS[name]
        position = {"full": 1, "new_full": 1, "full_like": 1}[name]
        value = next((k.value for k in node.keywords if k.arg == "fill_value"), None)
        if value is None and len(node.args) > position:
            value = node.args[position]
        if value is None:
            return None
        if _neg_fill(value):
            return "neg"
        try:
            literal = ast.literal_eval(value)
        except (ValueError, SyntaxError, TypeError):
            return None
        return bool(literal) if isinstance(literal, (bool, int, float)) and literal in (0, 1) else None

    def scatter(self, node: ast.Call, ctx: _Ctx, args: list, kwargs: dict, owner: set, torch_call: bool) -> set:
        call_args = list(node.args)
        base = args[0] if torch_call and args else owner
        rest = call_args[1:] if torch_call else call_args
        rest_tags = args[1:] if torch_call else args
        index = kwargs.get("index", rest_tags[1] if len(rest_tags) > 1 else set())
        if "idx" not in index:
            return self.lost(index | base, node, ctx)
        dim = next((k.value for k in node.keywords if k.arg == "dim"), rest[0] if rest else None)
        value = next((k.value for k in node.keywords if k.arg in ("value", "src")), rest[2] if len(rest) > 2 else None)
        if not (isinstance(dim, ast.UnaryOp) and isinstance(dim.op, ast.USub) and isinstance(dim.operand, ast.Constant)
                and dim.operand.value == 1):
            return _wrong(ctx, node, "scatters the top-k's indices along a dimension other than the keys' last one")
        fills = [t[1] for t in base if isinstance(t, tuple) and t[0] == "fill"]
        try:
            scattered = ast.literal_eval(value) if value is not None else None
        except (ValueError, SyntaxError, TypeError):
            scattered = None
        if len(fills) == 1 and isinstance(scattered, (bool, int, float)):
            fill = fills[0]
            if fill is True and scattered in (False, 0):
                return {"drop"}
            if fill is False and scattered in (True, 1):
                return {"keep"}
            if fill == "neg" and scattered == 0:
                return {"add"}
        return _wrong(ctx, node, "builds a mask from the top-k's indices that the reader does not follow")

    def sink(self, node: ast.Call, ctx: _Ctx, args: list, kwargs: dict, owner: set) -> None:
        name = _callee(node)
        if name == "softmax":
            method = isinstance(node.func, ast.Attribute) and _dotted(node.func.value) not in (
                "torch", "F", "nn.functional", "torch.nn.functional")
            reach = owner if method else args[0] if args else set()
        else:
            mask = _mask_argument(node) if name in ATTENTION_CALLS else (node.args[4] if len(node.args) > 4 else next(
                (k.value for k in node.keywords if k.arg in ("attention_mask", "attn_mask", "mask")), None))
            reach = self.tags(mask, ctx) if mask is not None else set()
            if "idx" in kwargs.get("indices", set()):
                reach = reach | {"sel"}
        self.sinks.append((f"{ctx.file}:{node.lineno}", node, reach))


def _wrong(ctx: _Ctx, node: ast.AST, what: str) -> set:
    """A step that leaves no selection the port computes: raised if it reaches the attention."""
    return {("?", f"{ctx.file}:{node.lineno}", f"{_line(node, 70)} {what}")}


def _lost(tags: set) -> list:
    """The ("?", FILE:LINE, code) tags: where a selection went through a step the reader does not follow."""
    return [t for t in tags if isinstance(t, tuple) and t[0] == "?"]


def _modules(cls: ast.ClassDef, classes: dict) -> dict[str, str]:
    """self.X = Cls(...) in __init__, also under a condition (`None if shared else Indexer(...)`): X -> Cls, for the
    classes the sources define."""
    out = dict((attr, name) for attr, (name, _line_no) in _built(cls).items() if name in classes)
    init = _method(cls, "__init__")
    for stmt in _statements(init.body) if init is not None else ():
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self" and isinstance(stmt.value, ast.IfExp)):
            for branch in (stmt.value.body, stmt.value.orelse):
                name = _dotted(branch.func).rsplit(".", 1)[-1] if isinstance(branch, ast.Call) else ""
                if name in classes:
                    out.setdefault(stmt.targets[0].attr, name)
    return out


def _self_attr_value(cls: ast.ClassDef, attr: str) -> ast.expr | None:
    init = _method(cls, "__init__")
    for stmt in _statements(init.body) if init is not None else ():
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) \
            else []
        for target in targets:
            if isinstance(target, ast.Attribute) and _dotted(target.value) == "self" and target.attr == attr:
                return stmt.value
    return None


def _config_key(node: ast.expr | None, ctx: _Ctx, topk_input: ast.expr | None, seen: int = 0) -> str | None:
    """The config key an expression of k reads: config.K, getattr(config, "K"[, default]), self.X set so in
    __init__, a local assigned so, a parameter bound to such an argument, or min(one of those, the scores' last
    size)."""
    if node is None or seen > 8:
        return None
    if isinstance(node, ast.Call) and _callee(node) == "min" and len(node.args) == 2:
        keys = [_config_key(a, ctx, topk_input, seen + 1) for a in node.args]
        sizes = [_last_size(a, topk_input) for a in node.args]
        if keys[0] and sizes[1]:
            return keys[0]
        if keys[1] and sizes[0]:
            return keys[1]
        return None
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        if base == "self" and ctx.cls is not None:
            value = _self_attr_value(ctx.cls, node.attr)
            init = _method(ctx.cls, "__init__")
            if value is not None and init is not None:
                return _config_key(value, _Ctx(ctx.file, ctx.cls, init, {}, {}, ctx.depth), None, seen + 1)
            return None
        if base.endswith("config") or base in _config_params(ctx):
            return node.attr
        return None
    if (isinstance(node, ast.Call) and _callee(node) == "getattr" and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            and (_dotted(node.args[0]).endswith("config") or _dotted(node.args[0]) in _config_params(ctx))):
        return node.args[1].value
    if isinstance(node, ast.Name):
        for stmt in _statements(ctx.func.body):
            if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                    and stmt.targets[0].id == node.id):
                return _config_key(stmt.value, ctx, topk_input, seen + 1)
        if node.id in ctx.bindings:
            expr, caller = ctx.bindings[node.id]
            return _config_key(expr, caller, topk_input, seen + 1)
    return None


def _config_params(ctx: _Ctx) -> set[str]:
    """The parameter an __init__ takes its config as (the first after self)."""
    args = [a.arg for a in ctx.func.args.args]
    return {args[1]} if ctx.func.name == "__init__" and len(args) > 1 else set()


def _last_size(node: ast.expr, topk_input: ast.expr | None) -> bool:
    """`S.shape[-1]` or `S.size(-1)` of the scores the top-k runs over: every key."""
    last = ast.unparse(ast.UnaryOp(ast.USub(), ast.Constant(1)))
    if topk_input is None:
        return False
    scores = ast.unparse(topk_input)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "shape":
        return ast.unparse(node.value.value) == scores and ast.unparse(node.slice) == last
    if isinstance(node, ast.Call) and _callee(node) == "size" and isinstance(node.func, ast.Attribute):
        return (ast.unparse(node.func.value) == scores and len(node.args) == 1
                and ast.unparse(node.args[0]) == last)
    return False


def _topk_parts(call: ast.Call) -> tuple[ast.expr | None, ast.expr | None, ast.expr | None]:
    """(the scores, k, dim) of `scores.topk(k, dim)` or `torch.topk(scores, k, dim)`."""
    kw = {k.arg: k.value for k in call.keywords}
    func = call.func
    if isinstance(func, ast.Attribute) and _dotted(func.value) not in ("torch",):
        scores, rest = func.value, list(call.args)
    else:
        scores, rest = (call.args[0] if call.args else kw.get("input")), list(call.args[1:])
    k = kw.get("k", rest[0] if rest else None)
    dim = kw.get("dim", rest[1] if len(rest) > 1 else None)
    return scores, k, dim


def _inline_modules(ctx: _Ctx, scores: ast.expr | None) -> set[str]:
    """The attention's own modules (self.X built in __init__) the scores of an inline top-k are computed from."""
    if ctx.cls is None or scores is None:
        return set()
    built = set(_built(ctx.cls))
    assigned: dict[str, list[ast.expr]] = {}
    for stmt in _statements(ctx.func.body):
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                for n in ast.walk(target):
                    if isinstance(n, ast.Name):
                        assigned.setdefault(n.id, []).append(stmt.value)
    out: set[str] = set()
    todo, seen = [scores], set()
    while todo:
        expr = todo.pop()
        for n in ast.walk(expr):
            if isinstance(n, ast.Attribute) and _dotted(n.value) == "self" and n.attr in built:
                out.add(n.attr)
            elif isinstance(n, ast.Name) and n.id not in seen:
                seen.add(n.id)
                todo.extend(assigned.get(n.id, []))
    return out


def read(sources: dict[str, str], attention_cls: str) -> KeySelection | None:
    """The top-k key selection the attention class `attention_cls` computes, or None where no top-k reaches its
    attention. Raises Unfollowed for a selection the port does not compute or the reader does not follow."""
    reader = _Reader(sources)
    if attention_cls not in reader.classes:
        return None
    file, cls = reader.classes[attention_cls]
    forward = _method(cls, "forward")
    if forward is None:
        return None
    reader.run(file, cls, forward, [], 0)
    reached = [(where, node, tags) for where, node, tags in reader.sinks if tags & (SELECTION | {"sel"}) or _lost(tags)]
    lost = next(((where, t) for where, _n, tags in reached for t in _lost(tags)), None)
    if lost is not None:
        where, (_q, line, text) = lost
        raise Unfollowed(f"a top-k selection of keys reaches the attention at {where} through {line}: {text}")
    unfolded = next(((where, node) for where, node, tags in reached if "sel" not in tags), None)
    if unfolded is not None:
        where, node = unfolded
        raise Unfollowed(f"{where}: {_line(node, 70)} receives a top-k selection of keys the reader does not see "
                         "folded into its mask")
    if not reached:
        return None
    keys, lines = set(), []
    for found in reader.topks:
        scores, k, dim = _topk_parts(found.call)
        where = f"{found.ctx.file}:{found.call.lineno}"
        if dim is not None and ast.unparse(dim) != "-1":
            raise Unfollowed(f"{where}: {_line(found.call, 70)}: a top-k over another dimension than the keys'")
        key = _config_key(k, found.ctx, scores)
        if key is None:
            raise Unfollowed(f"{where}: {_line(found.call, 70)}: a top-k of keys whose k ({ast.unparse(k) if k else '?'})"
                             " is not a config value (alone, or its min with the number of keys)")
        keys.add(key)
        lines.append(where)
    if len(keys) != 1:
        return None if not keys else _raise(f"top-k selections of keys with different k ({', '.join(sorted(keys))})")
    modules = set(reader.selectors)
    for found in reader.topks:
        if found.ctx is reader.top:
            modules |= _inline_modules(found.ctx, _topk_parts(found.call)[0])
    sink = next(where for where, _n, tags in reached if "sel" in tags)
    key = keys.pop()
    built = _modules(cls, reader.classes)
    reads = sorted(({n.attr for m in modules if m in built for n in ast.walk(reader.classes[built[m]][1])
                     if isinstance(n, ast.Attribute) and _dotted(n.value).endswith("config")}
                    | _condition_reads(cls, modules)) - {key})
    return KeySelection(key, tuple(sorted(modules)),
                        f"the top-k at {', '.join(sorted(set(lines)))}, its selection masking the attention at {sink}",
                        tuple(reads))


def _condition_reads(cls: ast.ClassDef, modules) -> set[str]:
    """The config keys the attention's __init__ reads to decide which layers build a selector module (GLM-5's
    `self.indexer = None if self.skip_topk else Indexer(...)`, `self.skip_topk = config.indexer_types[layer_idx] ==
    "shared"`: the other layers take the previous one's selection), followed through `self.X` assigned there."""
    init = _method(cls, "__init__")
    assigned = {stmt.targets[0].attr: stmt.value for stmt in (_statements(init.body) if init is not None else ())
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                and isinstance(stmt.targets[0], ast.Attribute) and _dotted(stmt.targets[0].value) == "self"}
    found: set[str] = set()
    pending = [assigned[m].test for m in modules if isinstance(assigned.get(m), ast.IfExp)]
    seen: set[str] = set()
    while pending:
        for n in ast.walk(pending.pop()):
            if isinstance(n, ast.Attribute) and _dotted(n.value).endswith("config"):
                found.add(n.attr)
            elif (isinstance(n, ast.Attribute) and _dotted(n.value) == "self" and n.attr in assigned
                  and n.attr not in seen):
                seen.add(n.attr)
                pending.append(assigned[n.attr])
    return found


def _raise(message: str):
    raise Unfollowed(message)
