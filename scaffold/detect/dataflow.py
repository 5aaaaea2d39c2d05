"""What a decoder layer's code computes, read statically from its source (parsed, never run).

The checkpoint's tensor names say nothing reliable about roles: one author's `w1` is
the gate, another's is the up projection; `wqkv` may hold q, k and v one after another,
per head, or per group of query heads sharing a KV head. This module follows the data
through the layer's `forward` methods instead:

- the decoder layer is the class whose instances fill an nn.ModuleList of the model;
- in its forward, the module whose output feeds the attention (the MLP) is that
  sublayer's norm;
- in the attention's forward, every value is tagged with the projection it came from
  and how it was cut out of a fused output; where q, k and v meet (a call taking three
  of them, or the score and value matmuls) says which is which;
- in the MLP's forward, the projection whose output is activated and multiplied is the
  gate, the other factor the up projection, the projection applied to the product the
  down projection.

The interpreter is deliberately small: values are sets of origins (projection, piece,
how it was cut, activated or not), branches join by union, and calls into functions
of the same source are inlined a few levels deep. Where the code does not decide a
role, the answer is None with the reason, never a guess.
"""

from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass, field, replace

from scaffold.detect import conditions, nested
from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, config_aliases, config_reads, subtree

LINEAR_CLASSES = {"Linear", "Conv1D"}
# Callees whose result is the activation of their argument (torch's, transformers' and einops' names).
ACTIVATIONS = ("silu", "gelu", "relu", "sigmoid", "tanh", "softplus", "swish", "mish", "act")
SPLITTERS = ("split", "chunk", "unbind", "tensor_split")
CLAMPS = ("clamp", "clip", "clamp_", "clip_", "clamp_min", "clamp_max", "clamp_min_", "clamp_max_")
RESHAPERS = ("view", "reshape", "unflatten")
MATMULS = ("matmul", "bmm", "baddbmm", "einsum")
# Keywords by which a call scales what it computes (baddbmm's alpha, an attention function's scale), and tensor
# methods and functions that multiply or divide: a scaling of the attention scores where q or k reach them.
SCALE_KEYWORDS = ("alpha", "scale", "scaling", "softmax_scale")
SCALERS = ("mul", "mul_", "div", "div_", "multiply", "divide", "true_divide")
# Tensor methods whose result is metadata, not data derived from the tensor.
METADATA = ("size", "dim", "numel", "stride", "data_ptr", "element_size", "get_device")
# A call that rotates q and k by name (apply_rotary_pos_emb, self.rotary_emb, apply_rope): the call the rotary
# guard is read around, q and k handed in together without v.
ROTARY_CALL = re.compile(r"rotary|(^|_|\.)rope($|_)", re.IGNORECASE)
MAX_INLINE = 4  # nesting depth of inlined calls
MAX_INLINED_CALLS = 2000  # per forward analysed: bounds the time any source can cost


@dataclass(frozen=True)
class Origin:
    """Where (part of) a value comes from: the output of projection `src`, or its piece `piece` once cut."""

    src: str
    piece: int | None = None
    layout: str | None = None  # how the piece was cut: "fused" (one after another), "interleaved", "grouped",
    # "blocked" (the output viewed as [..., blocks, -1], each block cut into its q, k and v parts: CodeGen's)
    stage: str = "flat"  # the shape the fused output was given: flat, per_head, grouped, stacked, per_head_stacked,
    # blocked (then `unit` is the number of blocks as the code writes it, resolved to an integer)
    pending: str | None = None  # cut by split/chunk, not yet unpacked into pieces
    act: bool = False
    line: int = 0
    # stage "per_head_pair": the output viewed per head as 2 x <unit> (Qwen3-Next's q_proj, query and gate per
    # head); the unit as the code writes it. Cut in two halves of <unit> each, its pieces have layout "halves".
    unit: str | None = None

    @property
    def key(self) -> tuple:
        return (self.src, self.piece, self.layout)


EMPTY: frozenset = frozenset()


@dataclass(frozen=True)
class Tup:
    """A tuple of values (a function's `return a, b`)."""

    items: tuple


def _flat(value) -> frozenset:
    if isinstance(value, Tup):
        out = set()
        for item in value.items:
            out |= _flat(item)
        return frozenset(out)
    return value


def _join(a, b):
    if isinstance(a, Tup) and isinstance(b, Tup) and len(a.items) == len(b.items):
        return Tup(tuple(_join(x, y) for x, y in zip(a.items, b.items)))
    if isinstance(a, Tup) and not _flat(b):
        return a
    if isinstance(b, Tup) and not _flat(a):
        return b
    return _flat(a) | _flat(b)


@dataclass
class Events:
    """What the interpreter saw: calls taking several derived values, products, matmuls, projection inputs."""

    calls: list = field(default_factory=list)  # (line, [origins of each positional argument])
    matmuls: list = field(default_factory=list)  # (line, left origins, right origins)
    products: list = field(default_factory=list)  # (line, left origins, right origins)
    inputs: dict = field(default_factory=dict)  # producer -> (line, origins of its input)
    # self.<module>(x) for a module of __init__ that is no producer, with one derived argument (a q/k norm):
    # (attribute, line, origins of that argument)
    modules: list = field(default_factory=list)
    # Activations applied to derived values: (line, the function's name as the code says it, or None where the
    # code names none this reads: see Interpreter.activation_name, origins of its argument).
    activations: list = field(default_factory=list)
    # line of a call taking several derived values -> the branch conditions the config did not decide around it,
    # innermost last: ((test, True for the `if` body / False for its `else`), ...)
    guards: dict = field(default_factory=dict)
    callees: dict = field(default_factory=dict)  # line of such a call -> the callee as written (dotted)
    # Values multiplied or divided by something not derived from the projections, or handed to a call with a
    # scaling keyword (alpha=, scale=): (line, origins of the scaled value).
    scalings: list = field(default_factory=list)
    inlined: set = field(default_factory=set)  # lines of calls run as the source's own functions
    # A projection's output viewed per head as a pair (…, heads, 2 * unit) or (…, heads, 2, unit): producer ->
    # (line, the view as written, the unit as written or "" for (…, 2, unit)), the first one (read only by
    # analyze_attention: Interpreter.read_pairs).
    pair_views: dict = field(default_factory=dict)
    # producer -> the last dimension of the first view of its whole output, as written (k's `self.head_dim`)
    head_views: dict = field(default_factory=dict)
    # How such a view was cut: (line, producer, True where into two halves of `unit` along the last axis (chunk(2),
    # split(unit)), False for any other cut, the cut as written).
    pair_cuts: list = field(default_factory=list)
    # Sums of two derived values: (line, left origins, right origins, the sum's origins).
    sums: list = field(default_factory=list)
    # producer -> the block counts of every view of its whole output as [..., blocks, -1] (Interpreter.blocks)
    blocked_views: dict = field(default_factory=dict)
    # Clamps of derived values (x.clamp(min=a, max=b), torch.clamp(x, a, b), x.clamp_(...), clip): (line, origins
    # of the clamped value, the call node, the forward's locals' expressions there), on the branches the config runs.
    clamps: list = field(default_factory=list)


class Interpreter:
    """Abstract execution of one forward: every value is the set of producer outputs it derives from."""

    def __init__(self, sources: dict, file: str, cls: ast.ClassDef, producers: set, config: dict):
        self.sources, self.file, self.cls = sources, file, cls
        self.producers = producers
        self.config = config
        self.events = Events()
        self.classes = _classes(sources)
        self.functions = {n.name: (f, n) for f, tree in _parsed(sources) for n in tree.body
                          if isinstance(n, ast.FunctionDef)}
        self.methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
        self.init = self.methods.get("__init__")
        self.attr_values = _init_assignments(self.init)
        self.aliases = config_aliases(cls)
        self.local_functions = {n.name: n for n in subtree(self.init)
                                if isinstance(n, ast.FunctionDef) and n is not self.init} if self.init else {}
        self.depth = 0
        self.inlined = 0
        # line -> (test, the layers where it holds) of the branches config.json decides differently per layer
        self.layer_branches: dict[int, tuple[str, list[int]]] = {}
        self.layer: int | None = None  # the one layer index whose branches to take (attention_layer_branches)
        self.branch: list = []  # (test, polarity) of the undecided branches being run
        # Read a per-head pair view (…, heads, 2 * head_dim) cut in two as two pieces ("halves"): the attention's
        # query and output gate folded into one projection. Off elsewhere (an MLP cut that way stays unread).
        self.read_pairs = False

    # ------------------------------------------------------------------ statements
    def run_method(self, name: str, args: list) -> object:
        func = self.methods.get(name)
        if func is None:
            return EMPTY
        return self.call_function(func, [EMPTY, *args], {})

    def call_function(self, func: ast.FunctionDef, args: list, kwargs: dict):
        if self.depth >= MAX_INLINE or self.inlined >= MAX_INLINED_CALLS:
            return _join_all([*args, *kwargs.values()])
        self.inlined += 1
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        env = {p: EMPTY for p in params}
        for p, value in zip(params, args):
            env[p] = value
        for k, value in kwargs.items():
            if k in env:
                env[k] = value
        if func.args.vararg is not None:
            env[func.args.vararg.arg] = Tup(tuple(args[len(params):]))
        self.depth += 1
        try:
            returns: list = []
            self.block(func.body, env, returns)
        finally:
            self.depth -= 1
        out = EMPTY
        for value in returns:
            out = _join(out, value) if out != EMPTY else value
        return out

    def block(self, body: list, env: dict, returns: list) -> bool:
        """Run `body`; True where it always returns or raises (the statements after it never run: Falcon-style
        `if flag: return x + attn + mlp(norm(x))` before the sequential form)."""
        for stmt in body:
            if self.statement(stmt, env, returns):
                return True
        return False

    def statement(self, stmt: ast.stmt, env: dict, returns: list) -> bool:
        if isinstance(stmt, ast.Assign):
            value = self.expr(stmt.value, env)
            for target in stmt.targets:
                self.assign(target, value, stmt.value, env)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            self.assign(stmt.target, self.expr(stmt.value, env), stmt.value, env)
        elif isinstance(stmt, ast.AugAssign):
            value = self.binop(stmt.op, self.expr(stmt.target, env), self.expr(stmt.value, env), stmt.lineno)
            self.assign(stmt.target, value, stmt.value, env)
        elif isinstance(stmt, ast.Return):
            if stmt.value is not None:
                returns.append(self.expr(stmt.value, env))
            return True
        elif isinstance(stmt, ast.Raise):
            return True
        elif isinstance(stmt, ast.Expr):
            self.expr(stmt.value, env)
        elif isinstance(stmt, ast.If):
            decided = self.condition(stmt.test)
            if decided is None:
                decided = _encoder_test(stmt.test, env)
            if decided is True:
                return self.block(stmt.body, env, returns)
            if decided is False:
                return self.block(stmt.orelse, env, returns)
            self.expr(stmt.test, env)
            other = dict(env)
            self.branch.append((stmt.test, True))
            body_ends = self.block(stmt.body, env, returns)
            self.branch[-1] = (stmt.test, False)
            else_ends = self.block(stmt.orelse, other, returns)
            self.branch.pop()
            if body_ends and else_ends:
                return True
            if body_ends:  # only the other branch's values go on
                env.clear()
                env.update(other)
            elif not else_ends:
                for name in (set(env) | set(other)) - {"__expr__"}:
                    env[name] = _join(env.get(name, EMPTY), other.get(name, EMPTY))
        elif isinstance(stmt, (ast.For, ast.While)):
            if isinstance(stmt, ast.For):
                self.assign(stmt.target, _flat(self.expr(stmt.iter, env)), None, env)
            self.block(stmt.body, env, returns)
            self.block(stmt.orelse, env, returns)
        elif isinstance(stmt, ast.With):
            self.block(stmt.body, env, returns)
        elif isinstance(stmt, ast.Try):
            self.block(stmt.body, env, returns)
            for handler in stmt.handlers:
                self.block(handler.body, env, returns)
            self.block(stmt.finalbody, env, returns)
        return False

    def assign(self, target: ast.expr, value, source: ast.expr | None, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
            env.setdefault("__expr__", {})[target.id] = source
        elif isinstance(target, (ast.Tuple, ast.List)):
            n = len(target.elts)
            items = self.unpack(value, n, source, env)
            for elt, item in zip(target.elts, items):
                self.assign(elt, item, None, env)

    def unpack(self, value, n: int, source: ast.expr | None, env: dict) -> list:
        if isinstance(value, Tup) and len(value.items) == n:
            return list(value.items)
        flat = _flat(value)
        if any(o.pending for o in flat):
            return [frozenset(_piece(o, i, o.pending, getattr(source, "lineno", o.line)) if o.pending else o
                              for o in flat) for i in range(n)]
        if isinstance(source, ast.Call):
            # A call handed n derived values and unpacked into n: each comes back in its place
            # (q, k = apply_rotary(q, k, cos, sin) when the function is not inlined).
            args = [_flat(self.expr(a, env)) for a in source.args]
            derived = [a for a in args if a]
            if len(derived) == n:
                return derived
        return [flat] * n

    # ------------------------------------------------------------------ expressions
    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Name):
            return env.get(node.id, EMPTY)
        if isinstance(node, ast.Constant):
            return EMPTY
        if isinstance(node, (ast.Tuple, ast.List)):
            return Tup(tuple(self.expr(e, env) for e in node.elts))
        if isinstance(node, ast.Starred):
            return self.expr(node.value, env)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and (items := self.comprehended(node, env)) is not None:
            return items
        if isinstance(node, ast.BinOp):
            return self.binop(node.op, self.expr(node.left, env), self.expr(node.right, env), node.lineno)
        if isinstance(node, ast.UnaryOp):
            return self.expr(node.operand, env)
        if isinstance(node, ast.IfExp):
            decided = self.condition(node.test)
            if decided is not None:
                return self.expr(node.body if decided else node.orelse, env)
            return _join(self.expr(node.body, env), self.expr(node.orelse, env))
        if isinstance(node, (ast.BoolOp, ast.Compare)):
            for sub in ast.iter_child_nodes(node):
                if isinstance(sub, ast.expr):
                    self.expr(sub, env)
            return EMPTY
        if isinstance(node, ast.Attribute):
            # x.shape, x.dtype, x.device: metadata; x.T: the data.
            base = self.expr(node.value, env)
            return base if node.attr in ("T", "mT", "data") else EMPTY
        if isinstance(node, ast.Subscript):
            return self.subscript(node, env)
        if isinstance(node, ast.Call):
            return self.call(node, env)
        return EMPTY

    def comprehended(self, node: ast.ListComp | ast.GeneratorExp, env: dict) -> Tup | None:
        """`[f(x) for x in (q, k, v)]` over a literal tuple or list: f of each item in turn, as a tuple (Falcon's
        original RW code cuts its fused projection so, then destructures the list); None for another form."""
        if len(node.generators) != 1:
            return None
        gen = node.generators[0]
        if gen.ifs or gen.is_async or not isinstance(gen.target, ast.Name) or not isinstance(gen.iter, (ast.Tuple, ast.List)):
            return None
        return Tup(tuple(self.expr(node.elt, {**env, gen.target.id: self.expr(item, env)}) for item in gen.iter.elts))

    def binop(self, op: ast.operator, left, right, line: int):
        lf, rf = _flat(left), _flat(right)
        if isinstance(op, ast.Mult) and lf and rf:
            self.events.products.append((line, lf, rf))
        if isinstance(op, ast.MatMult) and lf and rf:
            self.events.matmuls.append((line, lf, rf))
        if isinstance(op, (ast.Mult, ast.Div)) and bool(lf) != bool(rf):
            self.events.scalings.append((line, lf | rf))
        if isinstance(op, ast.Add) and lf and rf:
            self.events.sums.append((line, lf, rf, lf | rf))
        return lf | rf

    def subscript(self, node: ast.Subscript, env: dict):
        value = self.expr(node.value, env)
        index = node.slice
        if isinstance(value, Tup):
            if isinstance(index, ast.Constant) and isinstance(index.value, int) and -len(value.items) <= index.value < len(value.items):
                return value.items[index.value]
            return _flat(value)
        if not value:
            return EMPTY
        last = index.elts[-1] if isinstance(index, ast.Tuple) and index.elts else index
        if isinstance(index, ast.Tuple):
            # x[..., a, :] selects along the axis before the trailing full slices.
            meaningful = [e for e in index.elts if not _full_slice(e) and not _ellipsis(e)]
            last = meaningful[-1] if len(meaningful) == 1 else None
        # x[..., a:b]: a slice of the last axis (of a per-head view, a piece of each head).
        last_axis = (isinstance(index, ast.Tuple) and len(index.elts) == 2 and _ellipsis(index.elts[0])
                     and isinstance(index.elts[1], ast.Slice))
        out = set()
        for o in value:
            out.add(self.select(o, last, node.lineno, last_axis))
        return frozenset(out)

    def select(self, o: Origin, index: ast.expr | None, line: int, last_axis: bool = False) -> Origin:
        """The piece of a fused output that `[index]` takes, when the index picks one."""
        if o.piece is not None or index is None:
            return o
        if o.stage == "per_head_pair":  # x[..., :head_dim]: a cut this does not read as halves
            self.events.pair_cuts.append((line, o.src, False, f"[{ast.unparse(index)}]"))
            return replace(o, stage="shaped")
        number = _int(index)
        if o.pending and number is not None:
            return _piece(o, number, o.pending, line)
        if o.stage == "stacked" and number is not None and number >= 0:
            return _piece(o, number, "fused", line)
        if o.stage == "per_head_stacked" and number in (0, 1, 2):
            return _piece(o, number, "interleaved", line)
        if o.stage == "grouped":
            if number in (-2, -1):
                return _piece(o, number + 3, "grouped", line)
            if isinstance(index, ast.Slice) and index.lower is None and index.upper is not None and index.step is None:
                return _piece(o, 0, "grouped", line)
        if (o.stage == "flat" or (o.stage == "per_head" and last_axis)) and isinstance(index, ast.Slice) \
                and index.step is None:
            # One after another along the last axis: [:a] first, [a:b] in the middle, [b:] last; of a view per
            # head (…, heads, 3 * head_dim), each head's q, k, v (GPT-NeoX-Japanese's qkv[..., : self.head_size]).
            layout = "fused" if o.stage == "flat" else "interleaved"
            if index.lower is None and index.upper is not None:
                return _piece(o, 0, layout, line)
            if index.lower is not None and index.upper is not None:
                return _piece(o, 1, layout, line)
            if index.lower is not None and index.upper is None:
                return _piece(o, 2, layout, line)
        return o

    def call(self, node: ast.Call, env: dict):
        func = node.func
        args = [self.expr(a, env) for a in node.args]
        kwargs = {k.arg: self.expr(k.value, env) for k in node.keywords if k.arg}
        derived = [_flat(a) for a in args if _flat(a)]
        name = _dotted(func)
        short = name.rsplit(".", 1)[-1] if name else (func.attr if isinstance(func, ast.Attribute) else "")
        line = node.lineno
        # self.<producer>(x): a projection (or, in a decoder layer, a sublayer).
        if name.startswith("self.") and name.count(".") == 1 and short in self.producers:
            self.events.inputs.setdefault(short, []).append(
                (line, _flat(args[0]) if args else _flat(_join_all(list(kwargs.values())))))
            return frozenset({Origin(short, line=line)})
        if (name.startswith("self.") and name.count(".") == 1 and ROTARY_CALL.search(short) and derived
                and _input_for_metadata_only(self.classes, self.methods, short)):
            # Llama's older `cos, sin = self.rotary_emb(value_states, seq_len=...)`: a rotary module that reads its
            # tensor argument only for its dtype, device or shape. Its table derives from positions, not from that
            # projection (which would make the rotated q and k seem to come from v too: Hunyuan-Large).
            return frozenset()
        if name.startswith("self.") and name.count(".") == 1 and short in self.attr_values and len(derived) == 1:
            self.events.modules.append((short, line, derived[0]))
        if len(derived) >= 2:
            self.events.calls.append((line, [_flat(a) for a in args]))
            self.events.callees.setdefault(line, name)
            if self.branch:
                self.events.guards.setdefault(line, tuple(self.branch))
        if short in MATMULS and len(derived) >= 2:
            pos = [_flat(a) for a in args if _flat(a)]
            self.events.matmuls.append((line, pos[-2], pos[-1]))
        if derived and any(k.arg in SCALE_KEYWORDS and not (isinstance(k.value, ast.Constant)
                                                           and k.value.value in (1, 1.0, None))
                           for k in node.keywords):
            self.events.scalings.append((line, _join_all(derived)))
        if short in SCALERS and len(args) >= 2 and len(derived) == 1:
            self.events.scalings.append((line, derived[0]))  # torch.mul(x, s)
        # Methods on a tensor: x.view(...), x.split(...), x.size().
        if isinstance(func, ast.Attribute) and not name.startswith("self.") and short not in ("cat", "stack"):
            base = _flat(self.expr(func.value, env))
            if base:
                if short in CLAMPS:
                    self.events.clamps.append((line, base, node, dict(env.get("__expr__", {}))))
                if short in SCALERS and not derived:
                    self.events.scalings.append((line, base))  # x.mul(s), x.div_(s)
                return self.tensor_method(base, short, node, env)
        if short in CLAMPS and derived and node.args and _flat(args[0]):
            self.events.clamps.append((line, _flat(args[0]), node, dict(env.get("__expr__", {}))))  # torch.clamp(x, a, b)
            return _flat(args[0])
        if short in SPLITTERS and derived:
            return self.tensor_method(derived[0], short, node, env, first_arg=1)
        if short == "rearrange" and args and _flat(args[0]):
            return self.rearrange(_flat(args[0]), node)
        if short in RESHAPERS and derived:
            return self.tensor_method(derived[0], short, node, env, first_arg=1)
        # Functions and methods of the same source: inlined.
        target = self.resolve(func)
        if target is not None:
            fn, bound = target
            self.events.inlined.add(line)
            return self.call_function(fn, ([EMPTY] if bound else []) + args, kwargs)
        joined = _flat(_join_all([*args, *kwargs.values()]))
        if self.is_activation(func):
            if joined:
                self.events.activations.append((line, self.activation_name(func, node), joined))
            return frozenset(replace(o, act=True) for o in joined)
        return joined

    def tensor_method(self, base: frozenset, method: str, node: ast.Call, env: dict, first_arg: int = 0):
        if method in METADATA:
            return EMPTY
        rest = node.args[first_arg:]
        if method in SPLITTERS:
            pairs = {o for o in base if o.stage == "per_head_pair" and o.piece is None}
            if pairs:
                halves = self.halves(method, rest, node, env, {o.unit for o in pairs})
                how = f"{method}(…, {', '.join([*map(ast.unparse, rest), *map(ast.unparse, node.keywords)])})"
                for o in sorted(pairs, key=lambda o: o.src):
                    self.events.pair_cuts.append((node.lineno, o.src, halves, how))
                return frozenset((replace(o, pending="halves") if halves else replace(o, stage="shaped"))
                                 if o in pairs else o for o in base)
            # Cutting a projection already viewed as heads (rotate_half's chunk(2)) takes halves of each head,
            # not pieces of a fused output.
            if all(o.stage == "shaped" or o.piece is not None for o in base):
                return base
            if any(o.stage == "heads_fused" for o in base) and self.last_axis(method, rest, node, env):
                # Cut within each head, not along the heads axis of (…, q_heads + k_heads + v_heads, head_dim).
                return frozenset(replace(o, stage="shaped") if o.piece is None else o for o in base)
            layout = ("interleaved" if any(o.stage == "per_head" for o in base)
                      else "blocked" if any(o.stage == "blocked" for o in base) else "fused")
            if layout == "blocked" and not self.last_axis(method, rest, node, env):
                return frozenset(replace(o, stage="shaped") if o.piece is None else o for o in base)
            return frozenset(replace(o, pending=layout) if o.piece is None else o for o in base)
        if method in RESHAPERS:
            # A shape this does not recognize ("shaped") stops slices from reading as pieces
            # (rotate_half's x[..., : d // 2] on a q already viewed per head).
            stage = self.shape_stage(method, rest, node, env)
            unit = None
            dims = self.dims(method, rest, env)
            if stage is None and all(o.piece is None and o.stage == "flat" for o in base):
                blocks = self.blocks(dims)
                if blocks is not None:
                    for o in base:
                        self.events.blocked_views.setdefault(o.src, []).append(blocks)
                    return frozenset(replace(o, stage="blocked", unit=str(blocks)) for o in base)
            for o in base:
                if o.piece is None and o.stage == "flat" and dims:
                    self.events.head_views.setdefault(o.src, ast.unparse(dims[-1]))
            # A pair view of the projection's own output (not a rotary reshape of q already viewed per head).
            if stage is None and self.read_pairs and all(o.piece is None and o.stage == "flat" for o in base):
                unit = self.pair_unit(dims, env)
                if unit is not None:
                    for o in base:
                        self.events.pair_views.setdefault(o.src, (node.lineno, ast.unparse(node), unit))
                    # (…, heads, 2 * unit) reads as halves; (…, heads, 2, unit) stays unread
                    stage = "per_head_pair" if unit else None
            stage = stage or "shaped"
            return frozenset(replace(o, stage=stage, unit=unit or None) if o.piece is None else o for o in base)
        return base

    def dims(self, method: str, args: list, env: dict) -> list:
        """The dimensions a view/reshape/unflatten gives, as written (locals replaced by what they hold); of a
        shape written `x.shape[:-1] + (a, b)`, the trailing ones it adds."""
        exprs = [self.local_expr(a, env) for a in args]
        if method == "unflatten":
            dims = exprs[1].elts if len(exprs) >= 2 and isinstance(exprs[1], (ast.Tuple, ast.List)) else []
        elif (len(exprs) == 1 and isinstance(exprs[0], ast.BinOp) and isinstance(exprs[0].op, ast.Add)
              and isinstance(exprs[0].right, (ast.Tuple, ast.List))):
            dims = exprs[0].right.elts
        else:
            dims = exprs[0].elts if len(exprs) == 1 and isinstance(exprs[0], (ast.Tuple, ast.List)) else exprs
        return [self.local_expr(d, env) for d in dims]

    @staticmethod
    def blocks(dims: list) -> int | None:
        """The number of blocks of a view (…, blocks, -1) with blocks a number the code writes (CodeGen's
        `qkv.reshape(qkv.shape[:-1] + (mp_num, -1))`, mp_num = 4): each block then holds a part of every head
        kind, cut along the last axis."""
        if len(dims) >= 2 and _int(dims[-1]) == -1 and (blocks := _int(dims[-2])) is not None and blocks >= 2:
            return blocks
        return None

    def last_axis(self, method: str, args: list, node: ast.Call, env: dict) -> bool:
        """Whether a split/chunk cuts along the last axis (dim=-1, or the dim written as the last positional)."""
        dim = next((k.value for k in node.keywords if k.arg in ("dim", "axis")), args[1] if len(args) > 1 else None)
        return dim is not None and _int(self.local_expr(dim, env)) == -1

    def pair_unit(self, dims: list, env: dict) -> str | None:
        """A view per head as a pair: (…, heads, 2 * unit) gives the unit as written (`self.head_dim` in
        Qwen3-Next's `.view(*input_shape, -1, self.head_dim * 2)`), (…, heads, 2, unit) gives "" (a pair this does
        not read as halves); None for any other shape."""
        if len(dims) < 2:
            return None
        last = dims[-1]
        if isinstance(last, ast.BinOp) and isinstance(last.op, ast.Mult):
            for factor, other in ((last.left, last.right), (last.right, last.left)):
                if _int(factor) == 2 and _int(other) is None:
                    return ast.unparse(self.local_expr(other, env))
        if len(dims) >= 3 and _int(dims[-2]) == 2 and _int(dims[-1]) is None:
            return ""
        return None

    def halves(self, method: str, args: list, node: ast.Call, env: dict, units: set) -> bool:
        """Whether a cut of a per-head pair view takes its two halves along the last axis: chunk(2, dim=-1),
        split(unit, dim=-1) or split([unit, unit], dim=-1) (tensor_split(2, dim=-1) as chunk)."""
        if len(units) != 1:
            return False
        (unit,) = units
        dim = next((k.value for k in node.keywords if k.arg == "dim"), args[1] if len(args) > 1 else None)
        if dim is None or _int(self.local_expr(dim, env)) != -1 or not args:
            return False
        size = self.local_expr(args[0], env)
        if method in ("chunk", "tensor_split"):
            return _int(size) == 2
        if method == "split":
            sizes = size.elts if isinstance(size, (ast.Tuple, ast.List)) else [size]
            written = [ast.unparse(self.local_expr(s, env)) for s in sizes]
            return len(sizes) in (1, 2) and all(w == unit for w in written)
        return False

    def shape_stage(self, method: str, args: list, node: ast.Call, env: dict) -> str | None:
        """What a view/reshape/unflatten does to a fused output: per head (…, heads, 3 * head_dim), grouped per KV
        head (…, kv_heads, groups + 2, head_dim) or stacked (3, …)."""
        exprs = [self.local_expr(a, env) for a in args]
        dims = exprs[0].elts if len(exprs) == 1 and isinstance(exprs[0], (ast.Tuple, ast.List)) else exprs
        if method in ("view", "reshape") and len(dims) >= 3 and _int(dims[-2]) == 3:
            return "per_head_stacked"  # (…, heads, 3, head_dim): Persimmon's q, k, v per head
        if method in ("view", "reshape") and len(dims) >= 3 and len(_terms(self.local_expr(dims[-2], env))) == 3:
            # (…, q_heads + k_heads + v_heads, head_dim): OpenELM's; cut along that axis, the rows of a fused output.
            return "heads_fused"
        if method == "unflatten" and len(exprs) >= 2 and isinstance(exprs[1], (ast.Tuple, ast.List)) and \
                exprs[1].elts and _int(exprs[1].elts[0]) == 3:
            return "stacked"
        for e in exprs:
            for sub in subtree(e):
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult) and 3 in (_int(sub.left), _int(sub.right)):
                    return "per_head"
                if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add) and 2 in (_int(sub.left), _int(sub.right)) \
                        and _per_group(sub.right if _int(sub.left) == 2 else sub.left):
                    return "grouped"
        return None

    def rearrange(self, base: frozenset, node: ast.Call):
        pattern = node.args[1] if len(node.args) > 1 else None
        if not (isinstance(pattern, ast.Constant) and isinstance(pattern.value, str)):
            return base
        left, _, right = pattern.value.partition("->")
        grouped = any(isinstance(k.value, ast.BinOp) and isinstance(k.value.op, ast.Add)
                      and 2 in (_int(k.value.left), _int(k.value.right)) for k in node.keywords)
        if "(" in left and "(" not in right and grouped:
            return frozenset(replace(o, stage="grouped") if o.piece is None else o for o in base)
        return base

    def local_expr(self, node: ast.expr, env: dict) -> ast.expr:
        """A local name's assigned expression (hidden_shape = (*input_shape, -1, 3 * self.head_size))."""
        if isinstance(node, ast.Starred):
            node = node.value
        if isinstance(node, ast.Name):
            found = env.get("__expr__", {}).get(node.id)
            if found is not None:
                return found
        return node

    def resolve(self, func: ast.expr) -> tuple[ast.FunctionDef, bool] | None:
        """The function a call runs, when the source defines it: (function, takes self)."""
        name = _dotted(func)
        if name.startswith("self.") and name.count(".") == 1:
            attr = name[5:]
            if attr in self.methods:
                return self.methods[attr], True
            assigned = self.attr_values.get(attr)
            if isinstance(assigned, ast.Name) and assigned.id in self.local_functions:
                return self.local_functions[assigned.id], False
            if isinstance(assigned, ast.Call):
                cls = self.classes.get(_dotted(assigned.func).rsplit(".", 1)[-1])
                forward = next((n for n in cls[1].body if isinstance(n, ast.FunctionDef) and n.name == "forward"),
                               None) if cls else None
                if forward is not None:
                    return forward, True
            return None
        if isinstance(func, ast.Name) and func.id in self.functions:
            return self.functions[func.id][1], False
        return None

    def is_activation(self, func: ast.expr) -> bool:
        name = _dotted(func)
        if name.startswith("self.") and name.count(".") == 1:
            assigned = self.attr_values.get(name[5:])
            if isinstance(assigned, ast.Subscript) and _dotted(assigned.value).endswith("ACT2FN"):
                return True
            if isinstance(assigned, ast.Call):
                callee = _dotted(assigned.func).rsplit(".", 1)[-1].lower()
                return callee == "get_activation" or any(a in callee for a in ACTIVATIONS)
        short = name.rsplit(".", 1)[-1].lower() if name else ""
        return any(a in short for a in ACTIVATIONS)

    def activation_name(self, func: ast.expr, node: ast.Call) -> str | None:
        """The activation a call computes, lower case, where the code says it plainly: a function of one tensor
        (torch.sigmoid(x), F.softplus(x)), a module built from a class named for it (nn.Sigmoid()) or
        ACT2FN[...] under a string or a config key config.json holds. None otherwise (extra arguments such as a
        softplus beta included)."""
        name = _dotted(func)
        if name.startswith("self.") and name.count(".") == 1:
            assigned = self.attr_values.get(name[5:])
            if isinstance(assigned, ast.Subscript) and _dotted(assigned.value).endswith("ACT2FN"):
                key = assigned.slice
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    return key.value.lower()
                value, dotted = None, _dotted(key)
                if dotted.startswith(("config.", "self.config.")):
                    value = self.config.get(dotted.rsplit(".", 1)[-1])
                return value.lower() if isinstance(value, str) else None
            if isinstance(assigned, ast.Call) and not assigned.args and not assigned.keywords:
                return _dotted(assigned.func).rsplit(".", 1)[-1].lower()
            return None
        if len(node.args) != 1 or node.keywords:
            return None
        return name.rsplit(".", 1)[-1].lower() if name else None

    def condition(self, test: ast.expr) -> bool | None:
        """A branch condition the config decides (`if self.multi_query_attention:`), else None."""
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            inner = self.condition(test.operand)
            return None if inner is None else not inner
        name = _dotted(test)
        key = None
        if name.startswith("self.") and name.count(".") == 1:
            assigned = self.attr_values.get(name[5:])
            if assigned is not None and _dotted(assigned).startswith("config.") and _dotted(assigned).count(".") == 1:
                key = _dotted(assigned)[7:]
            elif isinstance(assigned, ast.Name) and isinstance(default := _bool_default(self.init, assigned.id), bool):
                # A constructor flag left at its default (GPT-2's is_cross_attention=False): the decoder's
                # self-attention is built without it.
                return default
        elif name.startswith(("config.", "self.config.")) and name.count(".") == name.startswith("self.") + 1:
            key = name.rsplit(".", 1)[1]
        if key is not None and isinstance(self.config.get(key), bool):
            return self.config[key]
        if isinstance(test, (ast.BoolOp, ast.Compare)):
            # `self.config.new_decoder_architecture and self.config.num_ln_in_parallel_attn == 2` (Falcon): config
            # values and the attributes the class copies from them, compared and combined.
            decided = conditions.evaluate(config_reads(test, self.aliases), self.config)
            if decided is not None:
                return decided
        return self.layer_uniform(test)

    def layer_uniform(self, test: ast.expr) -> bool | None:
        """A test over what __init__ computed from the config and the layer's index (Gemma 4's
        `self.is_kv_shared_layer`, `layer_idx >= num_hidden_layers - num_kv_shared_layers`; its `self.v_proj is not
        None`, built unless `config.attention_k_eq_v` on a full-attention layer), with the same truth in every layer
        of config.json's num_hidden_layers; else None (a layer that differs is not decided)."""
        layers = self.config.get("num_hidden_layers")
        if self.init is None or not isinstance(layers, int) or isinstance(layers, bool) or not 0 < layers <= 1024:
            return None
        counts: dict[str, int] = {}
        for node in subtree(self.init):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Attribute) and _dotted(target.value) == "self":
                        counts[target.attr] = counts.get(target.attr, 0) + 1
        attrs = {a: v for a, v in self.attr_values.items() if counts.get(a) == 1 and a != "config"}
        local = _init_locals(self.init)
        bases = {n.value.id for n in subtree(self.init) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
        # The __init__ parameters read as plain values (the layer's index), not as objects (the config).
        index = {a.arg for a in self.init.args.args[1:] + self.init.args.kwonlyargs} - bases
        found = {"substituted": False}

        class Resolve(ast.NodeTransformer):
            def __init__(self, inside: bool, depth: int):
                self.inside, self.depth = inside, depth

            def deeper(self, value: ast.expr) -> ast.AST:
                found["substituted"] = True
                return Resolve(True, self.depth + 1).visit(copy.deepcopy(value)) if self.depth < 8 else value

            def visit_Attribute(self, node):
                if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in attrs:
                    return self.deeper(attrs[node.attr])
                return self.generic_visit(node)

            def visit_Name(self, node):
                if self.inside and node.id in local:
                    return self.deeper(local[node.id])
                if self.inside and node.id in index:
                    return ast.Name(id="__layer__", ctx=ast.Load())
                return node

        resolved = Resolve(False, 0).visit(copy.deepcopy(test))
        if not found["substituted"]:
            return None
        if self.layer is not None:  # one layer's branches (attention_layer_branches)
            return conditions.evaluate(resolved, self.config, {"__layer__": self.layer})
        each = [conditions.evaluate(resolved, self.config, {"__layer__": i}) for i in range(layers)]
        if None not in each and len(set(each)) == 2:
            # Decided in every layer, but not alike: the layers compute differently (Gemma 4's KV-shared layers).
            self.layer_branches.setdefault(getattr(test, "lineno", 0),
                                           (ast.unparse(test), [i for i, t in enumerate(each) if t]))
        alone = conditions.evaluate(resolved, self.config, {})  # whatever the layer (`config.flag and ...`)
        if alone is not None:
            return alone
        if any(isinstance(n, ast.Subscript) and any(isinstance(m, ast.Name) and m.id == "__layer__"
                                                    for m in ast.walk(n.slice)) for n in ast.walk(resolved)):
            # A per-layer config list (`config.no_rope_layers[layer_idx]`, layer_types): left undecided, for the
            # readers of per-layer conditions (the rotary guard, the window) to follow per layer.
            return None
        return each[0] if None not in each and len(set(each)) == 1 else None


ENCODER_INPUT = "encoder"  # cross-attention inputs (encoder_hidden_states): a decoder-only model gets none


def _encoder_test(test: ast.expr, env: dict) -> bool | None:
    """`encoder_hidden_states is not None` (or a local holding it, GPT-2's is_cross_attention): False, since a
    decoder-only causal LM is never given encoder states; `... is None`: True. Else None (undecided)."""
    if isinstance(test, ast.Name):
        test = env.get("__expr__", {}).get(test.id)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Is, ast.IsNot))
            and isinstance(test.left, ast.Name) and ENCODER_INPUT in test.left.id
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None):
        return None
    return isinstance(test.ops[0], ast.Is)


def encoder_only_modules(sources: dict, list_attr: str | None = None) -> dict[str, str]:
    """Modules the decoder layer's forward calls only under `if encoder_hidden_states is not None:` (TrOCR's
    encoder_attn and encoder_attn_layer_norm: cross-attention to an encoder's states, which a decoder-only causal
    LM never runs), attribute -> FILE:LINE of the call; empty where there are none or no layer class is found."""
    found = layer_class(sources, list_attr)
    if found is None:
        return {}
    file, cls, _ = found
    forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    out: dict[str, str] = {}
    for node in subtree(forward) if forward is not None else ():
        if isinstance(node, ast.If) and _encoder_test(node.test, {}) is False:
            for sub in node.body:
                for call in subtree(sub):
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"):
                        out.setdefault(call.func.attr, _where(file, call.lineno,
                                                              f"self.{call.func.attr}(...) under `{ast.unparse(node.test)}`"))
    return out


def _bool_default(func: ast.FunctionDef | None, param: str) -> bool | None:
    """The constant boolean default of `func`'s parameter `param`, else None."""
    if func is None:
        return None
    args = func.args.posonlyargs + func.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(func.args.defaults):]], func.args.defaults))
    defaults.update({a.arg: d for a, d in zip(func.args.kwonlyargs, func.args.kw_defaults) if d is not None})
    value = defaults.get(param)
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, bool) else None


def _switched_off(init: ast.FunctionDef | None, config: dict) -> set[str]:
    """Attributes __init__ builds only under `if config.K:` with K false in config.json (GPT-2's crossattention
    under config.add_cross_attention): modules this checkpoint's model does not have."""
    out: set[str] = set()
    if init is None:
        return out
    for node in subtree(init):
        if not isinstance(node, ast.If):
            continue
        test = _dotted(node.test)
        key = test.rsplit(".", 1)[-1] if test.startswith(("config.", "self.config.")) else None
        if key is None or config.get(key) is not False:
            continue
        for sub in node.body:
            for n in subtree(sub):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and _dotted(n.targets[0]).startswith("self.") \
                        and _dotted(n.targets[0]).count(".") == 1:
                    out.add(_dotted(n.targets[0])[5:])
    return out


def _join_all(values: list):
    out = EMPTY
    for v in values:
        out = out | _flat(v)
    return out


def _piece(o: Origin, index: int, layout: str, line: int) -> Origin:
    return replace(o, piece=index, layout=layout, pending=None, line=line)


def _per_group(node: ast.expr) -> bool:
    """Whether `node + 2` counts one KV group's rows (heads // kv_heads + 2, Falcon's new decoder; a count named a
    group), not every query head's (Falcon's multi-query `num_heads + 2`: one KV head after all queries, cut as
    fused rows)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Div)):
        return True
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return "group" in name.lower()


def _int(node) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.List) and len(node.elts) == 1:  # x[..., [-2]]: the same piece, its axis kept (Falcon)
        return _int(node.elts[0])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int(node.operand)
        return None if inner is None else -inner
    return None


def _full_slice(node) -> bool:
    return isinstance(node, ast.Slice) and node.lower is None and node.upper is None and node.step is None


def _ellipsis(node) -> bool:
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _init_locals(init: ast.FunctionDef | None) -> dict[str, ast.expr]:
    """The plain locals of __init__ assigned once, at its top level (`layer_type = config.layer_types[layer_idx]
    if hasattr(config, "layer_types") else None`), with what they are assigned; not its parameters."""
    if init is None:
        return {}
    params = {a.arg for a in init.args.args + init.args.kwonlyargs}
    counts: dict[str, int] = {}
    for node in subtree(init):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for name in subtree(target):
                    if isinstance(name, ast.Name):
                        counts[name.id] = counts.get(name.id, 0) + 1
    return {stmt.targets[0].id: stmt.value for stmt in init.body
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
            and counts.get(stmt.targets[0].id) == 1 and stmt.targets[0].id not in params}


METADATA = frozenset({"dtype", "device", "shape", "size", "dim", "ndim"})


def _input_for_metadata_only(classes: dict, methods: dict, attr: str) -> bool:
    """Whether every class the module's methods assign to `self.<attr>` (its branches: a rotary embedding per
    scaling type, built in a helper such as _init_rope) has a forward, its own or inherited from a class of the
    sources, that reads its first tensor argument only as x.dtype, x.device, x.shape, x.size(...) or x.dim()."""
    built = [node.value for method in methods.values() for node in subtree(method)
             if isinstance(node, ast.Assign) and len(node.targets) == 1 and _dotted(node.targets[0]) == f"self.{attr}"]
    if not built:
        return False
    for value in built:
        name = _dotted(value.func) if isinstance(value, ast.Call) else ""
        found = classes.get(name.rsplit(".", 1)[-1]) if name else None
        forward, seen = None, set()
        while found is not None and forward is None and found[1].name not in seen:
            seen.add(found[1].name)
            forward = next((f for f in found[1].body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            bases = [_dotted(b).rsplit(".", 1)[-1] for b in found[1].bases]
            found = next((classes[b] for b in bases if b in classes), None)
        if forward is None or len(forward.args.args) < 2:
            return False
        first = forward.args.args[1].arg
        parents = {id(child): node for node in ast.walk(forward) for child in ast.iter_child_nodes(node)}
        for use in (n for n in ast.walk(forward) if isinstance(n, ast.Name) and n.id == first):
            parent = parents.get(id(use))
            if not (isinstance(parent, ast.Attribute) and parent.value is use and parent.attr in METADATA):
                return False
    return True


def _init_assignments(init: ast.FunctionDef | None) -> dict[str, ast.expr]:
    """self.X = <expr> in __init__ (the last one, where several branches assign it)."""
    out: dict[str, ast.expr] = {}
    if init is None:
        return out
    for node in subtree(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and _dotted(node.targets[0].value) == "self":
            out.setdefault(node.targets[0].attr, node.value)
    return out


def _terms(node: ast.expr) -> list[ast.expr]:
    """The operands of a sum of names or attributes (`a + b + c`); [] where any is a number or anything else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _terms(node.left), _terms(node.right)
        return left + right if left and right else []
    return [node] if isinstance(node, (ast.Name, ast.Attribute)) else []


def _identity_call(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "Identity" and not node.args


def _other_assignments(init: ast.FunctionDef | None, config: dict) -> dict[str, list[ast.expr]]:
    """self.X = <call> in __init__ after the first one (_init_assignments keeps the first): the other branch of
    an `if` the config does not decide."""
    seen: dict[str, list[ast.expr]] = {}
    if init is None:
        return seen
    for node in subtree(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and _dotted(node.targets[0].value) == "self":
            seen.setdefault(node.targets[0].attr, []).append(conditions.selected(node.value, config))
    return {a: [v for v in values[1:] if isinstance(v, ast.Call)] for a, values in seen.items() if len(values) > 1}


def _mlp_or_none(sources: dict, found: tuple, config: dict):
    try:
        return analyze_mlp(sources, found[0], found[1], config)
    except Undecided:
        return None


# ====================================================================== the answers
@dataclass(frozen=True)
class Linear:
    attr: str
    bias: str  # the bias= expression as written ("False", "config.bias"); "True" when left out
    line: int


@dataclass(frozen=True)
class Attention:
    cls: str
    file: str
    layout: str  # separate, fused, interleaved, grouped, blocked
    q: str
    k: str
    v: str
    o: str | None
    evidence: str  # FILE:LINE: what decided it
    linears: dict
    # layout "blocked": the number of blocks the fused output is viewed as, and the order of the parts in each
    # ("qvk": the queries' part, then the values', then the keys')
    qkv_blocks: int = 0
    qkv_block_order: str = ""
    # The modules forward applies to the queries alone and to the keys alone (q/k norms, whatever their names),
    # and whether it does so after the rotary embedding (None: no call took q and k together before them).
    q_norm: str | None = None
    k_norm: str | None = None
    qk_norm_after_rope: bool | None = None
    qk_norm_evidence: str = ""
    qk_norm_per_head: bool = True  # the queries reach their norm viewed as heads, not as the flat projection
    # The one module forward applies to the values alone (Gemma 4's v_norm), and FILE:LINE of that call.
    v_norm: str | None = None
    v_norm_evidence: str = ""
    # A projection of the layer's input whose activation multiplies the attention output (AfMoE's gate_proj:
    # `output * torch.sigmoid(gate_states)` before o_proj), and FILE:LINE of the product; None when none.
    output_gate: str | None = None
    output_gate_evidence: str = ""
    output_gate_act: str | None = None  # the gate's activation as the code names it (sigmoid, softplus, ...)
    output_gate_act_line: int = 0
    # The condition the rotary embedding runs under, when the config alone does not decide it (AfMoE rotates on
    # its sliding-window layers only: `config.layer_types[layer_idx] == "sliding_attention"`), as the code writes
    # it with a module attribute replaced by its __init__ value; "" with the evidence where it cannot be read.
    rotary_guard: str | None = None
    rotary_guard_when: bool = True
    rotary_guard_evidence: str = ""
    # FILE:LINE where forward computes the scores itself, q @ k^T, with nothing multiplying or dividing q, k or
    # the scores on the way and no attention function of another source taking q, k and v (GPT-Neo's _attn:
    # unscaled scores, where vLLM's Attention would take head_dim ** -0.5); "" otherwise.
    unscaled_scores: str = ""
    # The output gate folded into the query projection (Qwen3-Next's): q's output viewed per head as
    # [query | gate], 2 x head_dim, and cut in two, the first half the queries, an activation of the second scaling
    # the attention output before o_proj. Then output_gate is q's projection, output_gate_act its activation, and
    # this FILE:LINE: what was read; "" where there is none.
    query_gate: str = ""
    # Where q's projection is viewed per head as a pair but not read as that form (another cut, the gate first, no
    # gate found): FILE:LINE: why. A port would mis-read the rows; the layout refuses with this.
    query_gate_refusal: str = ""
    # A clamp of what the q/k/v projections compute (DBRX's clip_qkv, OLMo's): FILE:LINE: the clamp as written, which
    # of q, k, v it reaches, the config value its upper bound reads (dotted, "" where it reads none) and that value
    # (None where config.json holds no number there). "" where forward clamps nothing config.json does not null.
    qkv_clamp: str = ""
    qkv_clamp_roles: str = ""
    qkv_clamp_bound: str = ""
    qkv_clamp_value: float | None = None
    qkv_clamp_problem: str = ""  # why the port's clamp would compute otherwise; "" where it computes the same


@dataclass(frozen=True)
class Mlp:
    cls: str
    file: str
    kind: str  # gated, plain
    gate: str | None
    up: str
    down: str
    fused: bool  # gate and up in one projection
    up_first: bool  # ... with the up half first
    evidence: str
    linears: dict
    # The activation a Sequential MLP's module child applies (transformers' name); "" where the code calls one.
    activation: str = ""


@dataclass(frozen=True)
class Layer:
    cls: str
    file: str
    attention: str | None
    mlp: str | None
    norms: dict  # role (attn_norm, mlp_norm, attn_post_norm, mlp_post_norm) -> attribute
    evidence: dict  # role -> FILE:LINE: ...
    attention_flow: Attention | None
    mlp_flow: Mlp | None
    undecided: tuple  # what the code did not decide, with why
    # OPT-style layouts: the MLP's projections are the layer's own modules (fc1, fc2), no MLP module; `mlp` is
    # then None and mlp_flow reads the layer class itself.
    mlp_on_layer: bool = False
    # Whether the MLP's norm reads the layer's input untouched by the attention (GPT-NeoX's parallel residual,
    # Falcon's ln_mlp): True, False where it reads the attention's output, None where the code does not say.
    mlp_norm_parallel: bool | None = None
    # An attention wrapper (GPT-Neo's attn: GPTNeoAttention holds no projection and hands its input to its
    # `attention`): the module inside it that attention_flow reads, and FILE:LINE of the call handing it on.
    attention_inner: str | None = None
    attention_inner_evidence: str = ""
    # Post-LN (GPT-1's `n = ln_1(x + attn(x)); h = ln_2(n + mlp(n))`): each norm reads the sum of the residual and
    # its sublayer's output, and the normed sum is the next residual; norms then holds attn_post_norm and
    # mlp_post_norm. FILE:LINE: what was read; "" otherwise.
    residual_norm: str = ""

    @property
    def attention_path(self) -> str | None:
        """The module holding the attention's projections, relative to the layer (attn.attention)."""
        if self.attention is None or self.attention_inner is None:
            return self.attention
        return f"{self.attention}.{self.attention_inner}"


class Undecided(Exception):
    """The code does not decide a role; the message says why."""


def _class(sources: dict, name: str) -> tuple[str, ast.ClassDef] | None:
    return _classes(sources).get(name.rsplit(".", 1)[-1])


def linears(file: str, cls: ast.ClassDef, classes: frozenset | set = frozenset(LINEAR_CLASSES)) -> dict[str, Linear]:
    """self.X = nn.Linear(...) in the class's __init__ (or any of `classes`: the linear layer classes of the
    code, scaffold.detect.linears)."""
    out = {}
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    for attr, value in _init_assignments(init).items():
        if (isinstance(value, ast.IfExp) and isinstance(value.body, ast.Call)
                and isinstance(value.orelse, ast.Constant) and value.orelse.value is None):
            # `nn.Linear(...) if not self.use_alternative_attention else None` (Gemma 4's v_proj): the projection
            # where it is built; forward's `self.v_proj is not None` says where it is used.
            value = value.body
        if isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1] in classes:
            bias = next((ast.unparse(k.value) for k in value.keywords if k.arg == "bias"), None)
            if bias is None:
                bias = ast.unparse(value.args[2]) if len(value.args) > 2 else "True"
            out[attr] = Linear(attr, bias, value.lineno)
    return out


def _submodule_class(sources: dict, value: ast.expr) -> tuple[str, ast.ClassDef] | None:
    """The class a `self.X = ...` value builds: Cls(...), or TABLE[key](...) with TABLE a dict of classes (its
    first entry: the eager implementation)."""
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Subscript):
        table = _dotted(func.value)
        for _, tree in _parsed(sources):
            for node in tree.body:
                if isinstance(node, ast.Assign) and any(_dotted(t) == table for t in node.targets) \
                        and isinstance(node.value, ast.Dict) and node.value.values:
                    return _class(sources, _dotted(node.value.values[0]))
        return None
    return _class(sources, _dotted(func))


# Torch's activation modules by class name (a child of an nn.Sequential MLP), as transformers' ACT2FN names them.
SEQUENTIAL_ACTIVATIONS = {"ReLU": "relu", "GELU": "gelu", "SiLU": "silu", "Tanh": "tanh", "Sigmoid": "sigmoid"}
SEQUENTIAL_SKIPPED = ("Dropout", "Identity")


def sequential_children(sources: dict, value: ast.expr) -> tuple[str, list[ast.expr], int] | None:
    """(file, children, line) of an nn.Sequential a `self.X = ...` value builds: nn.Sequential(...) itself, or a
    module-level function of the sources whose one return is one (CTRL's point_wise_feed_forward_network)."""
    if not isinstance(value, ast.Call):
        return None
    name = _dotted(value.func).rsplit(".", 1)[-1]
    if name == "Sequential":
        return "", list(value.args), value.lineno
    for file, tree in _parsed(sources):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                returns = [n for n in subtree(node) if isinstance(n, ast.Return)]
                if (len(returns) == 1 and isinstance(returns[0].value, ast.Call)
                        and _dotted(returns[0].value.func).rsplit(".", 1)[-1] == "Sequential"):
                    return file, list(returns[0].value.args), returns[0].lineno
    return None


def analyze_sequential_mlp(sources: dict, value: ast.expr, file: str) -> Mlp | None:
    """A plain MLP built as nn.Sequential(Linear, activation module, Linear) (dropouts aside): the children are
    numbered, so the up and down projections are "0" and "2" (their indices); the activation is the module's
    (Mlp.activation). None for any other Sequential."""
    found = sequential_children(sources, value)
    if found is None:
        return None
    where, children, line = found
    where = where or file
    linear = set(linear_classes(sources))
    kinds = []
    for index, child in enumerate(children):
        callee = _dotted(child.func).rsplit(".", 1)[-1] if isinstance(child, ast.Call) else ""
        if callee in SEQUENTIAL_SKIPPED:
            continue
        kind = "linear" if callee in linear else SEQUENTIAL_ACTIVATIONS.get(callee)
        if kind is None:
            return None
        kinds.append((index, kind, child))
    if len(kinds) != 3 or kinds[0][1] != "linear" or kinds[2][1] != "linear" or kinds[1][1] == "linear":
        return None
    (up, _, up_call), (_, act, _), (down, _, down_call) = kinds

    def bias(call: ast.Call) -> str:
        return next((ast.unparse(k.value) for k in call.keywords if k.arg == "bias"), "True")

    linears_found = {str(up): Linear(str(up), bias(up_call), up_call.lineno),
                     str(down): Linear(str(down), bias(down_call), down_call.lineno)}
    return Mlp("Sequential", where, "plain", None, str(up), str(down), False, False,
               _where(where, line, f"nn.Sequential: child {down} (a linear) reads the {act} of child {up} (a linear)"),
               linears_found, activation=act)


def _where(file: str, line: int, text: str) -> str:
    return f"{file}:{line}: {text}"


def _first_own_layer(sources: dict, file: str, cls: ast.ClassDef, producers: set, config: dict) -> Interpreter:
    """The interpreter run over the first layer's branches whose q, k, v come from three projections; raises
    Undecided where no layer's do."""
    layers = config.get("num_hidden_layers")
    for i in range(layers if isinstance(layers, int) and not isinstance(layers, bool) and 0 < layers <= 1024 else 0):
        interp = Interpreter(sources, file, cls, producers, config)
        interp.read_pairs = True
        interp.layer = i
        try:
            interp.run_method("forward", [frozenset(), frozenset(), frozenset()])
            _qkv_roles(interp.events)
        except Undecided:
            continue
        return interp
    raise Undecided(f"no layer's {cls.name}.forward takes q, k and v from three projections")


def analyze_attention(sources: dict, file: str, cls: ast.ClassDef, config: dict) -> Attention:
    """Which projection gives q, k and v, and how a fused one is cut; raises Undecided."""
    found = linears(file, cls, set(linear_classes(sources)))
    if not found:
        raise Undecided(f"{cls.name} declares no nn.Linear in __init__")
    interp = Interpreter(sources, file, cls, set(found), config)
    interp.read_pairs = True
    interp.run_method("forward", [frozenset(), frozenset(), frozenset()])
    try:
        roles = _qkv_roles(interp.events)
    except Undecided:
        if not interp.layer_branches:
            raise
        # Branches config.json decides differently per layer (Gemma 4's keys taken as values in its full-attention
        # layers): read the first layer whose branches give q, k and v three projections; kvshare.py reads how
        # the other layers differ from it, or refuses.
        interp = _first_own_layer(sources, file, cls, set(found), config)
        roles = _qkv_roles(interp.events)
    keys = {r: next(iter(roles[r])) for r in "qkv"}
    srcs = {keys[r][0] for r in "qkv"}
    origins = {r: roles[r][keys[r]] for r in "qkv"}
    halves = [r for r in "qkv" if keys[r][2] == "halves"]
    query_gate: dict = {}
    extra: dict = {}
    whole = dict(keys)  # the layout below reads the queries' projection as a whole
    if halves:
        if halves != ["q"] or len(srcs) != 3 or any(keys[r][1] is not None for r in "kv"):
            raise Undecided(f"{cls.name}.forward: {', '.join(halves)} come from halves of a projection viewed per "
                            f"head as a pair ({keys}); only the queries, beside separate k and v projections, are "
                            "read that way")
        query_gate = _query_gate(interp.events, keys, file)
        whole["q"] = (keys["q"][0], None, None)
    elif keys["q"][0] in interp.events.pair_views:
        line, view, _ = interp.events.pair_views[keys["q"][0]]
        cuts = [f"line {at}: {how}" for at, src, read, how in interp.events.pair_cuts if src == keys["q"][0]]
        query_gate = {"query_gate_refusal": _where(
            file, line, f"{keys['q'][0]}'s output is viewed per head as a pair ({view}), "
            + (f"then cut as {'; '.join(cuts)}" if cuts else "never cut in two")
            + ": not the query and output gate per head this reads (a view of 2 x head_dim, cut into two halves "
              "of head_dim along the last axis, chunk(2, dim=-1) or split(head_dim, dim=-1), the queries first)")}
    if len(srcs) == 3 and all(whole[r][1] is None for r in "qkv"):
        layout, q, k, v = "separate", keys["q"][0], keys["k"][0], keys["v"][0]
        evidence = _where(file, origins["q"], f"q, k, v are {q}, {k}, {v}")
    elif len(srcs) == 1 and [keys[r][1] for r in "qkv"] == [0, 1, 2] and len({keys[r][2] for r in "qkv"}) == 1 \
            and keys["q"][2] != "blocked":
        layout = keys["q"][2]
        q = k = v = keys["q"][0]
        what = {"fused": "q, k, v one after another", "interleaved": "q, k, v per head",
                "grouped": "per KV head: its query heads, then k, then v"}[layout]
        evidence = _where(file, origins["k"], f"{q}'s output cut into {what}")
    elif (len(srcs) == 1 and sorted(keys[r][1] for r in "qkv") == [0, 1, 2]
          and {keys[r][2] for r in "qkv"} == {"blocked"}
          and len(blocked := set(interp.events.blocked_views.get(keys["q"][0], ()))) == 1):
        # The output viewed as [..., blocks, -1] and each block cut along its last axis into three parts, in the
        # order the pieces say (CodeGen's q, v, k in each of mp_num = 4 blocks).
        layout, q, k, v = "blocked", keys["q"][0], keys["q"][0], keys["q"][0]
        order = "".join(sorted("qkv", key=lambda r: keys[r][1]))
        extra["qkv_blocks"], extra["qkv_block_order"] = blocked.pop(), order
        evidence = _where(file, origins["k"], f"{q}'s output viewed as {extra['qkv_blocks']} blocks along its rows, "
                                              f"each cut into {', '.join(order)}")
    else:
        raise Undecided(f"{cls.name}.forward: q, k, v come from {keys}, not three projections or three pieces of "
                        "one in q, k, v order")
    used = {q, k, v}
    after = [a for a, calls in interp.events.inputs.items() if a not in used and any(o for _, o in calls)]
    o_proj = after[0] if len(after) == 1 else None
    if query_gate.get("output_gate"):
        into_o = {o.src for _, origins in interp.events.inputs.get(o_proj, []) for o in origins} if o_proj else set()
        if q not in into_o:
            query_gate = {"query_gate_refusal": f"{query_gate['query_gate']}; but the product does not reach the "
                                                "output projection"}
    gate = query_gate if query_gate.get("output_gate") else {
        **_output_gate(interp.events, keys["v"], used | {o_proj}, o_proj, file), **query_gate}
    return Attention(cls.name, file, layout, q, k, v, o_proj, evidence, found, **extra,
                     unscaled_scores=_unscaled_scores(interp.events, keys, file),
                     **_qk_norms(interp.events, {r: keys[r] for r in "qkv"}, file),
                     **_qkv_clamp(interp, {r: keys[r][0] for r in "qkv"}, file),
                     **gate,
                     **_rotary_guard(interp.events, {r: keys[r] for r in "qkv"}, interp.attr_values, interp.init,
                                     _parameters(interp.methods.get("forward")), file))


def _unscaled_scores(events: Events, keys: dict, file: str) -> str:
    """Where the scores are q @ k^T as forward computes them, nothing scaling q, k or the scores (a product or
    quotient with anything not derived from the projections, a call's alpha= or scale=) and no call that the
    interpreter did not run taking q, k and v (an attention function with a scale of its own); else ""."""
    q, k, v = keys["q"], keys["k"], keys["v"]
    scores = [line for line, left, right in events.matmuls
              if {o.key for o in left} == {q} and {o.key for o in right} == {k}]
    opaque = [line for line, args in events.calls if line not in events.inlined
              and events.callees.get(line, "").rsplit(".", 1)[-1] not in MATMULS
              and {q, k, v} <= {o.key for a in args for o in a}]
    scaled = [line for line, origins in events.scalings
              if {o.key for o in origins} & {q, k} and v not in {o.key for o in origins}]
    if not scores or opaque or scaled:
        return ""
    return _where(file, scores[0], "scores = q @ k^T, neither q, k nor the scores multiplied or divided before "
                                   "the softmax")


def _query_gate(events: Events, keys: dict, file: str) -> dict:
    """The queries are the first half of a projection viewed per head as 2 x head_dim (keys["q"] is (src, piece,
    "halves")): the other half, activated, must multiply the attention output (a value derived from v), as
    Qwen3-Next's `attn_output * torch.sigmoid(gate)` does; else the reason this is not that form."""
    src, piece, _ = keys["q"]
    cut = next(((at, how) for at, s, read, how in events.pair_cuts if s == src and read), (0, ""))
    view_line, view, unit = events.pair_views.get(src, (cut[0], "", ""))
    read = f"{src}'s output viewed per head as [2 x {unit}] ({view}, line {view_line}) and cut in two at " \
           f"line {cut[0]} ({cut[1]})"
    heads = {events.head_views.get(keys[r][0]) for r in "kv"} - {None}
    if heads != {unit}:
        return {"query_gate_refusal": _where(file, cut[0], f"{read}; the keys and values are viewed per head as "
                                                           f"{' / '.join(sorted(heads)) or 'nothing this reads'}, "
                                                           f"not {unit}: the halves may not be heads")}
    if piece != 0:
        return {"query_gate_refusal": _where(file, cut[0], f"{read}, the queries its half {piece}: the port reads "
                                                           "the queries first and the gate second in each head")}
    other = (src, 1 - piece, "halves")
    for line, left, right in events.products:
        for out, gate in ((left, right), (right, left)):
            if keys["v"] in {o.key for o in out} and {o.key for o in gate} == {other} and all(o.act for o in gate):
                applied = [(at, name) for at, name, origins in events.activations
                           if {o.key for o in origins} == {other}]
                names = {name for _, name in applied}
                return {"output_gate": src, "output_gate_evidence": f"{file}:{line}",
                        "output_gate_act": next(iter(names)) if len(names) == 1 else None,
                        "output_gate_act_line": min((at for at, _ in applied), default=line),
                        "query_gate": _where(file, cut[0], f"{read}: the first half the queries, the second an "
                                                           f"activated gate on the attention output (line {line})")}
    return {"query_gate_refusal": _where(file, cut[0], f"{read}, the queries its first half; no activation of the "
                                                       "second half multiplies the attention output")}


def _output_gate(events: Events, v: tuple, used: set, o_proj: str | None, file: str) -> dict:
    """The projection, other than q, k, v and o, whose activated output multiplies a value computed from the
    values (the attention output) on its way into the output projection: a gated attention (AfMoE's
    `output * torch.sigmoid(self.gate_proj(x))`, Laguna's per-head softplus gate). With the activation as the
    code names it (Events.activations; None where it names none this reads) and the line where it is applied."""
    into_o = {o.src for _, origins in events.inputs.get(o_proj, []) for o in origins} if o_proj else set()
    for line, left, right in events.products:
        for out, gate in ((left, right), (right, left)):
            srcs = {o.src for o in gate}
            if (v in {o.key for o in out} and len(srcs) == 1 and all(o.act for o in gate)
                    and not srcs & used and srcs <= into_o):
                (src,) = srcs
                applied = [(at, name) for at, name, origins in events.activations if {o.src for o in origins} == srcs]
                names = {name for _, name in applied}
                act = next(iter(names)) if len(names) == 1 else None
                return {"output_gate": src, "output_gate_evidence": f"{file}:{line}", "output_gate_act": act,
                        "output_gate_act_line": min((at for at, _ in applied), default=line)}
    return {}


def _rotary_guard(events: Events, keys: dict, attr_values: dict, init: ast.FunctionDef | None, inputs: set,
                  file: str) -> dict:
    """The branch condition around the first call taking the queries and keys together but not the values (the
    rotary embedding, apply_rotary_pos_emb(q, k, cos, sin)) that the config alone does not decide (AfMoE's
    `if self.is_local_attention:`): its expression as the code writes it, an attribute of the module replaced by
    what __init__ assigns it, and whether the rotation runs where it holds (True) or where it does not."""
    together = sorted(line for line, args in events.calls
                      if {keys["q"], keys["k"]} <= {o.key for a in args for o in a}
                      and keys["v"] not in {o.key for a in args for o in a}
                      and ROTARY_CALL.search(events.callees.get(line, "")))
    if not together or together[0] not in events.guards:
        return {}
    guards = events.guards[together[0]]
    if len(guards) != 1:
        return {"rotary_guard": "", "rotary_guard_evidence": f"{file}:{together[0]}: under {len(guards)} nested "
                                                             "conditions"}
    test, polarity = guards[0]
    if {n.id for n in ast.walk(test) if isinstance(n, ast.Name)} & inputs:
        return {}  # a check of forward's own arguments (Granite-SWA's `position_embeddings is not None`)

    local = _init_locals(init)

    class Kept(ast.NodeTransformer):
        def visit_Attribute(self, node):  # self.X -> what __init__ assigns it (not self.config)
            if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in attr_values \
                    and node.attr != "config":
                return self.visit(copy.deepcopy(attr_values[node.attr]))
            return self.generic_visit(node)

        def visit_Name(self, node):  # a local of __init__ (EXAONE-4's layer_type) -> what it is assigned
            if node.id in local:
                return self.visit(copy.deepcopy(local.pop(node.id)))
            return node

    resolved = ast.unparse(Kept().visit(copy.deepcopy(test)))
    return {"rotary_guard": resolved, "rotary_guard_when": polarity,
            "rotary_guard_evidence": f"{file}:{test.lineno}: the rotary embedding (line {together[0]}) runs only "
                                     f"{'where' if polarity else 'where not'} {ast.unparse(test)}"}


def _parameters(func: ast.FunctionDef | None) -> set[str]:
    if func is None:
        return set()
    args = func.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]} - {"self"}


MISSING = object()  # a config key config.json does not hold


def config_path(node: ast.expr | None, interp: Interpreter, env: dict | None = None, depth: int = 0) -> str | None:
    """The config value an expression of the class reads, as a dotted path from the config (`config.clip_qkv`,
    `config.attn_config.clip_qkv` where the code reads a sub-config: `attn_config = config.attn_config` in __init__,
    then `self.clip_qkv = attn_config.clip_qkv`); None where it reads anything else."""
    if node is None or depth > 6:
        return None
    if isinstance(node, ast.Name):
        if node.id == "config":
            return "config"
        if env is not None and (assigned := env.get("__expr__", {}).get(node.id)) is not None:
            return config_path(assigned, interp, env, depth + 1)
        assigned = _init_locals(interp.init).get(node.id)
        return config_path(assigned, interp, None, depth + 1) if assigned is not None else None
    if isinstance(node, ast.Attribute):
        if _dotted(node.value) == "self":
            if node.attr == "config":
                return "config"
            return config_path(interp.attr_values.get(node.attr), interp, None, depth + 1)
        base = config_path(node.value, interp, env, depth + 1)
        return f"{base}.{node.attr}" if base is not None else None
    return None


def config_value(path: str, config: dict):
    """The value config.json holds at a dotted path (`config.attn_config.clip_qkv`), MISSING where it holds none."""
    value: object = config
    for part in path.split(".")[1:]:
        if not isinstance(value, dict) or part not in value:
            return MISSING
        value = value[part]
    return value


def _clamp_bounds(node: ast.Call) -> dict:
    """{"min": expr, "max": expr} of x.clamp(a, b), torch.clamp(x, a, b), clamp(min=, max=); clamp_max / clamp_min
    take one."""
    method = isinstance(node.func, ast.Attribute) and _dotted(node.func.value) not in (
        "torch", "F", "nn.functional", "torch.nn.functional")
    positional = node.args[0 if method else 1:]
    short = _dotted(node.func).rsplit(".", 1)[-1] if _dotted(node.func) else getattr(node.func, "attr", "")
    bounds = {"min": positional[0] if positional else None, "max": positional[1] if len(positional) > 1 else None}
    if short.startswith(("clamp_min", "clamp_max")):
        bounds = {short[6:9]: positional[0] if positional else None}
    bounds.update({k.arg: k.value for k in node.keywords if k.arg in ("min", "max")})
    return bounds


def _negated_path(node: ast.expr | None, interp: Interpreter, env: dict) -> str | None:
    """The config path a lower bound negates: `-self.config.clip_qkv`, or a local holding `-X if X is not None else
    None` (DBRX's min_val: where X is None, no bound at all, as the upper one)."""
    if isinstance(node, ast.Name) and node.id in env.get("__expr__", {}):
        node = env["__expr__"][node.id]
    if isinstance(node, ast.IfExp) and isinstance(node.orelse, ast.Constant) and node.orelse.value is None:
        node = node.body
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return config_path(node.operand, interp, env)
    return None


def _qkv_clamp(interp: Interpreter, srcs: dict, file: str) -> dict:
    """A clamp of what the q, k or v projections compute, on the branches config.json runs (DBRX's `qkv_states.clamp
    (min=min_val, max=self.clip_qkv)` on the fused output, OLMo's `query_states.clamp_(...)` under `if
    self.config.clip_qkv is not None:`), with the config value its upper bound reads. A bound config.json sets to
    null clamps nothing: then no field is set. `qkv_clamp_form` says whether the port computes it: every one of q,
    k and v clamped to [-c, c] as its projection gives it (no activation, no norm or rotary call before it), one
    config value c for all."""
    clamped = [(line, origins, node, exprs) for line, origins, node, exprs in interp.events.clamps
               if {o.src for o in origins} & set(srcs.values())]

    def reads_config(node: ast.Call, exprs: dict) -> bool:
        bounds = _clamp_bounds(node)
        return any(config_path(b, interp, {"__expr__": exprs}) is not None
                   or _negated_path(b, interp, {"__expr__": exprs}) is not None
                   for b in (bounds.get("max"), bounds.get("min")) if b is not None)

    # Only a clamp whose bounds the config sets is a clip_qkv: Qwen v1's KV-cache quantization clamps q, k and v
    # to bounds computed from the data (quantize_cache_v, under `if self.use_cache_quantization:`).
    clamped = [c for c in clamped if reads_config(c[2], c[3])]
    if not clamped:
        return {}
    line, _, node, exprs = clamped[0]
    roles = "".join(r for r in "qkv" if any(srcs[r] in {o.src for o in c} for _, c, _, _ in clamped))
    bounds = _clamp_bounds(node)
    upper = bounds.get("max") if bounds.get("max") is not None else bounds.get("min")
    path = config_path(upper, interp, {"__expr__": exprs})
    value = config_value(path, interp.config) if path is not None else MISSING
    if value is None:
        return {}
    problems = []
    if roles != "qkv":
        problems.append(f"only {', '.join(roles)} clamped")
    paths = set()
    for _, c_origins, c_node, c_exprs in clamped:
        b = _clamp_bounds(c_node)
        up = config_path(b.get("max"), interp, {"__expr__": c_exprs})
        low = _negated_path(b.get("min"), interp, {"__expr__": c_exprs})
        if up is None or low != up:
            problems.append(f"bounds not -c and c of one config value ({ast.unparse(c_node)[:80]})")
        paths.add(up)
        if any(o.act or o.stage not in ("flat",) and o.piece is None for o in c_origins):
            problems.append(f"a value already reshaped or activated is clamped ({ast.unparse(c_node)[:80]})")
    if len(paths) > 1:
        problems.append(f"bounds from several config values ({', '.join(sorted(map(str, paths)))})")
    first = min(c[0] for c in clamped)
    before = sorted({at for _, at, _ in interp.events.modules if at < first}
                    | {at for at, args in interp.events.calls if at < first and ROTARY_CALL.search(
                        interp.events.callees.get(at, "") or "")})
    if before:
        problems.append(f"a norm or rotary call comes first (line {before[0]})")
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        problems.append(f"its bound {path or ast.unparse(upper) if upper is not None else '?'} is no number "
                        "config.json holds")
    return {"qkv_clamp": _where(file, line, ast.unparse(node)[:120]), "qkv_clamp_roles": roles,
            "qkv_clamp_bound": path or "",
            "qkv_clamp_value": value if isinstance(value, (int, float)) and not isinstance(value, bool) else None,
            "qkv_clamp_problem": "; ".join(dict.fromkeys(problems))}


def _qk_norms(events: Events, keys: dict, file: str) -> dict:
    """The one module applied to the queries alone and the one applied to the keys alone, if so; after the
    rotary embedding when a call that took q and k together (apply_rotary_pos_emb(q, k, cos, sin)) came first."""
    alone = {r: {(attr, line) for attr, line, origins in events.modules if {o.key for o in origins} == {keys[r]}}
             for r in "qkv"}
    values = {}
    if len({a for a, _ in alone["v"]}) == 1 and keys["v"] not in (keys["q"], keys["k"]):
        v_norm, v_line = min(alone["v"], key=lambda x: x[1])
        values = {"v_norm": v_norm, "v_norm_evidence": _where(file, v_line, f"{v_norm} on the values")}
    if not (len({a for a, _ in alone["q"]}) == 1 and len({a for a, _ in alone["k"]}) == 1):
        return values
    (q_norm, q_line), (k_norm, _) = min(alone["q"], key=lambda x: x[1]), min(alone["k"], key=lambda x: x[1])
    together = [line for line, args in events.calls
                if {keys["q"], keys["k"]} <= {o.key for a in args for o in a}
                and keys["v"] not in {o.key for a in args for o in a}]
    after = None if not together else min(together) < q_line
    where = (f"rotary embedding at line {min(together)}, then" if after else "before the rotary embedding:"
             if together else "")
    flat = all(o.stage == "flat" for attr, line, origins in events.modules if attr == q_norm and line == q_line
               for o in origins)
    return {"q_norm": q_norm, "k_norm": k_norm, "qk_norm_after_rope": after, "qk_norm_per_head": not flat,
            "qk_norm_evidence": _where(file, q_line, f"{where} {q_norm} on the queries, {k_norm} on the keys".strip()),
            **values}


def _qkv_roles(events: Events) -> dict:
    """{role: {origin key: line}} from where q, k and v meet; raises Undecided when nothing or contradictions
    decide them."""
    votes: list[tuple[int, tuple, tuple, tuple]] = []
    for line, args in events.calls:
        derived = [a for a in args if a]
        if len(derived) >= 3 and all(len({o.key for o in a}) == 1 for a in derived[:3]):
            keys = tuple(next(iter(a)).key for a in derived[:3])
            if len(set(keys)) == 3:
                votes.append((line, *keys))
    # Scores then context: matmul(q, k^T) ... matmul(scores, v).
    for i, (line, left, right) in enumerate(events.matmuls):
        lk, rk = {o.key for o in left}, {o.key for o in right}
        if len(lk) == 1 and len(rk) == 1 and lk != rk:
            for _, left2, right2 in events.matmuls[i + 1:]:
                if lk | rk <= {o.key for o in left2} and len({o.key for o in right2}) == 1 \
                        and not {o.key for o in right2} & (lk | rk):
                    votes.append((line, next(iter(lk)), next(iter(rk)), next(iter({o.key for o in right2}))))
                    break
    decided = {(q, k, v) for _, q, k, v in votes}
    mixed = [line for line, args in events.calls
             if len([a for a in args if a]) >= 3 and any(len({o.key for o in a}) > 1 for a in args)]
    if not decided and mixed:
        raise Undecided(f"where q, k and v meet (line {mixed[0]}), each may come from more than one projection "
                        "or cut, depending on a branch the config does not decide")
    if not decided:
        raise Undecided("no call or matmul in forward takes q, k and v from distinct projections")
    if len(decided) > 1:
        raise Undecided(f"forward's attention calls disagree on q, k, v ({sorted(map(str, decided))})")
    q, k, v = next(iter(decided))
    # The line where each was cut out of a fused output (or projected), for the evidence.
    lines = {}
    for _, args in events.calls:
        for a in args:
            for o in a:
                lines.setdefault(o.key, o.line)
    for _, left, right in events.matmuls:
        for o in left | right:
            lines.setdefault(o.key, o.line)
    return {"q": {q: lines[q]}, "k": {k: lines[k]}, "v": {v: lines[v]}}


def analyze_mlp(sources: dict, file: str, cls: ast.ClassDef, config: dict) -> Mlp:
    """Gate, up and down projections of an MLP class; raises Undecided."""
    found = linears(file, cls, set(linear_classes(sources)))
    if not found:
        raise Undecided(f"{cls.name} declares no nn.Linear in __init__")
    interp = Interpreter(sources, file, cls, set(found), config)
    interp.run_method("forward", [frozenset()])
    downs = [a for a, calls in interp.events.inputs.items() if any(o for _, o in calls)]
    if len(downs) != 1:
        raise Undecided(f"{cls.name}.forward: {len(downs)} projections read another's output ({downs})")
    down = downs[0]
    ups = sorted(a for a in found if a != down and a in interp.events.inputs)
    # x * act(x), both factors from one whole projection and one of them activated, is the activation itself
    # written out (a hand-written GELU's 0.5 * x * (1 + tanh(...))), not a gated product.
    products = [(line, left, right) for line, left, right in interp.events.products
                if not (len({o.key for o in left | right}) == 1 and next(iter(left)).piece is None
                        and any(o.act for o in left) != any(o.act for o in right))]
    for line, left, right in products:
        la, ra = {o for o in left if o.act}, {o for o in right if o.act}
        gate_side, up_side = (left, right) if la and not ra else (right, left) if ra and not la else (None, None)
        if gate_side is None:
            continue
        gk, uk = {o.key for o in gate_side}, {o.key for o in up_side}
        if len(gk) != 1 or len(uk) != 1:
            continue
        (gsrc, gpiece, _), (usrc, upiece, _) = next(iter(gk)), next(iter(uk))
        if gsrc == usrc and gpiece is not None and upiece is not None and {gpiece, upiece} == {0, 1}:
            return Mlp(cls.name, file, "gated", gsrc, gsrc, down, True, upiece == 0,
                       _where(file, line, f"{gsrc}'s output cut in two: half {gpiece} activated (the gate) times "
                                          f"half {upiece}"), found)
        if gsrc != usrc and gpiece is None and upiece is None:
            return Mlp(cls.name, file, "gated", gsrc, usrc, down, False, False,
                       _where(file, line, f"act({gsrc}(x)) * {usrc}(x), then {down}"), found)
    if products:
        line = products[0][0]
        raise Undecided(f"{cls.name}.forward multiplies projections at {file}:{line}, but no factor is one "
                        "projection's activated output")
    if len(ups) == 1:
        line = interp.events.inputs[down][0][0]
        return Mlp(cls.name, file, "plain", None, ups[0], down, False, False,
                   _where(file, line, f"{down} reads {ups[0]}'s activated output, no product"), found)
    raise Undecided(f"{cls.name}.forward: no activated projection multiplied by another")


def layer_class(sources: dict, list_attr: str | None = None) -> tuple[str, ast.ClassDef, int] | None:
    """The decoder layer: the class whose instances fill an nn.ModuleList (the one at `list_attr` if given)."""
    hits = []
    for file, tree in _parsed(sources):
        owners = {id(n): c.name for c in subtree(tree) if isinstance(c, ast.ClassDef) for n in subtree(c)}
        for node in subtree(tree):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute) and isinstance(node.value, ast.Call)
                    and _dotted(node.value.func).rsplit(".", 1)[-1] == "ModuleList" and node.value.args):
                continue
            attr = node.targets[0].attr
            if list_attr is not None and attr != list_attr:
                continue
            elt = node.value.args[0]
            if isinstance(elt, (ast.ListComp, ast.GeneratorExp)):
                elt = elt.elt
            if not isinstance(elt, ast.Call):
                continue
            cls = _class(sources, _dotted(elt.func))
            if cls is None:
                builder = _builder_return(tree, node, _dotted(elt.func))
                cls = _class(sources, builder) if builder else None
            if cls is not None:
                hits.append((cls[0], cls[1], node.lineno, owners.get(id(node))))
    if len({h[1].name for h in hits}) > 1:
        # A list built inside another list's element (Grok-1's experts, an nn.ModuleList in the MoE block of each
        # decoder layer) is part of that element, not a stack of its own.
        inside = _built_within(sources, {h[1].name for h in hits})
        hits = [h for h in hits if not any(h[3] in inside[other[1].name] for other in hits if other is not h)]
    if len({h[1].name for h in hits}) > 1:
        # A multimodal file holds several stacks (Llama 4's vision encoder layers beside the text decoder's):
        # the decoder is the stack a causal LM class builds.
        built = _built_by_causal_lm(sources)
        hits = [h for h in hits if h[3] in built]
    if len({h[1].name for h in hits}) != 1:
        return None
    # A norm-attention block nested in the layer (DBRX's norm_attn_norm): the layer with the block inlined, the
    # class every detector reads (scaffold.detect.nested; layer_block names the block).
    inlined = nested.inline_block(sources, hits[0][0], hits[0][1])
    return hits[0][0], inlined.cls if inlined is not None else hits[0][1], hits[0][2]


def layer_block(sources: dict, list_attr: str | None = None) -> nested.Inlined | None:
    """The block nested in the decoder layer that layer_class inlines (DBRX's norm_attn_norm); None where none."""
    found = layer_class(sources, list_attr)
    if found is None:
        return None
    file, cls, _ = found
    original = next((c for c in subtree(next(t for f, t in _parsed(sources) if f == file))
                     if isinstance(c, ast.ClassDef) and c.name == cls.name), None)
    return nested.inline_block(sources, file, original) if original is not None and original is not cls else None


def _expert_list(sources: dict, cls: ast.ClassDef, config: dict) -> bool:
    """Whether `cls`'s __init__ builds an nn.ModuleList of a class of the code that computes an MLP (experts)."""
    init = _method_of(cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if not (isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "ModuleList" and node.args):
            continue
        elt = node.args[0]
        elt = elt.elt if isinstance(elt, (ast.ListComp, ast.GeneratorExp)) else elt
        if isinstance(elt, ast.Call) and (found := _class(sources, _dotted(elt.func))) is not None \
                and _mlp_or_none(sources, found, config) is not None:
            return True
    return False


def _class_inits(sources: dict) -> dict[str, set[str]]:
    """class name -> the names its __init__ calls."""
    inits = {}
    for _file, tree in _parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            inits[cls.name] = {_dotted(c.func).rsplit(".", 1)[-1] for c in subtree(init) if isinstance(c, ast.Call)
                               } if init is not None else set()
    return inits


def _built_within(sources: dict, roots: set[str]) -> dict[str, set[str]]:
    """root class -> the classes its __init__ builds, directly or through the modules it builds."""
    inits = _class_inits(sources)
    out = {}
    for root in roots:
        seen, frontier = set(), [root]
        while frontier:
            for called in inits.get(frontier.pop(), ()):
                if called in inits and called not in seen:
                    seen.add(called)
                    frontier.append(called)
        out[root] = seen
    return out


def _built_by_causal_lm(sources: dict) -> set[str]:
    """The classes a `*ForCausalLM` class of the source builds in its __init__, directly or through the modules it
    builds (the base model), the causal LM included."""
    heads = {name for name in _class_inits(sources) if name.endswith("ForCausalLM")}
    return heads.union(*_built_within(sources, heads).values())


def _builder_return(tree: ast.Module, at: ast.AST, name: str) -> str | None:
    """`def build_layer(i): return GLMBlock(...)` next to the ModuleList: the class it returns."""
    for node in subtree(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            for sub in subtree(node):
                if isinstance(sub, ast.Return) and isinstance(sub.value, ast.Call):
                    return _dotted(sub.value.func)
    return None


def attention_layer_branches(sources: dict, config: dict, list_attr: str | None = None) -> str | None:
    """Where the forward of a module the decoder layer builds (its attention) branches on a test config.json decides
    differently from layer to layer, over what __init__ computed from the layer's index (Gemma 4's
    `if self.is_kv_shared_layer:`, its `self.v_proj is not None` under attention_k_eq_v): FILE:LINE and the test,
    with the layers where it holds; None where every layer takes the same branches. The port builds every layer's
    attention alike."""
    found = layer_class(sources, list_attr)
    if found is None:
        return None
    _file, cls, _ = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    for attr, value in _init_assignments(init).items():
        sub = _submodule_class(sources, conditions.selected(value, config) or value)
        if sub is None or not linears(sub[0], sub[1], set(linear_classes(sources))):
            continue
        producers = set(linears(sub[0], sub[1], set(linear_classes(sources))))

        def run(layer: int | None, sub=sub, producers=producers):
            interp = Interpreter(sources, sub[0], sub[1], producers, config)
            interp.layer = layer
            try:
                interp.run_method("forward", [frozenset(), frozenset(), frozenset()])
                roles = _qkv_roles(interp.events)
                return interp, tuple(tuple(sorted(map(repr, roles[r]))) for r in "qkv")
            except Undecided:
                return interp, None

        whole, _ = run(None)
        if not whole.layer_branches:
            continue
        # Branches taken differently per layer change the computation where q, k, v come from elsewhere.
        per_layer = {i: run(i)[1] for i in range(config["num_hidden_layers"])}
        if len(set(per_layer.values())) > 1:
            line, (test, on) = min(whole.layer_branches.items())
            return _where(sub[0], line, f"{sub[1].name}.forward branches on `{test}`, which holds in layer(s) "
                                        f"{', '.join(map(str, on))} only, and q, k, v come from other sources there "
                                        f"({attr})")
    return None


def attention_class(sources: dict, config: dict,
                    layers_attr: str | None = None) -> tuple[Layer, str, ast.ClassDef] | None:
    """(the layer's flow, FILE, the attention's class) where the decoder layer's code shows an attention module whose
    class the sources define: the layer found under `layers_attr` first, then any; None otherwise."""
    flow = analyze_layer(sources, config, layers_attr) or (
        analyze_layer(sources, config) if layers_attr is not None else None)
    if flow is None or flow.attention_flow is None:
        return None
    found = _class(sources, flow.attention_flow.cls)
    return None if found is None else (flow, *found)


def analyze_layer(sources: dict, config: dict, list_attr: str | None = None, skip: frozenset = frozenset()) -> Layer | None:
    """Roles inside the decoder layer, as its code computes them; None when the source has no decoder layer
    class this can find. `skip`: modules of the layer read elsewhere, neither sublayers nor norms (AltUp's module and
    low-rank branch, scaffold.detect.altup)."""
    found = layer_class(sources, list_attr)
    if found is None:
        return None
    file, cls, _ = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    # Every module the layer builds; which is a norm, the forward says (and the tensors confirm).
    # `A(...) if config.x else B(...)`: the branch config.json selects; modules the config switches off go.
    off = _switched_off(init, config) | set(skip)
    chosen = {a: conditions.selected(v, config) for a, v in _init_assignments(init).items()}
    # A module built as nn.Identity() on some layers only (ModernBERT-decoder's `self.attn_norm = nn.LayerNorm(...)
    # if layer_idx != 0 else nn.Identity()`): the module the other layers build (identitynorm.py reads which).
    for a, v in _init_assignments(init).items():
        if chosen[a] is None and isinstance(v, ast.IfExp) and _identity_call(v.body) != _identity_call(v.orelse):
            chosen[a] = v.orelse if _identity_call(v.body) else v.body
        elif _identity_call(chosen[a]):
            built = [o for o in _other_assignments(init, config).get(a, ()) if not _identity_call(o)]
            chosen[a] = built[0] if len(built) == 1 else chosen[a]
    subs = {a: v for a, v in chosen.items() if isinstance(v, ast.Call) and a not in off
            and not any(w in _dotted(v.func).rsplit(".", 1)[-1] for w in ("Dropout", "Identity"))}
    undecided = []
    attention_like = set()  # attention classes whose q, k, v the code did not decide: not MLPs either
    expert_blocks = []  # modules holding a list of MLPs (experts), where no MLP class decides
    attention = mlp = None
    attn_attr = mlp_attr = None
    inner = None  # (attribute, evidence) of the attention inside a wrapper
    for attr, value in subs.items():
        sub = _submodule_class(sources, value)
        if sub is None:
            continue
        try:
            flow = analyze_attention(sources, sub[0], sub[1], config)
        except Undecided as e:
            flow = None
            if (wrapped := _wrapped_attention(sources, sub[0], sub[1], config)) is not None:
                if attention is not None:
                    return _undecided_layer(file, cls, undecided + [f"two attention modules: {attn_attr}, {attr}"])
                inner, attention, attn_attr = wrapped[:2], wrapped[2], attr
                continue
            if _expert_list(sources, sub[1], config):
                # A block holding a list of MLPs (Grok-1's MoeBlock: its router's softmax is no attention's).
                expert_blocks.append(attr)
                continue
            if any(isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] in MATMULS + ("softmax",)
                   for n in subtree(sub[1])) or "attn" in sub[1].name.lower() or "attention" in sub[1].name.lower():
                undecided.append(f"{attr} ({sub[1].name}): {e}")
                attention_like.add(attr)
        if flow is not None:
            if attention is not None:
                return _undecided_layer(file, cls, undecided + [f"two attention modules: {attn_attr}, {attr}"])
            attention, attn_attr = flow, attr
    others = _other_assignments(init, config)
    for attr, value in subs.items():
        sub = _submodule_class(sources, value)
        if sub is None and attr != attn_attr and (seq := analyze_sequential_mlp(sources, value, file)) is not None:
            if mlp is not None:
                return _undecided_layer(file, cls, undecided + [f"two MLP modules: {mlp_attr}, {attr}"])
            mlp, mlp_attr = seq, attr
            continue
        if sub is None or attr == attn_attr or attr in attention_like:
            continue
        try:
            flow = analyze_mlp(sources, sub[0], sub[1], config)
        except Undecided as e:
            # A branch the config does not decide may build the same sublayer from another class (AfMoE's
            # `if self.moe_enabled: self.mlp = ...SparseMoeBlock(config) else: self.mlp = AfmoeMLP(config)`): the
            # MLP class of the other branch says the attribute is the MLP sublayer all the same.
            flow = next((f for other in others.get(attr, ()) if (c := _submodule_class(sources, other)) is not None
                         and (f := _mlp_or_none(sources, c, config)) is not None), None)
            if flow is None:
                if linears(*sub, set(linear_classes(sources))):
                    undecided.append(f"{attr} ({sub[1].name}): {e}")
                continue
        if mlp is not None:
            return _undecided_layer(file, cls, undecided + [f"two MLP modules: {mlp_attr}, {attr}"])
        mlp, mlp_attr = flow, attr
    on_layer = False
    if attention is not None and mlp is None and mlp_attr is None and len(expert_blocks) == 1:
        mlp_attr = expert_blocks[0]  # the MoE block: the sublayer the norms are read around
    if attention is not None and mlp is None and mlp_attr is None and not undecided:
        # No MLP module: the layer's own linears may be its MLP (OPT's and BioGPT's fc1, fc2).
        try:
            mlp = analyze_mlp(sources, file, cls, config)
        except Undecided as e:
            undecided.append(f"{cls.name} (its own linears as the MLP): {e}")
        on_layer = mlp is not None and mlp.kind == "plain"
        if not on_layer:
            mlp = None
    if attention is not None and mlp is None and nested.inline_block(sources, file, cls) is None and any(
            isinstance(c, ast.ClassDef) and c.name == cls.name and c is not cls
            for _, tree in _parsed(sources) for c in tree.body):
        # A layer read with its nested block inlined (DBRX's), whose norms no conventional name gives: the one
        # other module of the layer built from a class of the code holding modules of its own (DbrxFFN's router
        # and experts, where no MLP class of the code decides) is the MLP sublayer the norms are read around.
        blocks_ = [a for a, v in subs.items() if a != attn_attr and (c := _submodule_class(sources, v)) is not None
                   and any(isinstance(x, ast.Call) and not _dotted(x.func).endswith(("Parameter", "Dropout"))
                           for x in _init_assignments(_method_of(c[1], "__init__")).values())]
        if len(blocks_) == 1:
            mlp_attr = blocks_[0]
    # The modules the MLP reads from and writes to: its own on the layer, else the MLP module.
    mlp_in, mlp_out = (mlp.up, mlp.down) if on_layer else (mlp_attr, mlp_attr)
    # The norms around the attention need only know which module it is, not its q, k and v (Falcon's fused
    # query_key_value, split by views the interpreter does not follow).
    attending = attn_attr or (next(iter(attention_like)) if len(attention_like) == 1 else None)
    sublayers = {attending, mlp_in, mlp_out}
    norms, evidence, parallel = {}, {}, None
    if attending and mlp_in:
        interp = Interpreter(sources, file, cls, set(subs), config)
        out = interp.run_method("forward", [frozenset({Origin("<input>")})])
        inputs = interp.events.inputs
        for role, sublayer in (("attn_norm", attending), ("mlp_norm", mlp_in)):
            srcs = {o.src for _, o in inputs.get(sublayer, []) for o in o}
            if len(srcs) == 1 and next(iter(srcs)) in subs and next(iter(srcs)) not in sublayers:
                norms[role] = next(iter(srcs))
                evidence[role] = _where(file, inputs[sublayer][0][0], f"{sublayer} reads {norms[role]}'s output")
        for role, sublayer in (("attn_post_norm", attending), ("mlp_post_norm", mlp_out)):
            for attr, calls in inputs.items():
                if attr not in sublayers and calls and all({o.src for o in c} == {sublayer} for _, c in calls):
                    norms[role] = attr
                    evidence[role] = _where(file, calls[0][0], f"{attr} reads {sublayer}'s output")
        if "mlp_norm" in norms and norms.get("attn_norm") != norms["mlp_norm"]:
            read = {o.src for _, c in inputs.get(norms["mlp_norm"], []) for o in c}
            parallel = (False if attending in read or norms.get("attn_post_norm") in read
                        else True if read == {"<input>"} else None)
        found = _residual_norms(interp, out, file, subs, attending, mlp_in, mlp_out, norms)
        if found is not None:
            norms, evidence, residual = found
            return Layer(cls.name, file, attn_attr, mlp_attr, norms, evidence, attention, mlp, tuple(undecided),
                         on_layer, None, *(inner or (None, "")), residual_norm=residual)
    return Layer(cls.name, file, attn_attr, mlp_attr, norms, evidence, attention, mlp, tuple(undecided), on_layer,
                 parallel, *(inner or (None, "")))


def _residual_norms(interp: "Interpreter", out, file: str, subs: dict, attending: str, mlp_in: str, mlp_out: str,
                    norms: dict) -> tuple[dict, dict, str] | None:
    """Post-LN, as GPT-1 and BERT compute it: a norm reads exactly the sum of the layer's input and the
    attention's output, the MLP reads that norm's output, a second norm reads exactly the sum of the first norm's
    output and the MLP's output, and the layer returns the second norm's output (beside what the attention
    returns besides its output, its weights). Nothing scales a sublayer's output on the way, no pre-norm reads the
    input. Then ({attn_post_norm, mlp_post_norm}, evidence, FILE:LINE: what was read); None otherwise."""
    events = interp.events
    inputs = events.inputs
    if "attn_norm" in norms or "attn_post_norm" in norms or "mlp_post_norm" in norms:
        return None
    sublayers = {attending, mlp_in, mlp_out}

    def srcs(origins) -> set:
        return {o.src for o in origins}

    def unshaped(origins) -> set:
        return {replace(o, stage="flat") for o in origins}

    def norm_of_sum(residual: set, sublayer: str) -> tuple[str, int] | None:
        hits = []
        for attr, calls in inputs.items():
            if attr in sublayers or attr not in subs or len(calls) != 1:
                continue
            line, origins = calls[0]
            if srcs(origins) != residual | {sublayer}:
                continue
            # The norm's input is a sum of the residual and the sublayer's output, nothing else.
            # A reshape between the sum and the norm (OPT flattens the tokens around its MLP and views the sum back
            # to the input's shape) leaves it the sum: origins compare without the shape they were given.
            if any(unshaped(result) == unshaped(origins) and {frozenset(srcs(left)), frozenset(srcs(right))}
                   == {frozenset(residual), frozenset({sublayer})} for _, left, right, result in events.sums):
                hits.append((attr, line))
        return hits[0] if len(hits) == 1 else None

    first = norm_of_sum({"<input>"}, attending)
    if first is None:
        return None
    attn_calls = inputs.get(attending, [])
    mlp_calls = inputs.get(mlp_in, [])
    if len(attn_calls) != 1 or srcs(attn_calls[0][1]) != {"<input>"}:
        return None
    if len(mlp_calls) != 1 or srcs(mlp_calls[0][1]) != {first[0]}:
        return None
    second = norm_of_sum({first[0]}, mlp_out)
    if second is None or second[0] == first[0]:
        return None
    if srcs(_flat(out)) - {attending} != {second[0]}:
        return None
    if any(srcs(origins) & {attending, mlp_out} for _, origins in events.scalings):
        return None
    norms = {"attn_post_norm": first[0], "mlp_post_norm": second[0]}
    evidence = {"attn_post_norm": _where(file, first[1], f"{first[0]} reads the layer's input plus {attending}'s "
                                                          "output"),
                "mlp_post_norm": _where(file, second[1], f"{second[0]} reads {first[0]}'s output plus {mlp_out}'s "
                                                           "output")}
    return norms, evidence, _where(file, first[1], f"post-LN: {first[0]}(x + {attending}(x)), then {second[0]}("
                                                   f"n + {mlp_out}(n)) (line {second[1]}), whose output the layer "
                                                   "returns")


def _wrapped_attention(sources: dict, file: str, cls: ast.ClassDef, config: dict) -> tuple[str, str, Attention] | None:
    """(attribute, evidence, its attention) where `cls` holds no projection of its own but builds exactly one
    module (dropouts aside), an attention analyze_attention reads, and its forward hands the layer's input to
    that module and returns what it gives, nothing else added (GPT-Neo's GPTNeoAttention: `self.attention =
    GPT_NEO_ATTENTION_CLASSES[...](...)`, `return self.attention(hidden_states, ...)`; not DBRX's
    NormAttentionNorm, whose norms and residual sit around its attention). One level only; None otherwise."""
    if linears(file, cls, set(linear_classes(sources))):
        return None
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    modules = {}
    for attr, value in _init_assignments(init).items():
        value = conditions.selected(value, config)
        if isinstance(value, ast.Call) and not any(w in _dotted(value.func).rsplit(".", 1)[-1]
                                                   for w in ("Dropout", "Identity")):
            modules[attr] = _submodule_class(sources, value)
    if len(modules) != 1 or None in modules.values():
        return None
    (attr, (inner_file, inner_cls)), = modules.items()
    if inner_cls is cls:
        return None
    try:
        flow = analyze_attention(sources, inner_file, inner_cls, config)
    except Undecided:
        return None
    interp = Interpreter(sources, file, cls, {attr}, config)
    out = _flat(interp.run_method("forward", [frozenset({Origin("<input>")})]))
    calls = interp.events.inputs.get(attr, [])
    if not any(Origin("<input>") in origins for _, origins in calls) or {o.src for o in out} != {attr}:
        return None
    return attr, _where(file, calls[0][0], f"{cls.name} hands its input to self.{attr} ({inner_cls.name})"), flow


def _method_of(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _undecided_layer(file: str, cls: ast.ClassDef, why: list) -> Layer:
    return Layer(cls.name, file, None, None, {}, {}, None, None, tuple(why))
