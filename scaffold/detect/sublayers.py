"""The sublayers of a decoder layer that computes attention more than once, read from its forward (as text, never
run), for `forms.several_attentions` to name what the layer computes: LongCat-Flash's layer runs two sublayers in
sequence, sublayer i calling input_layernorm[i], self_attn[i], post_attention_layernorm[i] and mlps[i], and a
shortcut MoE (`self.mlp`) that reads the first sublayer's normed states and is added to the layer's output after
the last sublayer. A lab may write the same thing otherwise: other names, a loop over its module lists
(`for i in range(2): x = x + self.attns[i](self.norms[i](x))`) or over their zip.

What is read:
- the sublayers: the module lists the forward indexes by the same constant (self.A[0], self.B[0], ...) in the
  order it calls them, and how many indices it calls; or the `for` loop whose body calls the attention through
  its list (indexed by the loop's variable, or a name the loop takes from the list), with the list's length from
  __init__ (a list literal, `range(2)`, or `range(config.K)`);
- a shortcut: a module called once, outside the lists, whose output is not the running states but is added to
  them later; which sublayer's module produced what it reads, and the line where its output is added;
- identity experts inside that module (LongCat-Flash's zero experts): the experts' forward hands a token's state on
  unchanged (an nn.Identity, or the state itself) for expert indices past the routed ones, their number read from
  the config key the experts' __init__ adds to the routed count. vLLM's FusedMoE computes those only in a Triton
  kernel (`zero_expert_type`: `zero_experts_compute_triton`), which its CPU build does not run
  (`vllm.triton_utils.HAS_TRITON` is False there).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.sourcecode import _dotted, subtree


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


def identity_experts(classes: dict, name: str, config: dict, depth: int = 0) -> str | None:
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
        count = f"config.json {key} = {config[key]}" if key in config else (f"config.{key}" if key else "")
        return (f"identity experts: {name}.forward hands a token's state on unchanged for expert indices "
                f"{ast.unparse(tests[0])} ({file}:{branch.lineno}{'; ' + count if count else ''}), which "
                "vLLM's FusedMoE computes only in a Triton kernel (zero_expert_type) its CPU build does not run")
    for inner in (c for c in _built_classes(cls) if c != name):
        found = identity_experts(classes, inner, config, depth + 1)
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
    uses = [(n, side.attr) for n in subtree(forward) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)
            for side in (n.left, n.right) if isinstance(side, ast.Attribute) and _dotted(side.value) == "self"
            and side.attr in numbers and side.attr not in handed]
    if not uses:
        return None
    products = ", ".join(dict.fromkeys(ast.unparse(n) for n, _ in uses))
    defined = "; ".join(dict.fromkeys(f"self.{a} = {ast.unparse(numbers[a])}" for _, a in uses))
    return (f"values scaled by numbers of the attention's own: {name}.forward computes {products} "
            f"({file}:{uses[0][0].lineno}; {defined}), beside the scale it hands the attention function")
