"""Sizes and settings the modeling code reads from sub-configs, and experts stored flattened: two forms the port has
no field for, named where a refusal needs them (read as text, never run).

- Sub-configs (DBRX's `config.attn_config.kv_n_heads`, `DbrxRouter(config.ffn_config)`): a config key whose value in
  config.json is itself a dict, read by attribute (`config.K.Y`, or through a local or attribute holding `config.K`),
  or handed to a class as that class's config (whose `config.Y` then reads `K.Y`). The port's size fields read keys
  of the top-level config.
- Flattened experts (DBRX's `w1`, `v1`, `w2`): one 2-D parameter per projection holding every expert's rows,
  declared `nn.Parameter(torch.empty(E * F, H))` and viewed per expert in forward (`.view(-1, F, H)[expert]`). The
  port's experts load one [out, in] matrix per expert, or a 3-D tensor [experts, ...] (scaffold.detect.stacked).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.sourcecode import _classes, _dotted, subtree

MAX_HOPS = 4
TENSOR_BUILDERS = ("empty", "zeros", "ones", "randn", "rand", "full")


@dataclass(frozen=True)
class SubconfigReads:
    reads: tuple[str, ...]  # "K.Y", sorted, each once
    handed: tuple[tuple[str, str, str], ...]  # (K, class, FILE:LINE) for `Cls(config.K)`
    first: str  # FILE:LINE of the first read
    at: tuple[tuple[str, str], ...] = ()  # ("K.Y", FILE:LINE of its first read)
    receivers: tuple[tuple[str, str], ...] = ()  # (class, K) for each class whose own `config` is the sub-config K

    def sizes(self, config: dict) -> tuple[str, ...]:
        """The reads config.json holds an integer for (the sizes among them)."""
        out = []
        for read in self.reads:
            key, _, leaf = read.partition(".")
            value = config.get(key, {}).get(leaf) if isinstance(config.get(key), dict) else None
            if isinstance(value, int) and not isinstance(value, bool):
                out.append(read)
        return tuple(out)

    def describe(self, config: dict, at_most: int = 5) -> str:
        """The sizes read (else every read), at most `at_most`, and the first line that reads one."""
        shown = (self.sizes(config) or self.reads)[:at_most]
        where = dict(self.at)
        first = min((where[r] for r in shown if r in where), key=_line, default=self.first)
        total = len(self.sizes(config) or self.reads)
        return ", ".join(shown) + (", ..." if total > at_most else "") + f" ({first})"


def _sub_keys(config: dict) -> set[str]:
    return {k for k, v in config.items() if isinstance(v, dict) and not k.startswith("_")
            and k not in ("rope_parameters", "rope_scaling", "quantization_config")}


def subconfig_reads(sources: dict[str, str], config: dict) -> SubconfigReads | None:
    """What the code reads from the sub-configs config.json holds (see the module's docstring); None where it reads
    none."""
    subs = _sub_keys(config)
    if not subs:
        return None
    classes = _classes(sources)
    reads: dict[str, str] = {}
    handed: list[tuple[str, str, str]] = []
    # Classes that receive a sub-config as their own `config`: class name -> key.
    receivers: dict[str, str] = {}
    for _ in range(MAX_HOPS):
        before = len(receivers)
        for name, (file, cls) in classes.items():
            own = receivers.get(name)
            for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
                aliases: dict[str, str] = {}  # local or self.attr -> key
                for node in sorted((n for n in subtree(func) if hasattr(n, "lineno")),
                                   key=lambda n: (n.lineno, n.col_offset)):
                    if isinstance(node, ast.Assign) and len(node.targets) == 1:
                        key = _sub_of(node.value, aliases, own, subs)
                        target = _dotted(node.targets[0])
                        if key is not None and target and "." not in target.removeprefix("self."):
                            aliases[target] = key
                    if isinstance(node, ast.Attribute) and (key := _sub_of(node.value, aliases, own, subs)):
                        reads.setdefault(f"{key}.{node.attr}", f"{file}:{node.lineno}")
                    if isinstance(node, ast.Call) and (callee := _dotted(node.func).rsplit(".", 1)[-1]) in classes:
                        for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "config")][:1]:
                            key = _sub_of(arg, aliases, own, subs)
                            if key is not None:
                                receivers.setdefault(callee, key)
                                handed.append((key, callee, f"{file}:{node.lineno}"))
                            elif own is not None and _dotted(arg) in ("config", "self.config"):
                                receivers.setdefault(callee, own)  # handed on (DbrxExperts' DbrxExpertGLU(config))
                    elif own is not None and isinstance(node, ast.Attribute) and _plain_config(node.value):
                        reads.setdefault(f"{own}.{node.attr}", f"{file}:{node.lineno}")
        if len(receivers) == before:
            break
    reads = {r: at for r, at in reads.items() if r.split(".", 1)[0] in subs and r.split(".")[-1] not in subs}
    if not reads and not handed:
        return None
    first = min(reads.values(), key=_line) if reads else handed[0][2]
    return SubconfigReads(tuple(sorted(reads)), tuple(dict.fromkeys(handed)), first, tuple(sorted(reads.items())),
                          tuple(sorted(receivers.items())))


def _line(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def _plain_config(node: ast.AST) -> bool:
    return _dotted(node) in ("config", "self.config")


def _sub_of(node: ast.AST, aliases: dict[str, str], own: str | None, subs: set[str]) -> str | None:
    """The sub-config key an expression holds: `config.K` (K a dict in config.json), a local or attribute assigned
    one; None otherwise. In a class that received a sub-config as its config, `config.K` is not looked up (its
    config is the sub-config)."""
    dotted = _dotted(node)
    if not dotted:
        return None
    if dotted in aliases:
        return aliases[dotted]
    for root in ("config.", "self.config."):
        if dotted.startswith(root) and own is None and (key := dotted[len(root):]) in subs:
            return key
    return None


@dataclass(frozen=True)
class FlattenedExperts:
    cls: str
    params: tuple[str, ...]  # the 2-D parameters, as declared
    declared: str  # FILE:LINE: the first declaration as written
    viewed: str  # FILE:LINE: a view of one of them per expert, as written ("" where none was found)
    view_sizes: tuple[str, ...] = ()  # that view's sizes, as written

    def describe(self) -> str:
        declared_at = self.declared.split(": ", 1)[0]
        viewed_at = self.viewed.split(": ", 1)[0]
        return (f"{', '.join(self.params)} of {self.cls}: one 2-D parameter each for all experts ({declared_at}), "
                f"viewed per expert ({viewed_at})")


def flattened_experts(sources: dict[str, str], layer0: dict) -> FlattenedExperts | None:
    """A class declaring 2-D parameters whose first size is a product (`nn.Parameter(torch.empty(E * F, H))`), which
    layer 0 stores as 2-D tensors ending in those names, and which the code views with three or more sizes
    (`self.mlp.w1.view(split_expert_shape)[expert_idx]`, split_expert_shape = (-1, F, H)); None otherwise."""
    stored = {name.rsplit(".", 1)[-1]: info for name, info in layer0.items() if len(getattr(info, "shape", ())) == 2}
    for file, cls in _classes(sources).values():
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        found: dict[str, ast.Assign] = {}
        for node in subtree(init) if init is not None else ():
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute) and _dotted(node.targets[0].value) == "self"
                    and isinstance(node.value, ast.Call) and _dotted(node.value.func).endswith("Parameter")
                    and node.value.args and isinstance(built := node.value.args[0], ast.Call)
                    and _dotted(built.func).rsplit(".", 1)[-1] in TENSOR_BUILDERS):
                continue
            sizes = built.args[0].elts if len(built.args) == 1 and isinstance(built.args[0], (ast.Tuple, ast.List)) \
                else built.args
            if len(sizes) == 2 and isinstance(sizes[0], ast.BinOp) and isinstance(sizes[0].op, ast.Mult) \
                    and node.targets[0].attr in stored:
                found[node.targets[0].attr] = node
        if not found:
            continue
        viewed = _per_expert_view(sources, set(found))
        if not viewed:
            continue
        first = min(found.values(), key=lambda n: n.lineno)
        sizes = tuple(part.strip() for part in viewed.split(" viewed as (", 1)[1].rstrip(")").split(","))
        return FlattenedExperts(cls.name, tuple(found), f"{file}:{first.lineno}: {ast.unparse(first.value)}", viewed,
                                sizes)
    return None


def _per_expert_view(sources: dict[str, str], params: set[str]) -> str:
    """FILE:LINE: `<...>.P.view(shape)` with three or more sizes (a local tuple followed), for P among `params`."""
    for file, cls in _classes(sources).values():
        for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
            locals_ = {n.targets[0].id: n.value for n in subtree(func) if isinstance(n, ast.Assign)
                       and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
            for node in subtree(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("view", "reshape", "unflatten")
                        and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in params):
                    continue
                args = [locals_.get(a.id, a) if isinstance(a, ast.Name) else a for a in node.args]
                sizes = args[0].elts if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)) else args
                if len(sizes) >= 3 or node.func.attr == "unflatten":
                    shape = ", ".join(ast.unparse(s) for s in sizes)
                    return f"{file}:{node.lineno}: {node.func.value.attr} viewed as ({shape})"
    return ""


MATMULS = ("matmul", "mm", "bmm")
TRANSPOSES = ("T", "t", "transpose", "mT")


@dataclass(frozen=True)
class FlatRoles:
    """What the code computes with flattened experts (one expert's slice of each parameter)."""

    gate: str  # the parameter whose product the activation takes
    up: str  # the one multiplied by the activated product
    down: str  # the one applied to that product
    in_out: frozenset[str]  # parameters whose slice the code multiplies as the right-hand matrix (x @ w[e])
    evidence: str  # FILE:LINE: the product as written
    width: str = ""  # the config key of each expert's rows (K.Y), "" where not read
    count: str = ""  # the config key of the number of experts (K.Y), "" where not read


def flattened_roles(sources: dict[str, str], flat: FlattenedExperts, config: dict) -> FlatRoles | str:
    """Which flattened parameter is the gate, the up and the down projection, and how each expert's slice is
    multiplied, read from the function computing with the per-expert views (DBRX's DbrxExpertGLU.forward, handed
    `self.mlp.w1.view(...)[expert_idx]` and the others by DbrxExperts.forward); the sizes of the declaration
    `E * F` as config keys. A string naming what was not read otherwise."""
    classes = _classes(sources)
    params = set(flat.params)
    viewer = _viewing_function(sources, params)
    if viewer is None:
        return f"no per-expert view of {', '.join(flat.params)}"
    file, owner, func = viewer
    local = _view_locals(func, params)
    math = (file, func, local)
    for node in subtree(func):
        if not isinstance(node, ast.Call):
            continue
        handed = [local.get(a.id) if isinstance(a, ast.Name) else None for a in node.args]
        if sum(h is not None for h in handed) < 2:
            continue
        callee = _callee_forward(classes, owner, node)
        if callee is not None:
            c_file, c_func = callee
            names = [a.arg for a in c_func.args.posonlyargs + c_func.args.args][1:]
            math = (c_file, c_func, {n: p for n, p in zip(names, handed) if p is not None})
        break
    roles = _roles(*math)
    if isinstance(roles, str):
        return roles
    width, count = _declared_sizes(sources, flat, config)
    return FlatRoles(*roles, width=width, count=count)


def _viewing_function(sources: dict, params: set[str]):
    for file, cls in _classes(sources).values():
        for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
            if _view_locals(func, params):
                return file, cls, func
    return None


def _view_locals(func: ast.FunctionDef, params: set[str]) -> dict[str, str]:
    """local -> parameter for `w1 = <...>.w1.view(...)[e]` (a view or reshape of the parameter, indexed)."""
    out = {}
    for node in subtree(func):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Subscript)):
            continue
        inner = node.value.value
        if (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                and inner.func.attr in ("view", "reshape", "unflatten")
                and isinstance(inner.func.value, ast.Attribute) and inner.func.value.attr in params):
            out[node.targets[0].id] = inner.func.value.attr
    return out


def _callee_forward(classes: dict, owner: ast.ClassDef, call: ast.Call):
    """The forward of the module `self.X(...)` calls (X built in the owner's __init__ from a class of the code)."""
    if not (isinstance(call.func, ast.Attribute) and _dotted(call.func.value) == "self"):
        return None
    init = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and _dotted(node.targets[0]) == _dotted(call.func)
                and isinstance(node.value, ast.Call)
                and (found := classes.get(_dotted(node.value.func).rsplit(".", 1)[-1])) is not None):
            forward = next((f for f in found[1].body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
            return (found[0], forward) if forward is not None else None
    return None


def _weight_operand(node: ast.AST, weights: dict[str, str]) -> tuple[str, bool] | None:
    """(parameter, transposed) for `w`, `w.T`, `w.t()`, `w.transpose(-1, -2)` with w a per-expert slice."""
    if isinstance(node, ast.Name) and node.id in weights:
        return weights[node.id], False
    if isinstance(node, ast.Attribute) and node.attr in TRANSPOSES and isinstance(node.value, ast.Name) \
            and node.value.id in weights:
        return weights[node.value.id], True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TRANSPOSES \
            and isinstance(node.func.value, ast.Name) and node.func.value.id in weights:
        return weights[node.func.value.id], True
    return None


def _product(node: ast.AST, weights: dict[str, str]) -> tuple[ast.AST, str, bool] | None:
    """(data operand, parameter, in_out) of a product of a value by one expert's slice: `x @ w`, `x.matmul(w.T)`,
    `torch.matmul(x, w)`, `F.linear(x, w)` (w as [out, in])."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        left, right = node.left, node.right
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MATMULS \
            and _dotted(node.func.value) not in ("torch",) and len(node.args) == 1:
        left, right = node.func.value, node.args[0]
    elif isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] in MATMULS and len(node.args) == 2:
        left, right = node.args
    elif isinstance(node, ast.Call) and _dotted(node.func).rsplit(".", 1)[-1] == "linear" and len(node.args) >= 2:
        found = _weight_operand(node.args[1], weights)
        if found is None or found[1]:
            return None
        return node.args[0], found[0], False
    else:
        return None
    found = _weight_operand(right, weights)
    if found is None:
        return None
    return left, found[0], not found[1]


def _roles(file: str, func: ast.FunctionDef, weights: dict[str, str]):
    """(gate, up, down, in_out, evidence) from the statements of `func`, or why not."""
    # local -> (the parameters whose products it holds, activated)
    held: dict[str, tuple[frozenset[str], bool]] = {}
    in_out: set[str] = set()
    gate = up = down = None
    evidence = ""

    def value_of(node: ast.AST) -> tuple[frozenset[str], bool] | None:
        nonlocal gate, up, evidence
        if isinstance(node, ast.Name):
            return held.get(node.id)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            left, right = value_of(node.left), value_of(node.right)
            if left is not None and right is not None and len(left[0]) == len(right[0]) == 1 \
                    and left[1] != right[1]:
                activated, plain = (left, right) if left[1] else (right, left)
                gate, up = next(iter(activated[0])), next(iter(plain[0]))
                evidence = evidence or f"{file}:{node.lineno}: {ast.unparse(node)}"
                return activated[0] | plain[0], False
            return None
        found = _product(node, weights)
        if found is not None:
            _, param, right = found
            if right:
                in_out.add(param)
            return frozenset({param}), False
        if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords \
                and (inner := value_of(node.args[0])) is not None:
            return inner[0], True  # an activation (self.activation_fn(x), F.silu(x))
        return None

    statements = sorted((n for n in subtree(func) if isinstance(n, (ast.Assign, ast.Return))),
                        key=lambda n: (n.lineno, n.col_offset))  # inside loops too (a lab's per-expert loop)
    for stmt in statements:
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)):
            if isinstance(stmt, ast.Return) and stmt.value is not None:
                stmt = ast.Assign(targets=[ast.Name("<return>", ast.Store())], value=stmt.value, lineno=stmt.lineno)
            else:
                continue
        value = stmt.value
        for node in subtree(value):  # a product inside a larger expression (`out + F.linear(h, d) * w`)
            inner = _product(node, weights) if node is not value else None
            if inner is not None:
                source = value_of(inner[0])
                if inner[2]:
                    in_out.add(inner[1])
                if source is not None and len(source[0]) == 2 and not source[1]:
                    down = inner[1]
        product = _product(value, weights)
        if product is not None:
            data, param, right = product
            source = value_of(data)
            if right:
                in_out.add(param)
            if source is not None and len(source[0]) == 2 and not source[1]:
                down = param
            held[stmt.targets[0].id] = (frozenset({param}), False)
            continue
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult) and not evidence:
            evidence = f"{file}:{stmt.lineno}: {ast.unparse(stmt)}" if value_of(value) is not None else ""
        found = value_of(value)
        if found is not None:
            held[stmt.targets[0].id] = found
    if gate is None or up is None or down is None or len({gate, up, down}) != 3:
        return (f"{func.name} ({file}:{func.lineno}) computes with the per-expert slices otherwise than "
                "down(act(gate(x)) * up(x))")
    return gate, up, down, frozenset(in_out), evidence


def _declared_sizes(sources: dict, flat: FlattenedExperts, config: dict) -> tuple[str, str]:
    """(width key, count key) of the declaration `torch.empty(self.E * self.F, H)`: the factor the per-expert view
    keeps as each expert's rows is the width, the other the count; each `self.X = config.Y` of the declaring class,
    whose config is the sub-config K, gives K.Y. Empty where a factor is not read so."""
    found = _classes(sources).get(flat.cls)
    reads = subconfig_reads(sources, config)
    if found is None:
        return "", ""
    own = dict(reads.receivers).get(flat.cls) if reads is not None else None
    init = next((f for f in found[1].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None or len(init.args.args) < 2:
        return "", ""
    param = init.args.args[1].arg  # the class's config, whatever the code calls it (config, cfg)
    keys: dict[str, str] = {}  # self.X or a local -> the config key it holds
    product = None
    pairs = []
    for node in subtree(init):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs += list(zip(target.elts, value.elts))  # n, d = config.n, config.d
            else:
                pairs.append((target, value))
    for target, value in pairs:
        name = _dotted(target).removeprefix("self.")
        if not name or "." in name:
            continue
        if isinstance(value, ast.Attribute) and _dotted(value.value) in (param, "self.config"):
            if own:
                keys[name] = f"{own}.{value.attr}"
            elif value.attr in config:
                keys[name] = value.attr
        elif isinstance(value, ast.Name) and value.id in keys:
            keys[name] = keys[value.id]
    for node in subtree(init):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and product is None
                and isinstance(node.value, ast.Call) and _dotted(node.value.func).endswith("Parameter")):
            built = node.value.args[0] if node.value.args else None
            first = built.args[0] if isinstance(built, ast.Call) and built.args else None
            if isinstance(first, (ast.Tuple, ast.List)) and first.elts:
                first = first.elts[0]  # torch.zeros((E * F, H))
            if isinstance(first, ast.BinOp):
                product = first
    if product is None:
        return "", ""
    factors = [_dotted(product.left).removeprefix("self."), _dotted(product.right).removeprefix("self.")]
    # The view (E, F, H) or (-1, F, H): its second size is each expert's rows.
    rows = flat.view_sizes[1] if len(flat.view_sizes) == 3 else ""
    held = keys.get(rows.removeprefix("self."), "")  # the key the view's rows hold (self.F, or a local F)
    width = next((f for f in factors if f and held and keys.get(f) == held), "")
    count = next((f for f in factors if f and f != width), "") if width else ""
    return keys.get(width, ""), keys.get(count, "")


def flat_activation(sources: dict[str, str], flat: FlattenedExperts, config: dict) -> tuple[str | None, str]:
    """(name, FILE:LINE: as written) of the activation the class declaring the flattened experts builds:
    `self.A = ACT2FN[name]`, the name a constant, a config key, or a local holding `config.K.get("name", d)` /
    `config.K["name"]` (DBRX's `act_fn_name = config.ffn_act_fn.get("name", "silu")`, its config the sub-config
    ffn_config), read from config.json. None where the code builds it otherwise."""
    found = _classes(sources).get(flat.cls)
    init = next((f for f in found[1].body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None) \
        if found else None
    if init is None:
        return None, ""
    reads = subconfig_reads(sources, config)
    own = dict(reads.receivers).get(flat.cls) if reads is not None else None
    scope = config.get(own, {}) if own else config
    local = {n.targets[0].id: n.value for n in subtree(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name)}
    for node in subtree(init):
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Subscript)
                and _dotted(node.value.value).rsplit(".", 1)[-1] == "ACT2FN"):
            continue
        where = f"{found[0]}:{node.lineno}: {ast.unparse(node)}"
        key = node.value.slice
        if isinstance(key, ast.Name) and key.id in local:
            key = local[key.id]
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value, where
        if isinstance(key, ast.Attribute) and _plain_config(key.value):
            value = scope.get(key.attr)
            return (value if isinstance(value, str) else None), where
        # config.K.get("name", default) / config.K["name"]
        if isinstance(key, ast.Call) and isinstance(key.func, ast.Attribute) and key.func.attr == "get":
            holder, args = key.func.value, key.args
        elif isinstance(key, ast.Subscript):
            holder, args = key.value, [key.slice]
        else:
            return None, where
        if not (isinstance(holder, ast.Attribute) and _plain_config(holder.value) and args
                and isinstance(args[0], ast.Constant)):
            return None, where
        table = scope.get(holder.attr)
        default = args[1].value if len(args) > 1 and isinstance(args[1], ast.Constant) else None
        value = table.get(args[0].value, default) if isinstance(table, dict) else None
        # The key named, so that verify counts it as read (the code reads nothing else of the table).
        where += f", the {args[0].value!r} of config.json {own + '.' if own else ''}{holder.attr}"
        return (value if isinstance(value, str) else None), where
    return None, ""
