"""The sublayers of a decoder layer that computes attention more than once, read from its forward (as text, never
run): LongCat-Flash's layer runs two sublayers in sequence, sublayer i calling input_layernorm[i], self_attn[i],
post_attention_layernorm[i] and mlps[i], and a shortcut MoE (`self.mlp`) that reads the first sublayer's normed
states and is added to the layer's output after the last sublayer. A lab may write the same thing otherwise: other
names, a loop over its module lists (`for i in range(2): x = x + self.attns[i](self.norms[i](x))`) or over their zip.

What is read:
- `sublayers` / `looped`: the module lists the forward indexes per sublayer, in call order, and a shortcut module
  called once beside them, in words for `forms.several_attentions`' refusal;
- `read`: the forward evaluated over terms and compared with the form the port runs (`Portable`: pre-norm
  sublayers and a shortcut MoE reading one sublayer's normed states, added to the layer's output), else a sentence
  naming what differs; `view` shows the detectors sublayer 0 as the layer and `check` holds the rest;
- identity experts inside the shortcut (LongCat-Flash's zero experts, `identity_experts_read`): the experts' forward
  hands a token's state on unchanged (an nn.Identity, or the state itself) for expert indices past the routed ones,
  their number read from the config key the experts' __init__ adds to the routed count. vLLM's FusedMoE computes
  those only in a Triton kernel (`zero_expert_type`), which its CPU build does not run (`HAS_TRITON` is False
  there): the port adds them beside FusedMoE (scaffold.detect.moe._zero_experts, spec zero_expert_count);
- the latent attention's LoRA scales (`latent_scales`), folded by the port into the latent norms' weights.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, replace

from scaffold.checkpoint import Checkpoint
from scaffold.detect import formcode
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import _dotted, modeling_sources, subtree
from scaffold.spec import Source, Spec


@dataclass(frozen=True)
class Sublayers:
    count: str  # "2", or "config.K" where the list's length is read from the config
    parts: tuple[str, ...]  # the per-sublayer modules, in the order a sublayer calls them
    shortcut: str | None = None  # what the shortcut reads and where it is added, in words
    shortcut_class: str | None = None

    def describe(self) -> str:
        text = f"{self.count} sublayers in sequence, sublayer i calling {', '.join(p + '[i]' for p in self.parts)}"
        if self.shortcut:
            text += f", and a shortcut: {self.shortcut}"
        return text


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _module_lists(cls: ast.ClassDef) -> dict[str, ast.expr]:
    """self.X = nn.ModuleList(...) in __init__: X -> the expression its elements are built over (the comprehension's
    iterable, or the list literal itself)."""
    init = _method(cls, "__init__")
    out: dict[str, ast.expr] = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)
                and _dotted(node.value.func).rsplit(".", 1)[-1] == "ModuleList" and node.value.args):
            arg = node.value.args[0]
            out[node.targets[0].attr] = arg.generators[0].iter if isinstance(arg, (ast.ListComp, ast.GeneratorExp)) \
                else arg
    return out


def _length(expr: ast.expr) -> str | None:
    """How many modules a list builds: a literal's length, range(N), range(config.K) as "config.K"."""
    if isinstance(expr, (ast.List, ast.Tuple)):
        return str(len(expr.elts))
    if isinstance(expr, ast.Call) and _dotted(expr.func) == "range" and len(expr.args) == 1:
        arg = expr.args[0]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
            return str(arg.value)
        dotted = _dotted(arg)
        if "config." in f"{dotted}." or dotted.startswith("config"):
            return "config." + dotted.rsplit(".", 1)[-1]
    return None


def _module_call(call: ast.Call, modules: set[str]) -> tuple[str, object] | None:
    """self.A[idx](...) -> (A, idx) with idx an int or a name; self.A(...) -> (A, None)."""
    func = call.func
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute) \
            and _dotted(func.value.value) == "self" and func.value.attr in modules:
        index = func.slice
        if isinstance(index, ast.Constant) and isinstance(index.value, int):
            return func.value.attr, index.value
        if isinstance(index, ast.Name):
            return func.value.attr, index.id
        return None
    if isinstance(func, ast.Attribute) and _dotted(func.value) == "self" and func.attr in modules:
        return func.attr, None
    return None


def _flat(body: list[ast.stmt]):
    for stmt in body:
        yield stmt
        for field in ("body", "orelse"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and not isinstance(stmt, (ast.FunctionDef, ast.ClassDef, ast.For)):
                yield from _flat(inner)


def _evaluated(node: ast.AST) -> list[ast.AST]:
    """The nodes of an expression in the order Python evaluates them: a call's arguments before the call."""
    out: list[ast.AST] = []
    for child in ast.iter_child_nodes(node):
        out.extend(_evaluated(child))
    out.append(node)
    return out


def _targets(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        names = []
        for target in stmt.targets:
            first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
            if isinstance(first, ast.Name):
                names.append(first.id)
        return names
    if isinstance(stmt, ast.AugAssign) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    return []


def _unrolled(cls: ast.ClassDef, forward: ast.FunctionDef, attention: set[str], built: dict) -> Sublayers | None:
    lists = _module_lists(cls)
    modules = set(built)
    order: dict[int, list[str]] = {}
    producer: dict[str, str] = {}  # name -> "A[i]" of the module call that last assigned it, or "" for a sum
    singles: list[tuple[str, ast.stmt, str, str | None]] = []  # (attr, stmt, what it reads, target name)
    statements = list(_flat(forward.body))
    for stmt in statements:
        value = getattr(stmt, "value", None)
        calls = [n for n in _evaluated(value) if isinstance(n, ast.Call)] if value is not None else []
        for call in calls:
            found = _module_call(call, modules)
            if found is None:
                continue
            attr, index = found
            if isinstance(index, int) and attr in lists:
                order.setdefault(index, [])
                if attr not in order[index]:
                    order[index].append(attr)
            elif index is None and attr not in attention:
                arg = call.args[0] if call.args else next((k.value for k in call.keywords
                                                           if k.arg in ("hidden_states", "x")), None)
                read = producer.get(arg.id) if isinstance(arg, ast.Name) else None
                targets = _targets(stmt) if call is value else []
                singles.append((attr, stmt, read or "", targets[0] if targets else None))
        for name in _targets(stmt):
            outer = _module_call(value, modules) if isinstance(value, ast.Call) else None
            producer[name] = f"{outer[0]}[{outer[1]}]" if outer and isinstance(outer[1], int) else ""
    indices = sorted(order)
    if len(indices) < 2 or indices != list(range(len(indices))) or not any(set(order[i]) & attention for i in indices):
        return None
    parts = tuple(order[0])
    shortcut, shortcut_class = None, None
    running = {name for stmt in statements for name in _targets(stmt)
               if any(isinstance(n, ast.Call) and (_module_call(n, modules) or (None,))[0] in attention
                      for n in subtree(getattr(stmt, "value", None) or ast.Pass()))}
    for attr, stmt, read, target in singles:
        if target is None or target in running or not read:
            continue
        later = [s for s in statements if s.lineno > stmt.lineno and any(
            isinstance(n, ast.Name) and n.id == target and isinstance(n.ctx, ast.Load) for n in subtree(s))]
        if not later:
            continue
        use = later[0]
        added = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and any(
            isinstance(m, ast.Name) and m.id == target for m in subtree(n)) for n in subtree(use))
        if not added:
            continue
        after = max((i for i in indices for s in statements if s.lineno < use.lineno for n in subtree(s)
                     if isinstance(n, ast.Call) and _module_call(n, modules) is not None
                     and _module_call(n, modules)[1] == i), default=indices[-1])
        shortcut_class = built[attr][0]
        shortcut = (f"self.{attr} ({shortcut_class}) reads {read}'s output (line {stmt.lineno}) and is added to the "
                    f"states after sublayer {after} (line {use.lineno}: {' '.join(ast.unparse(use).split())[:70]})")
        break
    return Sublayers(str(len(indices)), parts, shortcut, shortcut_class)


def looped(cls: ast.ClassDef, forward: ast.FunctionDef, attention: set[str]) -> tuple[ast.For, str, Sublayers] | None:
    """A `for` loop of the forward whose body calls an attention of a module list: self.A[i](...) with i the loop's
    variable, or a name the loop takes from self.A (`for attn, mlp in zip(self.attns, self.mlps)`)."""
    lists = _module_lists(cls)
    for loop in (n for n in subtree(forward) if isinstance(n, ast.For)):
        names = {n.id for n in subtree(loop.target) if isinstance(n, ast.Name)}
        # Names bound to a list's elements: `zip(self.A, self.B)` or `self.A` iterated directly.
        iterated = [loop.iter] if not (isinstance(loop.iter, ast.Call) and _dotted(loop.iter.func) == "zip") \
            else list(loop.iter.args)
        elements = [n.attr for it in iterated for n in [it] if isinstance(n, ast.Attribute)
                    and _dotted(n.value) == "self" and n.attr in lists]
        targets = loop.target.elts if isinstance(loop.target, ast.Tuple) else [loop.target]
        bound = {t.id: a for t, a in zip(targets, elements) if isinstance(t, ast.Name)} if len(elements) == len(
            iterated) else {}
        parts: list[str] = []
        for call in (n for stmt in loop.body for n in _evaluated(stmt) if isinstance(n, ast.Call)):
            found = _module_call(call, set(lists))
            if found is not None and isinstance(found[1], str) and found[1] in names:
                attr = found[0]
            elif isinstance(call.func, ast.Name) and call.func.id in bound:
                attr = bound[call.func.id]
            else:
                continue
            if attr not in parts:
                parts.append(attr)
        attentions = [p for p in parts if p in attention]
        if attentions:
            count = _length(lists[attentions[0]]) or "N"
            return loop, attentions[0], Sublayers(count, tuple(parts))
    return None


def sublayers(cls: ast.ClassDef, forward: ast.FunctionDef, attention: set[str], built: dict) -> Sublayers | None:
    """The layer's sublayers where it calls its attentions through module lists, unrolled or in a loop."""
    found = _unrolled(cls, forward, attention, built)
    if found is not None:
        return found
    loop = looped(cls, forward, attention)
    return loop[2] if loop is not None else None


@dataclass(frozen=True)
class IdentityExperts:
    block: str  # the class whose forward hands the state on
    test: str  # the expert-index test, as written
    where: str  # file:line of the branch
    key: str | None  # the config key __init__ adds to the routed count

    def count(self, config: dict) -> str:
        return f"config.json {self.key} = {config[self.key]}" if self.key in config else (
            f"config.{self.key}" if self.key else "")


def identity_experts_read(classes: dict, name: str, config: dict, depth: int = 0) -> IdentityExperts | None:
    """Identity (zero-compute) experts in the module class `name` or a class it builds: the forward, under a test of
    the expert index against an attribute (`expert_idx >= self.num_routed_experts`), hands the token's state on
    through an nn.Identity or as it is. Their number is the config key __init__ adds to that attribute's; None where
    config.json sets it to 0."""
    if name not in classes or depth > 2:
        return None
    file, cls = classes[name]
    init, forward = _method(cls, "__init__"), _method(cls, "forward")
    keys = {}  # attribute -> config key, `self.A = config.K (or ...)`
    identities = set()
    for node in subtree(init) if init is not None else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and _dotted(node.targets[0].value) == "self":
            reads = [n for n in subtree(node.value) if isinstance(n, ast.Attribute) and _dotted(n.value) == "config"]
            if reads:
                keys[node.targets[0].attr] = reads[0].attr
            if isinstance(node.value, ast.Call) and _dotted(node.value.func).rsplit(".", 1)[-1] == "Identity":
                identities.add(node.targets[0].attr)
    for branch in (n for n in subtree(forward) if isinstance(n, ast.If)) if forward is not None else ():
        tests = [c for c in subtree(branch.test) if isinstance(c, ast.Compare) and isinstance(c.ops[0], (ast.GtE, ast.Gt))]
        compared = [n.attr for c in tests for n in subtree(c.comparators[0])
                    if isinstance(n, ast.Attribute) and _dotted(n.value) == "self"]
        if not compared:
            continue
        # The branch's value: an nn.Identity call, or the state itself (a name, or the rows of one: `x[sel]`).
        passes = any(isinstance(s, ast.Assign) and (
            (isinstance(s.value, ast.Call) and isinstance(s.value.func, ast.Attribute)
             and s.value.func.attr in identities) or isinstance(s.value, ast.Name)
            or (isinstance(s.value, ast.Subscript) and isinstance(s.value.value, ast.Name))) for s in branch.body)
        if not passes:
            continue
        routed = compared[0]
        added = [n for n in subtree(init) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)
                 and any(isinstance(m, ast.Attribute) and m.attr == routed for m in (n.left, n.right))]
        zero = next((m.attr for n in added for m in (n.left, n.right)
                     if isinstance(m, ast.Attribute) and m.attr != routed and m.attr in keys), None)
        key = keys.get(zero) if zero else None
        if key is not None and not config.get(key):
            return None
        return IdentityExperts(name, ast.unparse(tests[0]), f"{file}:{branch.lineno}", key)
    for inner in (c for c in _built_classes(cls) if c != name):
        found = identity_experts_read(classes, inner, config, depth + 1)
        if found:
            return found
    return None


def _built_classes(cls: ast.ClassDef) -> list[str]:
    init = _method(cls, "__init__")
    return [_dotted(n.value.func).rsplit(".", 1)[-1] for n in (subtree(init) if init is not None else ())
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)]


def scaled_inputs(classes: dict, name: str) -> str | None:
    """Values the attention class `name` multiplies by numbers of its own before attending, other than the scale it
    hands the attention function (LongCat-Flash's MLA LoRA scales: `q_pass * self.mla_scale_q_lora`,
    `k_pass * self.mla_scale_kv_lora`, each `(config.hidden_size / rank) ** 0.5` in __init__): the port's latent
    attention scales only by that scale."""
    if name not in classes:
        return None
    file, cls = classes[name]
    init, forward = _method(cls, "__init__"), _method(cls, "forward")
    if init is None or forward is None:
        return None
    numbers = {}  # attribute -> its __init__ expression, where that reads the config and builds no module
    for node in subtree(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, (ast.BinOp, ast.Call))
                and any(isinstance(n, ast.Attribute) and _dotted(n.value) == "config" or
                        (isinstance(n, ast.Attribute) and _dotted(n.value) == "self") for n in subtree(node.value))
                and not (isinstance(node.value, ast.Call) and _dotted(node.value.func).rsplit(".", 1)[-1][:1].isupper())):
            numbers[node.targets[0].attr] = node.value
    handed = {n.attr for call in subtree(forward) if isinstance(call, ast.Call) for k in call.keywords
              for n in subtree(k.value) if isinstance(n, ast.Attribute) and _dotted(n.value) == "self"}
    uses = _own_products(forward, numbers, handed)
    if not uses:
        return None
    products = ", ".join(dict.fromkeys(ast.unparse(n) for n, _ in uses))
    defined = "; ".join(dict.fromkeys(f"self.{a} = {ast.unparse(numbers[a])}" for _, a in uses))
    return (f"values scaled by numbers of the attention's own: {name}.forward computes {products} "
            f"({file}:{uses[0][0].lineno}; {defined}), beside the scale it hands the attention function")


def _own_products(forward: ast.FunctionDef, numbers, handed=frozenset()) -> list[tuple[ast.BinOp, str]]:
    """(product, attribute) for each `X * self.A` of the forward with A one of `numbers`, not handed on."""
    return [(n, side.attr) for n in subtree(forward) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
            for side in (n.left, n.right) if isinstance(side, ast.Attribute) and _dotted(side.value) == "self"
            and side.attr in numbers and side.attr not in handed]


# ------------------------------------------------------------------ the form the port computes
# Terms of the layer's forward, evaluated over its input: ("x",), ("call", module, index or None, argument),
# ("add", a, b), ("opaque", text).


@dataclass(frozen=True)
class Portable:
    """A layer the port computes: `count` pre-norm sublayers in sequence, sublayer i computing
    h = h + attention[i](attn_norm[i](h)); u = mlp_norm[i](h); h = h + mlp[i](u), and (where there is one) a
    shortcut module reading sublayer `reads`' u, its output added to the layer's output."""
    count: int
    attention: str
    attn_norm: str
    mlp_norm: str
    mlp: str
    shortcut: str | None
    reads: int
    evidence: str


class _Unread(Exception):
    pass


class _Terms:
    def __init__(self, cls: ast.ClassDef, lists: dict[str, int]):
        self.cls, self.lists = cls, lists
        self.calls: list[tuple[str, int | None]] = []

    def expr(self, node: ast.expr, env: dict):
        if isinstance(node, ast.Name):
            if node.id not in env:
                raise _Unread(f"{node.id} (line {node.lineno})")
            return env[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return ("add", self.expr(node.left, env), self.expr(node.right, env))
        if isinstance(node, ast.Call):
            return self.call(node, env)
        raise _Unread(f"{_short(node)} (line {node.lineno})")

    def call(self, node: ast.Call, env: dict):
        func, index = node.func, None
        if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute) \
                and _dotted(func.value.value) == "self" and func.value.attr in self.lists:
            at = func.slice
            index = at.value if isinstance(at, ast.Constant) and isinstance(at.value, int) else \
                env.get(at.id) if isinstance(at, ast.Name) else None
            if not isinstance(index, int) or isinstance(index, bool):
                raise _Unread(f"{_short(node)} (line {node.lineno})")
            attr = func.value.attr
        elif isinstance(func, ast.Attribute) and _dotted(func.value) == "self" and func.attr not in self.lists \
                and _method(self.cls, func.attr) is None:
            attr = func.attr
        elif isinstance(func, ast.Name) and isinstance(env.get(func.id), tuple) and env[func.id][0] == "element":
            attr, index = env[func.id][1], env[func.id][2]
        else:
            raise _Unread(f"{_short(node)} (line {node.lineno})")
        # The states it reads: the first positional argument, else the keyword the states go by.
        given = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg in ("hidden_states", "x", "hidden", "h", "input")), None)
        if given is None:
            raise _Unread(f"{_short(node)} (line {node.lineno}): no states handed to it")
        argument = self.expr(given, env)  # evaluated first: the order of calls is the order they run in
        self.calls.append((attr, index))
        return ("call", attr, index, argument)

    def body(self, stmts: list[ast.stmt], env: dict):
        for stmt in stmts:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                continue  # a docstring
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target, value = stmt.targets[0], self.expr(stmt.value, env)
                first = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
                if not isinstance(first, ast.Name):
                    raise _Unread(f"{_short(stmt)} (line {stmt.lineno})")
                env[first.id] = value
                if isinstance(target, ast.Tuple):
                    for other in target.elts[1:]:
                        if isinstance(other, ast.Name):
                            env[other.id] = ("opaque", other.id)
            elif isinstance(stmt, ast.AugAssign) and isinstance(stmt.op, ast.Add) and isinstance(stmt.target, ast.Name):
                env[stmt.target.id] = ("add", self.expr(stmt.target, env), self.expr(stmt.value, env))
            elif isinstance(stmt, ast.For):
                self.loop(stmt, env)
            elif isinstance(stmt, ast.Return) and stmt.value is not None:
                value = stmt.value.elts[0] if isinstance(stmt.value, ast.Tuple) and stmt.value.elts else stmt.value
                return self.expr(value, env)
            else:
                raise _Unread(f"{_short(stmt)} (line {stmt.lineno})")
        raise _Unread("no return")

    def loop(self, loop: ast.For, env: dict) -> None:
        """`for i in range(N)`, `for i in range(len(self.A))`, `for a, b in zip(self.A, self.B)`, `for a in self.A`:
        unrolled over the lists' lengths."""
        it, target = loop.iter, loop.target
        if isinstance(it, ast.Call) and _dotted(it.func) == "range" and len(it.args) == 1 \
                and isinstance(target, ast.Name):
            arg = it.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, int):
                count = arg.value
            elif isinstance(arg, ast.Call) and _dotted(arg.func) == "len" and arg.args and isinstance(
                    arg.args[0], ast.Attribute) and arg.args[0].attr in self.lists:
                count = self.lists[arg.args[0].attr]
            else:
                raise _Unread(f"for {_short(target)} in {_short(it)} (line {loop.lineno})")
            binds = [{target.id: i} for i in range(count)]
        else:
            iterated = list(it.args) if isinstance(it, ast.Call) and _dotted(it.func) == "zip" else [it]
            names = target.elts if isinstance(target, ast.Tuple) else [target]
            attrs = [n.attr for n in iterated if isinstance(n, ast.Attribute) and _dotted(n.value) == "self"
                     and n.attr in self.lists]
            if len(attrs) != len(iterated) or len(names) != len(attrs) or \
                    not all(isinstance(n, ast.Name) for n in names) or len({self.lists[a] for a in attrs}) != 1:
                raise _Unread(f"for {_short(target)} in {_short(it)} (line {loop.lineno})")
            binds = [{n.id: ("element", a, i) for n, a in zip(names, attrs)} for i in range(self.lists[attrs[0]])]
        if loop.orelse:
            raise _Unread(f"for ... else (line {loop.lineno})")
        for bound in binds:
            env.update(bound)
            for stmt in loop.body:
                self.body_statement(stmt, env)

    def body_statement(self, stmt: ast.stmt, env: dict) -> None:
        if isinstance(stmt, ast.Return):
            raise _Unread(f"a return inside a loop (line {stmt.lineno})")
        try:
            self.body([stmt], env)
        except _Unread as exc:
            if str(exc) != "no return":
                raise


def _short(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _sums(term) -> list:
    """The terms a sum adds, nested sums flattened, each in its canonical form (the order of a sum's terms is
    not the port's concern: the same numbers added)."""
    if term[0] == "add":
        return _sums(term[1]) + _sums(term[2])
    return [_canonical(term)]


def _canonical(term):
    if term[0] == "add":
        return ("add", tuple(sorted(_sums(term), key=repr)))
    if term[0] == "call":
        return ("call", term[1], term[2], _canonical(term[3]))
    return term


def _list_lengths(cls: ast.ClassDef, config: dict) -> dict[str, int]:
    out = {}
    for attr, expr in _module_lists(cls).items():
        text = _length(expr)
        if text is not None and text.isdigit():
            out[attr] = int(text)
        elif text is not None and isinstance(config.get(text.removeprefix("config.")), int):
            out[attr] = config[text.removeprefix("config.")]
    return out


def read(cls: ast.ClassDef, file: str, attention: set[str], config: dict) -> Portable | str | None:
    """The layer's sublayers where they are the form the port computes (`Portable`); a sentence naming what
    differs where the layer calls an attention list otherwise; None where it calls no attention list."""
    forward = _method(cls, "forward")
    lists = _list_lengths(cls, config)
    if forward is None or not set(lists) & attention:
        return None
    params = [a.arg for a in forward.args.args[1:]]
    if not params:
        return None
    terms = _Terms(cls, lists)
    env = {name: ("opaque", name) for name in params + [a.arg for a in forward.args.kwonlyargs]}
    env[params[0]] = ("x",)
    try:
        out = terms.body(forward.body, env)
    except _Unread as exc:
        return f"{cls.name}.forward ({file}:{forward.lineno}): a step the sublayer reader does not follow: {exc}"
    indexed = [(a, i) for a, i in terms.calls if i is not None]
    count = 1 + max((i for _a, i in indexed), default=-1)
    order: dict[int, list[str]] = {}
    for attr, index in indexed:
        order.setdefault(index, []).append(attr)
    parts = order.get(0, [])
    where = f"{cls.name}.forward ({file}:{forward.lineno})"
    if count < 2 or any(order.get(i) != parts for i in range(count)):
        return (f"{where} calls its module lists in another order in some sublayer "
                f"({'; '.join(f'sublayer {i}: ' + ', '.join(order.get(i, [])) for i in range(count))})")
    if len(parts) != 4 or parts[1] not in attention or parts[0] in attention or parts[3] in attention:
        return (f"{where}: each sublayer calls {', '.join(p + '[i]' for p in parts)}, where the port computes a "
                "norm, the attention, a norm and an MLP")
    attn_norm, attn, mlp_norm, mlp = parts
    if any(lists.get(p) != count for p in parts):
        return f"{where}: the module lists hold {', '.join(f'{p}: {lists.get(p)}' for p in parts)} modules, " \
               f"and the forward runs {count} sublayers"
    singles = [a for a, i in terms.calls if i is None]
    if len(singles) > 1 or singles and singles[0] in attention:
        return f"{where}: besides its sublayers it calls {', '.join('self.' + s for s in singles)}"
    shortcut = singles[0] if singles else None
    if shortcut is None:
        return (f"{where}: {count} sublayers ({', '.join(p + '[i]' for p in parts)}) with no mixture of experts beside "
                "them, where the port runs sublayers beside a shortcut mixture of experts (LongCat-Flash's form)")

    def expected(reads: int):
        h, read_by = ("x",), None
        for i in range(count):
            h = ("add", h, ("call", attn, i, ("call", attn_norm, i, h)))
            u = ("call", mlp_norm, i, h)
            if i == reads:
                read_by = u
            h = ("add", h, ("call", mlp, i, u))
        return ("add", h, ("call", shortcut, None, read_by)) if shortcut else h

    got = _canonical(out)
    for reads in range(count if shortcut else 1):
        if got == _canonical(expected(reads)):
            text = (f"{where}: {count} pre-norm sublayers, sublayer i computing h + {attn}[i]({attn_norm}[i](h)), "
                    f"then h + {mlp}[i]({mlp_norm}[i](h))")
            if shortcut:
                text += f"; self.{shortcut} reads {mlp_norm}[{reads}]'s output, added to the layer's output"
            return Portable(count, attn, attn_norm, mlp_norm, mlp, shortcut, reads, text)
    return (f"{where}: its {count} sublayers ({', '.join(p + '[i]' for p in parts)}"
            f"{', and self.' + shortcut if shortcut else ''}) do not compute pre-norm residual sublayers"
            + (" with the shortcut's output added to the layer's output" if shortcut else ""))


def layer_form(sources: dict, config: dict) -> tuple[str, ast.ClassDef, Portable | str] | None:
    """The decoder layer's sublayers as `read` finds them, with the layer's file and class; None where the layer
    keeps no attention in a module list."""
    layer = formcode._decoder_layer(sources)
    if layer is None:
        return None
    file, cls = layer
    attention = {a for a, (c, _) in formcode._built(cls).items() if c in formcode._attention_classes(sources)}
    found = read(cls, file, attention, config)
    return None if found is None else (file, cls, found)


def view(ckpt: Checkpoint, spec: Spec) -> Checkpoint:
    """`ckpt` as the detectors read a layer of one sublayer, where the layer runs `Portable` sublayers: sublayer 0's
    attention and norms named as the layer's own (`self_attn.0.q_a_proj` as `self_attn.q_a_proj`), the other
    sublayers' and the dense MLPs' tensors left out (`check` holds them against sublayer 0's and the MLP's sizes
    once detection is done); the shortcut (the MoE block) keeps its names. `ckpt` itself otherwise."""
    sources = modeling_sources(ckpt)
    found = layer_form(sources, ckpt.config) if sources else None
    if found is None or not isinstance(found[2], Portable):
        spec.set("sublayer_count", 0, Source("default", "the decoder layer runs one attention and one MLP"))
        return ckpt
    form = found[2]
    lists = (form.attention, form.attn_norm, form.mlp_norm, form.mlp)
    pattern = re.compile(rf"^(.*\.\d+\.)({'|'.join(map(re.escape, lists))})\.(\d+)\.(.+)$")
    tensors, others = {}, {}
    for name, info in ckpt.tensors.items():
        match = pattern.match(name)
        if match is None:
            tensors[name] = info
            continue
        head, attr, index, rest = match.groups()
        if attr == form.mlp or index != "0":
            others[name] = info
            continue
        flat = f"{head}{attr}.{rest}"
        if flat in ckpt.tensors:
            raise unsupported(f"sublayers whose module lists share names with the layer's own modules ({flat})",
                              ckpt.config_file, spec.model_type)
        tensors[flat] = replace(info, name=flat)
    for name, info in others.items():
        head, attr, index, rest = pattern.match(name).groups()
        if attr == form.mlp:
            continue
        if int(index) >= form.count:
            raise unsupported(f"{name}: a module past the {form.count} sublayers {form.evidence.split(':')[0]} runs",
                              ckpt.config_file, spec.model_type)
        first = tensors.get(f"{head}{attr}.{rest}")
        if first is None or first.shape != info.shape:
            raise unsupported(f"sublayers that differ: {name} has {'no counterpart' if first is None else 'shape ' + str(list(info.shape))} "
                              f"in sublayer 0{'' if first is None else ' (' + str(list(first.shape)) + ')'}",
                              ckpt.config_file, spec.model_type)
    evidence = form.evidence
    spec.set("sublayer_count", form.count, Source("code", evidence))
    spec.set("sublayer_mlp", form.mlp, Source("code", evidence))
    spec.set("shortcut_reads", form.reads, Source("code", evidence))
    return replace(ckpt, tensors=tensors)


def _element_class(cls: ast.ClassDef, attr: str) -> str | None:
    """The class a module list `self.attr = nn.ModuleList([Cls(...) for ...])` holds."""
    init = _method(cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == attr and isinstance(node.value, ast.Call) and node.value.args):
            arg = node.value.args[0]
            elt = arg.elt if isinstance(arg, (ast.ListComp, ast.GeneratorExp)) else \
                arg.elts[0] if isinstance(arg, (ast.List, ast.Tuple)) and arg.elts else None
            return _dotted(elt.func).rsplit(".", 1)[-1] if isinstance(elt, ast.Call) else None
    return None


def gated_mlp(classes: dict, name: str, names: dict, config: dict) -> str | None:
    """None where the class `name` computes down(act(gate(x)) * up(x)) with the checkpoint's projection names and
    ACT2FN[config.hidden_act] (the port's gated MLP), else what it computes."""
    if name not in classes:
        return f"{name}: a class the modeling code does not define"
    file, cls = classes[name]
    init, forward = _method(cls, "__init__"), _method(cls, "forward")
    if init is None or forward is None:
        return f"{name} ({file}:{cls.lineno}) has no __init__ or forward"
    built = {}
    for node in subtree(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute) \
                and _dotted(node.targets[0].value) == "self":
            built[node.targets[0].attr] = node.value
    act = [a for a, v in built.items() if isinstance(v, ast.Subscript) and _dotted(v.value) == "ACT2FN"
           and _dotted(v.slice) in ("config.hidden_act", "self.config.hidden_act")]
    linear = {a for a, v in built.items() if isinstance(v, ast.Call) and _dotted(v.func).rsplit(".", 1)[-1] == "Linear"}
    returns = [n.value for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None]
    values = {t.id: n.value for n in subtree(forward) if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)}
    out = returns[-1] if returns else None
    if isinstance(out, ast.Name) and out.id in values:
        out = values[out.id]
    x = forward.args.args[1].arg if len(forward.args.args) > 1 else None

    def called(node, attrs) -> ast.expr | None:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _dotted(node.func.value) == "self" \
                and node.func.attr in attrs and len(node.args) == 1:
            return node.args[0]
        return None

    def module(node) -> str:
        return node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else ""

    inner = called(out, {names.get("down_proj")} & linear)
    if inner is not None and isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Mult):
        for activated, other in ((inner.left, inner.right), (inner.right, inner.left)):
            gate = called(activated, set(act))
            if gate is not None and module(gate) == names.get("gate_proj") and module(other) == names.get("up_proj") \
                    and all(isinstance(a, ast.Name) and a.id == x for a in (called(gate, linear), called(other, linear))):
                return None
    return (f"{name}.forward ({file}:{forward.lineno}) computes {_short(out) if out is not None else 'nothing'}, "
            f"where the port's MLP computes {names.get('down_proj')}(act({names.get('gate_proj')}(x)) * "
            f"{names.get('up_proj')}(x)) with ACT2FN[config.hidden_act]")


def check(ckpt: Checkpoint, spec: Spec) -> None:
    """What `view` left out, against what detection found on sublayer 0: the shortcut is the MoE block the
    detectors read, each sublayer's dense MLP is the port's gated MLP at the config's intermediate size, and the
    latent attention's LoRA scales are read (spec sublayer_latent_scales). Refused by name otherwise."""
    sources = modeling_sources(ckpt)
    _file, cls, form = layer_form(sources, ckpt.config)
    names, where = spec.names, ckpt.config_file
    if form.shortcut != names.get("mlp") or "experts" not in names:
        raise unsupported(f"{form.evidence}: the shortcut self.{form.shortcut} is not the mixture of experts the port "
                          "builds beside the sublayers", where, spec.model_type)
    if spec.norm_kind != "rms" or spec.block != "pre_norm":
        raise unsupported(f"{form.evidence}, with {spec.norm_kind} norms in a {spec.block} block: the port runs "
                          "sublayers with RMS norms before each sublayer only", where, spec.model_type)
    classes = formcode._classes(sources)
    mlp_class = _element_class(cls, form.mlp)
    problem = gated_mlp(classes, mlp_class or "", names, ckpt.config) if spec.mlp_kind == "gated" else \
        f"the experts are not gated MLPs ({spec.mlp_kind})"
    if problem:
        raise unsupported(f"sublayer MLPs the port does not compute: {problem}", where, spec.model_type)
    hidden, inter = spec.hidden_size, spec.intermediate_size
    shapes = {f"{names['gate_proj']}.weight": (inter, hidden), f"{names['up_proj']}.weight": (inter, hidden),
              f"{names['down_proj']}.weight": (hidden, inter)}
    head = f"{names['model']}.{names['layers']}."
    for layer in range(spec.num_layers):
        for index in range(form.count):
            inside = f"{head}{layer}.{form.mlp}.{index}."
            found = {n[len(inside):]: i.shape for n, i in ckpt.tensors.items() if n.startswith(inside)}
            if found != shapes:
                raise unsupported(f"sublayer MLP {inside[:-1]} holds {sorted(found.items())}, where the port's gated "
                                  f"MLP of width {inter} loads {sorted(shapes.items())}", where, spec.model_type)
    if spec.qkv_layout == "latent":
        attention = _element_class(cls, form.attention)
        scales = latent_scales(classes, attention or "", names, ckpt.config)
        if isinstance(scales, str):
            raise unsupported(scales, where, spec.model_type)
        spec.set("sublayer_latent_scales", scales[0], Source("code", scales[1]) if scales[0] else
                 Source("default", "the latent attention scales its values by the score scale only"))


RANK_KEYS = {"q": "q_lora_rank", "kv": "kv_lora_rank"}


def _origin(forward: ast.FunctionDef, name: str, line: int, depth: int = 0) -> str | None:
    """The module `self.M` whose output the local `name` holds at `line`, through splits, views and transposes."""
    if depth > 8:
        return None
    assigns = [n for n in subtree(forward) if isinstance(n, ast.Assign) and n.lineno < line and any(
        isinstance(m, ast.Name) and m.id == name for t in n.targets for m in subtree(t))]
    if not assigns:
        return None
    stmt = max(assigns, key=lambda n: n.lineno)
    value = stmt.value
    while isinstance(value, ast.Call):
        func = value.func
        if isinstance(func, ast.Attribute) and _dotted(func.value) == "self":
            return func.attr
        if isinstance(func, ast.Attribute) and func.attr in ("split", "view", "transpose", "reshape", "contiguous",
                                                               "chunk"):
            value = value.args[0] if _dotted(func.value) == "torch" and value.args else func.value
        else:
            return None
    if isinstance(value, ast.Name):
        return _origin(forward, value.id, stmt.lineno, depth + 1)
    return None


def _square_root(node: ast.expr) -> ast.expr | None:
    """X of `X ** 0.5`, `math.sqrt(X)` or `X ** (1 / 2)`."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and (
            isinstance(node.right, ast.Constant) and node.right.value == 0.5
            or ast.unparse(node.right) in ("1 / 2", "(1 / 2)")):
        return node.left
    if isinstance(node, ast.Call) and _dotted(node.func) in ("math.sqrt", "sqrt") and len(node.args) == 1:
        return node.args[0]
    return None


def latent_scales(classes: dict, name: str, names: dict, config: dict) -> tuple[list[str], str] | str:
    """Which of the latent attention's query ('q') and normed key/value latent ('kv') its forward multiplies by
    (config.hidden_size / rank) ** 0.5 of their LoRA rank (LongCat-Flash's mla_scale_q_lora, mla_scale_kv_lora), with
    the evidence; a sentence naming what differs where it multiplies its values by other numbers of its own, or only
    some parts of the query, or values the port's norms do not produce."""
    other = scaled_inputs(classes, name)
    if other is None:
        return [], ""
    file, cls = classes[name]
    init, forward = _method(cls, "__init__"), _method(cls, "forward")
    ranks = {}  # attribute -> config key, `self.R = config.K`
    factors = {}  # attribute -> "q" / "kv"
    for node in subtree(init):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self"):
            continue
        attr, value = node.targets[0].attr, node.value
        if isinstance(value, ast.Attribute) and _dotted(value.value) == "config":
            ranks[attr] = value.attr
        elif (root := _square_root(value)) is not None and isinstance(root, ast.BinOp) \
                and isinstance(root.op, ast.Div) and _dotted(root.left) in ("config.hidden_size", "self.hidden_size"):
            rank = root.right
            key = rank.attr if isinstance(rank, ast.Attribute) and _dotted(rank.value) == "config" else \
                ranks.get(rank.attr) if isinstance(rank, ast.Attribute) and _dotted(rank.value) == "self" else None
            kind = next((k for k, v in RANK_KEYS.items() if v == key), None)
            if kind is not None:
                factors[attr] = kind
    scaled: dict[str, list[tuple[str, ast.BinOp, str | None]]] = {}  # kind -> (what, product, the module it holds)
    for node in subtree(forward):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            for side, value in ((node.right, node.left), (node.left, node.right)):
                if isinstance(side, ast.Attribute) and _dotted(side.value) == "self" and side.attr in factors:
                    if isinstance(value, ast.Name):
                        origin = _origin(forward, value.id, node.lineno)
                    elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                            and _dotted(value.func.value) == "self":
                        origin = value.func.attr  # a module's output scaled as it is computed: all of it
                    else:
                        return other
                    scaled.setdefault(factors[side.attr], []).append((_short(value), node, origin))
    # Every number of its own the forward multiplies by must be one of these factors.
    own = {a for _n, a in _own_products(forward, {a for a in ranks.keys() | factors.keys()} | {
        n.targets[0].attr for n in subtree(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
        and isinstance(n.targets[0], ast.Attribute) and isinstance(n.value, (ast.BinOp, ast.Call))})}
    if not scaled or not own <= set(factors):
        return other
    roles = {"q": names.get("q_b_proj"), "kv": names.get("kv_a_norm")}
    for kind, uses in scaled.items():
        origins = {origin for _n, _node, origin in uses}
        if origins != {roles[kind]}:
            return (f"{other}: {', '.join(sorted(n for n, _, _ in uses))} scaled by the {RANK_KEYS[kind]} factor hold "
                    f"{', '.join(sorted(str(o) for o in origins))}, where the port folds it into {roles[kind]}")
        if kind == "q" and not any(isinstance(node.left, ast.Call) or isinstance(node.right, ast.Call)
                                   for _n, node, _o in uses):  # every part of the query: the split's targets
            first = min(uses, key=lambda u: u[1].lineno)
            parts = [n for n in subtree(forward) if isinstance(n, ast.Assign) and n.lineno < first[1].lineno and any(
                isinstance(m, ast.Name) and m.id == first[0] for t in n.targets for m in subtree(t))]
            split = max(parts, key=lambda n: n.lineno) if parts else None
            targets = {m.id for t in split.targets for m in subtree(t) if isinstance(m, ast.Name)} if split else set()
            if targets != {n for n, _, _ in uses}:
                return f"{other}: only part of the query ({', '.join(sorted(n for n, _, _ in uses))} of " \
                       f"{', '.join(sorted(targets))}) is scaled"
    evidence = "; ".join(f"{name}.forward multiplies {', '.join(dict.fromkeys(n for n, _, _ in uses))} by "
                         f"(hidden_size / {RANK_KEYS[kind]}) ** 0.5 ({file}:{uses[0][1].lineno})"
                         for kind, uses in sorted(scaled.items()))
    return sorted(scaled), evidence
