"""How a mixture-of-experts block turns router logits into routing weights, read from the code.

The port routes with vLLM's FusedMoE: softmax or sigmoid scores over the router logits, the top k, optionally
renormalized (Qwen-MoE, Mixtral; top-k then softmax is the same computation) and scaled; in the DeepSeek-V3 form
(GLM-4-MoE, dots1) also a correction bias added to the scores for choosing only, and a group-limited top-k. A
lab's block can route otherwise: PhiMoE's `sparsemixer` (masked softmaxes, no top-k). Served through FusedMoE
those ports would be silently wrong, so a routing path that does not take a top-k of softmax or sigmoid scores is
refused, naming the code that computes it, unless `routingmath` finds it computes vLLM's sparsemixer.

Which config keys the path reads for the DeepSeek-V3 parts is read from the code too: the router's __init__
keeps `self.A = config.KEY`, and the forward uses `self.A` as a top-k's k (the group top-k), as the divisor
of a floor division (the expert groups: `num_experts // self.num_group`), as a factor (the routed scaling), as
an `if` test around a division (the renormalization), or reads an attribute the checkpoint holds a tensor for (the correction bias).

The routing path is the forward of the block that owns the experts and the router, the forward of the router's
own class, and the module-level functions they call (followed a few calls deep), all read with `ast`.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass, field

from scaffold.detect import conditions
from scaffold.detect.codekeys import _is_config
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

MAX_DEPTH = 3


@dataclass(frozen=True)
class Routing:
    block: str  # the class that owns the experts and the router
    where: str  # file:line of that class
    calls: frozenset[str]  # last components of every call on the routing path
    helpers: tuple[str, ...]  # module-level functions of the source the path calls, as "name (file:line)"
    # Set by the router's own class where it has one (a sigmoid there is the router's, not a shared-expert gate's).
    router_calls: frozenset[str] = frozenset()
    attributes: frozenset[str] = frozenset()  # every `X.attr` read on the path
    config_attrs: tuple[tuple[str, str], ...] = ()  # (attr, KEY) for `self.attr = config.KEY` in the path's classes
    topk_attrs: frozenset[str] = frozenset()  # `self.A` given as a top-k's k
    divisor_attrs: frozenset[str] = frozenset()  # `self.G` in `... // self.G`
    factor_attrs: frozenset[str] = frozenset()  # `self.S` in `... * self.S` or `*= self.S`
    test_attrs: frozenset[str] = frozenset()  # `self.R` in `if self.R:` guarding a division
    # (S, R, op, constant, line, calls) for a factor `self.S` used only under `if self.R <op> constant:` (Laguna's
    # router soft-capping under `if self.router_logit_softcapping > 0.0:`): config.json decides whether that branch
    # runs; `calls`: the functions the branch calls (tanh there), empty where it only multiplies by the factor.
    guarded_factors: tuple[tuple[str, str, str, object, int, tuple[str, ...]], ...] = ()
    # file:line and code where the block multiplies the experts' input (not their output) by the routing weights
    weighted_input: str | None = None
    divides: bool = False  # some division on the path (a renormalization of the top-k weights, among others)
    # "line N: code" where the path divides by a norm (DBRX's torch.norm(p=...)), not by a sum
    norm_division: str | None = None
    # That norm's order as `p=self.A` (DBRX's moe_normalize_expert_weights), and the `if self.B is not None:` guard
    # around the division (B; "" where it is not guarded so)
    norm_p_attr: str | None = None
    norm_guard: str = ""
    # Whether that norm is of the top-k's values and divides them (DBRX's `router_top_value / torch.norm(
    # router_top_value, ...)`), not of every score before the top-k
    norm_of_topk: bool = False
    # A softmax over what the top-k chose (Mixtral's top-k then softmax: the weights sum to one, as renormalized)
    softmax_after_topk: bool = False
    # A top-k of softmax or sigmoid scores (Jamba's softmax then top-k)
    scores_then_topk: bool = False
    # Divisors `self.G` whose every use sits under `if self.G is not None:`, directly or in a method of the class
    # called only there (A.X-K2's `if self.num_group is not None: ... self.apply_group_scoring(...)`): where the
    # config's G is None the path takes no groups.
    none_skipped_attrs: frozenset[str] = frozenset()

    @property
    def scoring(self) -> str | None:
        """The function that scores the experts, "softmax" or "sigmoid"; None when the path calls neither."""
        for calls in (self.router_calls, self.calls):
            if "softmax" in calls:
                return "softmax"
            if "sigmoid" in calls:
                return "sigmoid"
        return None

    @property
    def standard(self) -> bool:
        return "topk" in self.calls and self.scoring is not None

    def config_keys(self, attrs: frozenset[str]) -> list[str]:
        """The config keys the path's classes copy into these attributes, in order."""
        return sorted({key for attr, key in self.config_attrs if attr in attrs})

    def problem(self, top_k: int | None = None) -> str | None:
        """Why FusedMoE's softmax top-k routing would not compute this block's, or None. Weights on the experts'
        input (Llama 4's) are FusedMoE's apply_router_weight_on_input, which vLLM computes for one expert per
        token (`top_k`) only."""
        if self.weighted_input and top_k != 1:
            return (f"routing weights applied to the experts' input: {self.block} ({self.weighted_input}) multiplies "
                    f"what its experts take by the router's scores with {top_k} experts per token, where vLLM's "
                    "FusedMoE applies the weights to the input (apply_router_weight_on_input) for one expert per "
                    "token only")
        if self.norm_division and not self.norm_p_attr:
            return (f"routing weights divided by a norm: {self.block} ({self.where}) divides them by a norm of "
                    f"theirs ({self.norm_division}), where the port's FusedMoE renormalizes them by their sum")
        if self.norm_division and not self.norm_of_topk:
            return (f"routing weights divided by a norm: {self.block} ({self.where}) divides by a norm "
                    f"({self.norm_division}) something other than the top-k's values by their own norm, where the "
                    "port divides the top-k weights by their p-norm")
        if self.standard:
            return None
        via = f" in {', '.join(self.helpers)}" if self.helpers else ""
        if "topk" not in self.calls:
            return (f"{self.block} ({self.where}) computes its routing weights{via} without a top-k of the router "
                    "scores, a routing the port's FusedMoE (softmax or sigmoid, top-k) does not compute")
        return (f"{self.block} ({self.where}) scores the experts{via} with neither a softmax nor a sigmoid, "
                "a routing the port's FusedMoE (softmax or sigmoid, top-k) does not compute")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _assigned_classes(init: ast.FunctionDef | None) -> dict[str, str]:
    """`self.X = Class(...)` of an __init__, as {X: last component of Class}."""
    out: dict[str, str] = {}
    for stmt in subtree(init) if init else ():
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self" and isinstance(stmt.value, ast.Call)):
            out[stmt.targets[0].attr] = _dotted(stmt.value.func).rsplit(".", 1)[-1]
    return out


def _self_attr(node: ast.AST) -> str | None:
    """A for `self.A`, else None."""
    if isinstance(node, ast.Attribute) and _dotted(node.value) == "self":
        return node.attr
    return None


def _config_attrs(cls: ast.ClassDef) -> set[tuple[str, str]]:
    """(A, KEY) for every `self.A = config.KEY` (or `self.config.KEY`) of the class's __init__."""
    out = set()
    init = _method(cls, "__init__")
    # The config as the __init__ names its parameter (config, a lab's cfg).
    param = init.args.args[1].arg if init is not None and len(init.args.args) > 1 else "config"

    def is_config(node: ast.AST) -> bool:
        return _is_config(node) or isinstance(node, ast.Name) and node.id == param

    for stmt in subtree(init or cls):
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and (attr := _self_attr(stmt.targets[0]))
                and isinstance(stmt.value, ast.Attribute)):
            if is_config(stmt.value.value):
                out.add((attr, stmt.value.attr))
            elif isinstance(stmt.value.value, ast.Attribute) and is_config(stmt.value.value.value):
                # `self.A = config.K.Y` (DBRX's config.ffn_config.moe_normalize_expert_weights): the key K.Y
                out.add((attr, f"{stmt.value.value.attr}.{stmt.value.attr}"))
    return out


def _topk_k(call: ast.Call) -> ast.AST | None:
    """The k of `torch.topk(x, k)`, `x.topk(k)` or either with k=."""
    given = [kw.value for kw in call.keywords if kw.arg == "k"]
    if given:
        return given[0]
    index = 1 if _dotted(call.func) in ("torch.topk", "topk") else 0
    return call.args[index] if len(call.args) > index else None


@dataclass
class _Uses:
    """What the routing path does with the attributes of `self`."""

    attributes: set[str]
    topk: set[str]
    divisor: set[str]
    factor: set[str]
    test: set[str]
    divides: bool = False
    guarded: dict[str, tuple] = field(default_factory=dict)
    norm_division: str | None = None
    norm_p_attr: str | None = None
    norm_guard: str = ""
    norm_of_topk: bool = False
    softmax_after_topk: bool = False
    scores_then_topk: bool = False
    divisor_guarded: set = field(default_factory=set)  # G of `// self.G` under `if self.G is not None:`
    divisor_sites: dict = field(default_factory=dict)  # G -> functions with an unguarded `// self.G`
    guarded_calls: dict = field(default_factory=dict)  # m -> G of the `if self.G is not None:` around `self.m(...)`
    unguarded_calls: set = field(default_factory=set)  # m of a `self.m(...)` outside such a body

    def read(self, body: ast.AST, topk_methods: tuple[str, ...] = ()) -> None:
        self.softmax_after_topk |= _order(body, ("topk",), ("softmax",))
        # A top-k taken in a method of the router's own class (LongCat-Flash's `self.get_topk_indices(scores)`).
        self.scores_then_topk |= _order(body, ("softmax", "sigmoid"), ("topk", *topk_methods))
        # Locals assigned a norm (`denominator = torch.norm(weights, p=..., dim=-1)`), for the divisions below.
        normed = {t.id: node.value for node in subtree(body) if isinstance(node, ast.Assign)
                  and _calls_norm(node.value) for t in node.targets if isinstance(t, ast.Name)}
        top = _topk_values(body, set(normed))
        # `if self.B is not None:` bodies: node id -> B
        not_none: dict[int, str] = {}
        for node in subtree(body):
            if (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
                    and isinstance(node.test.ops[0], ast.IsNot) and isinstance(node.test.comparators[0], ast.Constant)
                    and node.test.comparators[0].value is None and (attr := _self_attr(node.test.left))):
                not_none.update((id(sub), attr) for stmt in node.body for sub in subtree(stmt))
        guard_of: dict[int, tuple] = {}
        for node in subtree(body):
            guard = _constant_guard(node)
            if guard is not None:
                for stmt in node.body:
                    guard_of.update((id(sub), guard) for sub in subtree(stmt))
        for node in subtree(body):
            if (isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Div)
                    and not _by_a_size(node.right if isinstance(node, ast.BinOp) else node.value)):
                self.divides = True
                divisor = node.right if isinstance(node, ast.BinOp) else node.value
                if self.norm_division is None and (_calls_norm(divisor) or any(
                        isinstance(n, ast.Name) and n.id in normed for n in subtree(divisor))):
                    code = ast.unparse(node)
                    self.norm_division = f"line {node.lineno}: {code if len(code) <= 90 else code[:87] + '...'}"
                    norms = [c for name in NORMS for c in _calls(divisor, name)] or [
                        c for n in subtree(divisor) if isinstance(n, ast.Name) and n.id in normed
                        for name in NORMS for c in _calls(normed[n.id], name)]
                    orders = {_self_attr(_norm_order(c)) for c in norms}
                    # One norm whose order is an attribute of the block's (the config's value, read by moe.py).
                    self.norm_p_attr = orders.pop() if len(norms) == 1 and None not in orders else None
                    self.norm_guard = not_none.get(id(node), "")
                    dividend = node.left if isinstance(node, ast.BinOp) else node.target
                    self.norm_of_topk = (len(norms) == 1 and _of(dividend, top)
                                         and _of(_norm_operand(norms[0]), top))
            if isinstance(node, ast.Attribute):
                self.attributes.add(node.attr)
            if (isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "topk"
                    and (attr := _self_attr(_topk_k(node) or node)) is not None):
                self.topk.add(attr)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv) and (attr := _self_attr(node.right)):
                self.divisor.add(attr)
                if not_none.get(id(node)) == attr:
                    self.divisor_guarded.add(attr)
                else:
                    self.divisor_sites.setdefault(attr, set()).add(getattr(body, "name", ""))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and _dotted(node.func.value) == "self":
                if id(node) in not_none:
                    self.guarded_calls.setdefault(node.func.attr, set()).add(not_none[id(node)])
                else:
                    self.unguarded_calls.add(node.func.attr)
            if isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Mult):
                operands = (node.left, node.right) if isinstance(node, ast.BinOp) else (node.value,)
                found = {a for a in map(_self_attr, operands) if a is not None}
                if id(node) in guard_of:
                    self.guarded.update((a, guard_of[id(node)]) for a in found)
                else:
                    self.factor |= found
            if isinstance(node, ast.If) and (attr := _self_attr(node.test)) is not None and _divides(node.body):
                self.test.add(attr)


NORMS = ("norm", "vector_norm")


def _calls(node: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in subtree(node) if isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == name]


def _topk_values(body: ast.AST, norms: set[str]) -> set[str]:
    """The locals holding a top-k's values, in statement order: the first target of `v, i = torch.topk(...)` (or
    `x.topk(...)`), `v = torch.topk(...).values` or `[0]`, and names assigned from expressions of those alone, or of
    those and the locals `norms` holding a norm (`w = v.float()`, `v = v / denominator`); a name assigned anything
    else is dropped."""
    def is_topk(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "topk"

    values: set[str] = set()
    results: set[str] = set()  # locals holding a top-k's (values, indices) pair: `picked = torch.topk(...)`
    statements = sorted((n for n in subtree(body) if isinstance(n, ast.Assign)), key=lambda n: (n.lineno, n.col_offset))
    for stmt in statements:
        value = stmt.value
        for target in stmt.targets:
            if isinstance(target, ast.Tuple) and is_topk(value) and target.elts and isinstance(target.elts[0], ast.Name):
                values.add(target.elts[0].id)
                values -= {e.id for e in target.elts[1:] if isinstance(e, ast.Name)}
            elif isinstance(target, ast.Name):
                first = ((isinstance(value, ast.Attribute) and value.attr == "values")
                         or (isinstance(value, ast.Subscript) and isinstance(value.slice, ast.Constant)
                             and value.slice.value == 0))
                of_topk = first and (is_topk(value.value) or isinstance(value.value, ast.Name)
                                     and value.value.id in results)
                if is_topk(value):
                    results.add(target.id)
                    values.discard(target.id)
                elif of_topk or _of(value, values, norms):
                    values.add(target.id)
                    results.discard(target.id)
                else:
                    values.discard(target.id)
                    results.discard(target.id)
    return values


def _of(node: ast.AST, names: set[str], also: set[str] = frozenset()) -> bool:
    """Whether the expression reads some of `names` and no other local but `also` (self, torch and the like
    aside)."""
    read = {n.id for n in subtree(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    modules = {"torch", "F", "math", "self", "nn", "functional", "linalg"}
    return bool(read & names) and not (read - names - modules - also)


def _calls_norm(node: ast.AST) -> bool:
    """Whether the expression calls a norm (`torch.norm(x, p=...)`, `x.norm(...)`, `torch.linalg.vector_norm`)."""
    return any(_calls(node, name) for name in NORMS)


def _norm_order(call: ast.Call) -> ast.AST | None:
    """The p of `torch.norm(x, p)`, `torch.norm(x, p=...)`, `x.norm(p)` or `torch.linalg.vector_norm(x, ord=...)`;
    None where the call gives none (its default order, 2)."""
    given = [kw.value for kw in call.keywords if kw.arg in ("p", "ord")]
    if given:
        return given[0]
    on_tensor = isinstance(call.func, ast.Attribute) and _dotted(call.func).rsplit(".", 1)[0] not in (
        "torch", "torch.linalg", "linalg")
    args = call.args if on_tensor else call.args[1:]
    return args[0] if args else None


def _norm_operand(call: ast.Call) -> ast.AST:
    """What `torch.norm(x, ...)`, `torch.linalg.vector_norm(x, ...)` or `x.norm(...)` takes the norm of."""
    on_tensor = isinstance(call.func, ast.Attribute) and _dotted(call.func).rsplit(".", 1)[0] not in (
        "torch", "torch.linalg", "linalg")
    return call.func.value if on_tensor else call.args[0] if call.args else ast.Constant(None)


def _operands(call: ast.Call) -> list[ast.AST]:
    """What `torch.f(x, ...)`, `F.f(x)` or `x.f(...)` is applied to."""
    on_tensor = isinstance(call.func, ast.Attribute) and _dotted(call.func).rsplit(".", 1)[0] not in (
        "torch", "F", "nn.functional", "torch.nn.functional", "self")  # self.method(x): a method of the module
    return [call.func.value] if on_tensor else list(call.args[:1])


def _order(body: ast.AST, first: tuple[str, ...], then: tuple[str, ...]) -> bool:
    """Whether a call of `then` in this body takes what a call of `first` computed, directly or through locals
    assigned from it, in statement order (`top, idx = torch.topk(logits, k)` ... `top.softmax(-1)`)."""
    made: set[str] = set()
    statements = sorted((n for n in subtree(body) if isinstance(n, (ast.Assign, ast.Return, ast.Expr))),
                        key=lambda n: (n.lineno, n.col_offset))

    def derived(node: ast.AST) -> bool:
        return any(_calls(node, f) for f in first) or any(isinstance(n, ast.Name) and n.id in made
                                                             for n in subtree(node))

    for stmt in statements:
        if stmt.value is None:
            continue
        for call in (c for f in then for c in _calls(stmt.value, f)):
            if any(derived(o) for o in _operands(call)):
                return True
        if isinstance(stmt, ast.Assign) and derived(stmt.value):
            made |= {n.id for t in stmt.targets for n in subtree(t) if isinstance(n, ast.Name)}
    return False


COMPARISONS = {ast.Gt: ">", ast.GtE: ">=", ast.Lt: "<", ast.LtE: "<=", ast.Eq: "==", ast.NotEq: "!="}


def _constant_guard(node: ast.AST) -> tuple[str, str, object, int, tuple[str, ...]] | None:
    """(R, op, constant, line, the functions its body calls) of `if self.R <op> <number>:`, else None."""
    if not (isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
            and type(node.test.ops[0]) in COMPARISONS and (attr := _self_attr(node.test.left)) is not None):
        return None
    value = node.test.comparators[0]
    if not (isinstance(value, ast.Constant) and isinstance(value.value, (int, float))
            and not isinstance(value.value, bool)):
        return None
    calls = sorted({_dotted(sub.func).rsplit(".", 1)[-1] for stmt in node.body for sub in subtree(stmt)
                    if isinstance(sub, ast.Call)})
    return attr, COMPARISONS[type(node.test.ops[0])], value.value, node.lineno, tuple(calls)


def holds(value: float, op: str, constant: float) -> bool:
    """`value <op> constant` for one of COMPARISONS' operators."""
    return {">": value > constant, ">=": value >= constant, "<": value < constant, "<=": value <= constant,
            "==": value == constant, "!=": value != constant}[op]


SIZES = frozenset({"shape", "size", "numel"})


def _by_a_size(divisor: ast.AST) -> bool:
    """A divisor made only of tensor sizes and constants (`logits.shape[0]`, `x.size(0) * topk`, len(...)): an
    average over tokens (Hunyuan-Large's capacity statistic `exp_counts_capacity / logits.shape[0]`), never a
    renormalization of the routing weights, which divides by their sum or a norm."""
    sized = False
    for n in subtree(divisor):
        if isinstance(n, ast.Attribute) and n.attr in SIZES or isinstance(n, ast.Call) and _dotted(n.func) == "len":
            sized = True
        elif isinstance(n, ast.Name) and not any(
                isinstance(p, (ast.Attribute, ast.Call)) and (getattr(p, "attr", None) in SIZES or _dotted(
                    getattr(p, "func", ast.Name(id=""))) == "len") and n in subtree(p) for p in subtree(divisor)):
            return False  # a value of its own (a sum, a norm, a scale): not a size
    return sized


def _divides(body: list[ast.stmt]) -> bool:
    """Whether a branch divides (the renormalization `weights /= weights.sum(...)`); a switch that guards
    something else, HY-V3's `if self.enable_moe_fp32_combine:` around the shared expert's sum, is no
    renormalization switch."""
    return any(isinstance(node, (ast.BinOp, ast.AugAssign)) and isinstance(node.op, ast.Div)
               for stmt in body for node in subtree(stmt))


def _weighted_input(forward: ast.FunctionDef, experts: str, file: str) -> str | None:
    """Where the block's forward hands its experts an input multiplied by what a module of its own (the router)
    computed: Llama 4's `routed_in = routed_in * router_scores...; self.experts(routed_in)`. Dataflow over the
    forward's locals: a name is scored when assigned from a call of `self.X(...)` (X other than the experts) or
    from a scored name; weighted when assigned a product with a scored factor, or from a weighted name. An input
    that is only indexed by the selection (Qwen2-MoE's `hidden_states[top_x]`, whose expert outputs are weighted
    after) is not weighted. None when nothing is."""
    def names(node: ast.AST) -> set[str]:
        return {n.id for n in subtree(node) if isinstance(n, ast.Name)}

    def module_call(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and (attr := _self_attr(n.func)) is not None and attr != experts
                   for n in subtree(node))

    def product(node: ast.AST, scored: set[str]) -> ast.AST | None:
        for n in subtree(node):
            if isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ast.Mult):
                operands = (n.left, n.right) if isinstance(n, ast.BinOp) else (n.target, n.value)
                if any(names(o) & scored or module_call(o) for o in operands):
                    return n
        return None

    scored: set[str] = set()
    weighted: dict[str, str] = {}  # name -> file:line: code
    expert_modules: set[str] = set()  # locals bound to one expert (`expert_layer = self.experts[e]`)
    checked: set[int] = set()

    def check(node: ast.AST) -> str | None:
        """The experts' calls inside `node` (before its assignment binds anything): a weighted input?"""
        for call in (n for n in subtree(node) if isinstance(n, ast.Call) and id(n) not in checked):
            checked.add(id(call))
            func = call.func.value if isinstance(call.func, ast.Subscript) else call.func
            if not call.args or not (_self_attr(func) == experts
                                     or (isinstance(func, ast.Name) and func.id in expert_modules)):
                continue
            if (found := product(call.args[0], scored)) is not None:
                return f"{file}:{call.lineno}: {ast.unparse(found)[:70]}"
            hit = sorted(names(call.args[0]) & set(weighted))
            if hit:
                return weighted[hit[0]]
        return None

    for node in sorted((n for n in subtree(forward) if isinstance(n, (ast.Assign, ast.AugAssign, ast.Call))),
                       key=lambda n: (n.lineno, n.col_offset)):
        if (found := check(node)) is not None:
            return found
        if not isinstance(node, (ast.Assign, ast.AugAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        bound = {n.id for t in targets for n in subtree(t) if isinstance(n, ast.Name)}
        value = node.value
        if isinstance(value, ast.Subscript) and _self_attr(value.value) == experts:
            expert_modules |= bound
            continue
        read = names(value) | (bound if isinstance(node, ast.AugAssign) else set())
        if isinstance(node, ast.Assign):  # rebinding a name forgets what it held
            for name in bound:
                weighted.pop(name, None)
        if (found := product(node if isinstance(node, ast.AugAssign) else value, scored)):
            for name in bound:
                weighted[name] = f"{file}:{node.lineno}: {ast.unparse(found)[:70]}"
        elif read & set(weighted):
            source = weighted[min(read & set(weighted))]
            for name in bound:
                weighted[name] = source
        if module_call(value) or read & scored:
            scored |= bound
    return None


def _assigned_skipping(init: ast.FunctionDef | None, skip: frozenset[str]) -> dict[str, str]:
    """_assigned_classes, where a module is built from one of two classes and one is in `skip` (a hash router, which
    scaffold.detect.hashrouting reads): the other, whichever comes last or in whichever branch of a conditional."""
    out = _assigned_classes(init)
    for stmt in subtree(init) if init else ():
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self"):
            continue
        calls = [stmt.value.body, stmt.value.orelse] if isinstance(stmt.value, ast.IfExp) else [stmt.value]
        names = [_dotted(c.func).rsplit(".", 1)[-1] for c in calls if isinstance(c, ast.Call)]
        kept = [n for n in names if n not in skip]
        if kept and len(kept) < len(names) or kept and out.get(stmt.targets[0].attr) in skip:
            out[stmt.targets[0].attr] = kept[0]
    return out


def _not_taken(body: ast.AST, owner: ast.ClassDef | None, config: dict | None) -> set[int]:
    """ids of the nodes in branches of `body` that config.json rules out: `if self.A == 1:` with `self.A =
    config.KEY` in the owner's __init__ (Hunyuan-Large's `if self.moe_topk == 1: top1gating(...) else:
    topkgating(...)`), or a test on config itself. Nothing where no config is given or a test reads anything else."""
    if config is None:
        return set()
    attrs = dict(_config_attrs(owner)) if owner is not None else {}

    class _AsConfig(ast.NodeTransformer):
        def visit_Attribute(self, node):
            if (attr := _self_attr(node)) is not None and attr in attrs:
                return ast.Attribute(value=ast.Name(id="config", ctx=ast.Load()), attr=attrs[attr], ctx=ast.Load())
            return self.generic_visit(node)

    out: set[int] = set()
    for node in subtree(body):
        if isinstance(node, ast.If):
            truth = conditions.evaluate(_AsConfig().visit(copy.deepcopy(node.test)), config)
            if truth is not None:
                out |= {id(n) for branch in (node.orelse if truth else node.body) for n in subtree(branch)}
    return out


def routing(sources: dict[str, str], experts: str, beside: frozenset[str] = frozenset(),
            skip: frozenset[str] = frozenset(), config: dict | None = None) -> Routing | None:
    """The routing path of the class whose __init__ builds `self.<experts>`: its forward and the forwards of the
    other modules it builds from classes of the source (the router, whatever the code calls it: checkpoints saved
    in a legacy layout name it differently), except those in `beside` (the shared expert, whose forward is no
    part of the routing: MiniMax-M3's multiplies by its config's swiglu_alpha) and classes in `skip` (a hash router
    built in some layers instead of the scoring one, read by scaffold.detect.hashrouting). None when the code has no
    such class. With `config`, module-level helper functions called only in branches config.json rules out are not
    followed (_not_taken)."""
    classes = _classes(sources)
    functions = {node.name: (file, node) for file, tree in _parsed(sources) for node in tree.body
                 if isinstance(node, ast.FunctionDef)}
    for name, (file, cls) in classes.items():
        assigned = _assigned_skipping(_method(cls, "__init__"), skip) if skip else \
            _assigned_classes(_method(cls, "__init__"))
        if experts not in assigned:
            continue
        forward = _method(cls, "forward")
        if forward is None:
            return None
        # (function body, the class whose `self.method(...)` calls it may make)
        frontier = [(forward, cls)]
        path_classes = [cls]
        for attr, sub in assigned.items():
            if (attr != experts and attr not in beside and sub in classes and sub != name
                    and _method(classes[sub][1], "forward")):
                frontier.append((_method(classes[sub][1], "forward"), classes[sub][1]))
                path_classes.append(classes[sub][1])
        routers = {id(body) for body, _ in frontier[1:]}  # the sub-modules' forwards and what they call
        calls: set[str] = set()
        router_calls: set[str] = set()
        uses = _Uses(set(), set(), set(), set(), set())
        helpers: list[str] = []
        seen = {id(body) for body, _ in frontier}
        for _ in range(MAX_DEPTH):
            following = []
            for body, owner in frontier:
                uses.read(body, tuple(m.name for m in (owner.body if owner is not None else ())
                                      if isinstance(m, ast.FunctionDef) and m is not body and _calls(m, "topk")))
                ruled_out = _not_taken(body, owner, config)
                for node in subtree(body):
                    if not isinstance(node, ast.Call):
                        continue
                    short = _dotted(node.func).rsplit(".", 1)[-1]
                    calls.add(short)
                    if id(body) in routers:
                        router_calls.add(short)
                    target = None
                    if isinstance(node.func, ast.Name) and short in functions:
                        if id(node) in ruled_out:
                            continue  # a helper function called only in a branch config.json rules out
                        f_file, target = functions[short]
                        helpers.append(f"{short} ({f_file}:{target.lineno})")
                    elif owner is not None and _dotted(node.func) == f"self.{short}":
                        target = _method(owner, short)  # the class's own method (a router's get_topk_indices)
                        built = _assigned_classes(_method(owner, "__init__")).get(short)
                        if target is None and owner is not cls and built in classes and built != owner.name:
                            # A module of the router's own (Ernie 4.5's moe_statics adds the correction bias).
                            target = _method(classes[built][1], "forward")
                            if target is not None and id(target) not in seen:
                                path_classes.append(classes[built][1])
                                seen.add(id(target))
                                routers.add(id(target))
                                following.append((target, classes[built][1]))
                            continue
                    if target is not None and id(target) not in seen:
                        seen.add(id(target))
                        if id(body) in routers:
                            routers.add(id(target))
                        following.append((target, owner if owner is not None and target in owner.body else None))
            frontier = following
        helpers = list(dict.fromkeys(helpers))
        config_attrs = set().union(*(_config_attrs(c) for c in path_classes))
        return Routing(name, f"{file}:{cls.lineno}", frozenset(calls), tuple(helpers), frozenset(router_calls),
                       frozenset(uses.attributes), tuple(sorted(config_attrs)), frozenset(uses.topk),
                       frozenset(uses.divisor), frozenset(uses.factor), frozenset(uses.test),
                       tuple(sorted((attr, *guard) for attr, guard in uses.guarded.items()
                                    if attr not in uses.factor)),
                       _weighted_input(forward, experts, file), uses.divides, uses.norm_division,
                       uses.norm_p_attr, uses.norm_guard, uses.norm_of_topk, uses.softmax_after_topk,
                       uses.scores_then_topk, frozenset(a for a in uses.divisor if _skipped_where_none(uses, a)))
    return None


def _skipped_where_none(uses: _Uses, attr: str) -> bool:
    """Every `// self.<attr>` of the path runs only where self.<attr> is not None: under that test, or in methods
    called only under it."""
    sites = uses.divisor_sites.get(attr, set())
    return (attr in uses.divisor_guarded or bool(sites)) and all(
        site and attr in uses.guarded_calls.get(site, ()) and site not in uses.unguarded_calls for site in sites)
