"""Experts stored as one 3-D tensor per projection: what the experts' code computes with them.

transformers' fused-experts classes (GraniteMoE's, Mixtral's since v5) hold every expert's gate and up
projection in one parameter `gate_up_proj` [experts, 2 x width, hidden] and the down projection in
`down_proj` [experts, hidden, width]. Which half of `gate_up_proj` is the gate, and whether the code
multiplies by the stored matrix as [out, in] (F.linear) or [in, out] (torch.bmm, `@`), is read from the
class's methods, never guessed: a cut the port does not compute (interleaved gate/up columns other than
GPT-OSS's swigluoai, a clamped SwiGLU that is neither swigluoai nor HY-V4's silu(gate.clamp(max=L)) *
up.clamp(-L, L), both read by `gluformula`) is named in the refusal. Experts stored [in, out] (Aria's, Llama 4's `x @ self.down_proj[e]`)
are cut the same way with each expert's slice transposed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import gluformula
from scaffold.detect.sourcecode import _classes, subtree

LINEAR_CALLS = ("linear",)
MATMUL_CALLS = ("bmm", "matmul", "mm", "einsum", "baddbmm")


@dataclass(frozen=True)
class ExpertsCode:
    cls: str
    file: str
    gate_up: str  # the attribute holding gate and up
    down: str
    up_first: bool
    evidence: str  # FILE:LINE: what was read
    problem: str | None = None  # a computation the port does not express, named
    in_out: bool = False  # each expert's slice is multiplied as the right-hand matrix (x @ w[e]): [in, out]
    storage_evidence: str = ""  # FILE:LINE: how the code multiplies by the two tensors
    interleaved: bool = False  # gate and up alternate column by column (gate even, up odd)
    added: frozenset[str] = frozenset()  # parameters of the class the code adds (self.P_bias in `... + self.B[e]`)
    swigluoai: gluformula.SwigluOai | None = None  # the clamped SwiGLU vLLM's swigluoai computes, as read
    clamped_silu: gluformula.ClampedSilu | None = None  # silu(gate.clamp(max=L)) * up.clamp(-L, L), as read


def _self_attr(node: ast.AST, attrs: set[str]) -> str | None:
    """The attribute of `attrs` that `node` reads as self.X (anywhere inside it), if exactly one."""
    found = {n.attr for n in subtree(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
             and n.value.id == "self" and n.attr in attrs}
    return found.pop() if len(found) == 1 else None


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _parameters(cls: ast.ClassDef) -> set[str]:
    """self.X = nn.Parameter(...) in the class's __init__."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    out = set()
    for node in subtree(init) if init else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Call) and _callee(node.value) == "Parameter"):
            out.add(node.targets[0].attr)
    return out


def experts_code(sources: dict[str, str], attrs: tuple[str, str], config: dict | None = None) -> ExpertsCode | None:
    """How the class holding both 3-D parameters `attrs` computes with them; None when no class holds both.

    Raises ValueError with the reason when the code is found but does not say which half is the gate."""
    owner = next(((file, cls) for file, cls in _classes(sources).values() if set(attrs) <= _parameters(cls)), None)
    if owner is None:
        return None
    file, cls = owner
    wanted = set(attrs)
    derived = _derived(cls, wanted)  # (method, local) -> the 3-D parameter it was computed from
    uses: dict[str, set[str]] = {a: set() for a in attrs}  # attribute -> "linear" / "matmul" (line)
    splits, problems = [], []
    strided = []  # (first, second, parameter, line, function): `a, b = x[..., ::2], x[..., 1::2]`
    clamps = []
    products = []
    for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
        mine = {local: param for (method, local), param in derived.items() if method == func.name}
        for node in sorted((n for n in subtree(func) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Call):
                name = _callee(node)
                arg = node.args[1] if name in LINEAR_CALLS and len(node.args) > 1 else None
                if arg is not None and (attr := _self_attr(arg, wanted)):
                    uses[attr].add(f"linear:{node.lineno}")
                elif name in MATMUL_CALLS and (attr := _self_attr(node, wanted)):
                    uses[attr].add(_matmul_use(node, attr, name))
                if name in ("clamp", "clip"):
                    clamps.append(f"a clamped SwiGLU ({file}:{node.lineno}: {ast.unparse(node)[:60]})")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and (
                    attr := _self_attr(node, wanted)):
                uses[attr].add(_matmul_use(node, attr))
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                products.append(node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                source = _self_attr(value, wanted) or next(
                    (mine[n.id] for n in subtree(value) if isinstance(n, ast.Name) and n.id in mine), None)
                if isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(
                        isinstance(e, ast.Name) for e in target.elts):
                    if isinstance(value, ast.Call) and _callee(value) == "chunk" and value.args and isinstance(
                            value.args[0], ast.Constant) and value.args[0].value == 2 and source:
                        splits.append((target.elts[0].id, target.elts[1].id, source, node.lineno, func))
                    elif isinstance(value, ast.Tuple) and any(
                            isinstance(s, ast.Slice) and s.step is not None
                            for s in subtree(value)):
                        pair = _strided_pair(value)
                        if pair is None or not source:
                            problems.append(f"gate and up cut from the experts' output in a way the generator does "
                                            f"not read ({file}:{node.lineno}: {ast.unparse(node)[:70]})")
                        else:
                            names = [e.id for e in target.elts]
                            first, second = names if pair == (0, 1) else names[::-1]
                            strided.append((first, second, source, node.lineno, func))
    added = frozenset(n.attr for f in cls.body if isinstance(f, ast.FunctionDef) for b in subtree(f)
                      if isinstance(b, ast.BinOp) and isinstance(b.op, ast.Add)
                      for side in (b.left, b.right) for n in subtree(side)
                      if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                      and n.attr in _parameters(cls) - wanted)
    where = f"{file}:{cls.lineno}"
    if problems:
        return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where, problems[0])
    activation = None
    if clamps or strided:
        # A clamped SwiGLU (GPT-OSS's, MiniMax-M3's): the port computes it where it is vLLM's swigluoai.
        cut = strided or splits
        if len(cut) != 1:
            return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where, (clamps or [
                f"gate and up interleaved column by column ({file}:{strided[0][3]})"])[0])
        first, second, source, line, func = cut[0]
        values, down = _init_values(cls, config or {}), next(a for a in attrs if a != source)
        read = gluformula.read_swigluoai(func, first, second, values, down, file)
        if isinstance(read, str) and not strided:
            # HY-V4's: silu(gate.clamp(max=L)) * up.clamp(-L, L), no alpha and no +1, on halves.
            clamped = gluformula.read_clamped_silu(func, first, second, values, down, file)
            if not isinstance(clamped, str):
                read = clamped
            elif "does not follow" not in read:
                read = (f"{read}; nor is it silu(gate.clamp(max=L)) * up.clamp(-L, L): "
                        f"{clamped.split(': ', 1)[-1]}")
        if isinstance(read, str):
            return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where,
                               f"a clamped SwiGLU that is not vLLM's swigluoai: {read}")
        activation = read
        splits = [(first, second, source, line, func)]
    # How the code multiplies by each tensor: F.linear(x, w[e]) takes it [out, in]; x @ w[e] (torch.bmm(x, w),
    # torch.matmul(x, w)) as the right-hand matrix, [in, out]. Anything else (the tensor on the left, einsum,
    # the two tensors taken differently) is named, not guessed.
    kinds = {a: {u.split(":")[0] for u in used} for a, used in uses.items()}
    odd = sorted((a, u) for a, used in uses.items() for u in used if u.split(":")[0] not in ("linear", "right"))
    if odd:
        attr, use = odd[0]
        kind, line = use.split(":")
        what = ("multiplied as the left-hand matrix" if kind == "left"
                else f"multiplied through {kind}, whose operand order the generator does not read")
        return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where,
                           f"experts multiplied in an order the port does not cut (self.{attr} {what}, "
                           f"{file}:{line})")
    if any(len(k) != 1 for k in kinds.values()) or len(set().union(*kinds.values())) != 1:
        lines = ", ".join(f"self.{a}: {' and '.join(sorted(u))}" for a, u in sorted(uses.items()))
        return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where,
                           f"experts multiplied as F.linear weights ([out, in]) and as right-hand matrices ([in, out]) "
                           f"in one class, or not at all ({lines}, in {file})")
    in_out = kinds[attrs[0]] == {"right"}
    storage = (f"{file}:" + ", ".join(f"{min(int(u.split(':')[1]) for u in uses[a])}" for a in attrs)
               + (": x @ self.W[e] (the right-hand matrix), each expert stored [in, out]" if in_out
                  else ": F.linear(x, self.W[e]), each expert stored [out, in]"))
    if activation is not None:
        first, second, gate_up, line, _func = splits[0]
        down = next(a for a in attrs if a != gate_up)
        return ExpertsCode(cls.name, file, gate_up, down, False,
                           f"{file}:{line}: {first}, {second} = self.{gate_up}(...) "
                           f"{'even, odd columns' if strided else 'halves'}; {activation.evidence}",
                           in_out=in_out, storage_evidence=storage, interleaved=bool(strided),
                           swigluoai=activation if isinstance(activation, gluformula.SwigluOai) else None,
                           clamped_silu=activation if isinstance(activation, gluformula.ClampedSilu) else None,
                           added=added)
    if len(splits) != 1:
        raise ValueError(f"{cls.name} ({where}) cuts its projections into two halves {len(splits)} times "
                         "(one chunk(2) of the gate-and-up projection expected)")
    first, second, gate_up, line, _func = splits[0]
    gated = set()
    for node in products:
        for act, other in ((node.left, node.right), (node.right, node.left)):
            if (isinstance(act, ast.Call) and len(act.args) == 1 and isinstance(act.args[0], ast.Name)
                    and isinstance(other, ast.Name) and {act.args[0].id, other.id} == {first, second}):
                gated.add(act.args[0].id)
    if len(gated) != 1:
        raise ValueError(f"{cls.name} ({file}:{line}) cuts self.{gate_up} into {first}, {second}, but no one "
                         "product act(gate) * up of the two halves says which is the gate")
    down = next(a for a in attrs if a != gate_up)
    up_first = gated == {second}
    return ExpertsCode(cls.name, file, gate_up, down, up_first,
                       f"{file}:{line}: {first}, {second} = self.{gate_up}(...).chunk(2); the activation takes "
                       f"{gated.pop()}", in_out=in_out, storage_evidence=storage, added=added)


def _strided_pair(value: ast.Tuple) -> tuple[int, int] | None:
    """(0, 1) for `x[..., ::2], x[..., 1::2]` (the even columns first), (1, 0) for the odd ones first; None for
    any other pair of cuts."""
    if len(value.elts) != 2:
        return None
    starts = []
    for elt in value.elts:
        if not isinstance(elt, ast.Subscript):
            return None
        index = elt.slice.elts[-1] if isinstance(elt.slice, ast.Tuple) else elt.slice
        if not (isinstance(index, ast.Slice) and index.upper is None and isinstance(index.step, ast.Constant)
                and index.step.value == 2):
            return None
        if isinstance(elt.slice, ast.Tuple) and not all(
                isinstance(e, ast.Constant) and e.value is Ellipsis for e in elt.slice.elts[:-1]):
            return None
        start = 0 if index.lower is None else index.lower.value if isinstance(index.lower, ast.Constant) else None
        starts.append(start)
    if ast.unparse(value.elts[0].value) != ast.unparse(value.elts[1].value):
        return None
    return (0, 1) if starts == [0, 1] else (1, 0) if starts == [1, 0] else None


def _derived(cls: ast.ClassDef, wanted: set[str]) -> dict[tuple[str, str], str]:
    """(method, local name) -> the 3-D parameter it was computed from, across the class's methods: a local
    assigned from an expression reading self.P (or a derived local), and a method's parameter that a call
    `self.method(local)` hands a derived local (GPT-OSS computes its gate in `_apply_gate(gate_up)`)."""
    methods = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    out: dict[tuple[str, str], str] = {}
    for _ in range(3):
        for name, func in methods.items():
            for node in sorted((n for n in subtree(func) if isinstance(n, (ast.Assign, ast.Call))),
                               key=lambda n: (n.lineno, n.col_offset)):
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    source = _self_attr(node.value, wanted) or next(
                        (out[(name, n.id)] for n in subtree(node.value)
                         if isinstance(n, ast.Name) and (name, n.id) in out), None)
                    if source:
                        out[(name, node.targets[0].id)] = source
                elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                      and node.func.attr in methods):
                    params = [a.arg for a in methods[node.func.attr].args.args[1:]]
                    for arg, param in zip(node.args, params):
                        source = _self_attr(arg, wanted) or next(
                            (out[(name, n.id)] for n in subtree(arg) if isinstance(n, ast.Name) and (name, n.id) in out),
                            None)
                        if source:
                            out[(node.func.attr, param)] = source
    return out


def _init_values(cls: ast.ClassDef, config: dict) -> dict[str, tuple[float, str]]:
    """self.A -> (its value, where it comes from) for `self.A = config.KEY` (a number in config.json) or
    `self.A = NUMBER` in the class's __init__."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    out: dict[str, tuple[float, str]] = {}
    for node in subtree(init) if init else ():
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.targets[0].value, ast.Name) and node.targets[0].value.id == "self"):
            continue
        value = node.value
        if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "config"
                and isinstance(config.get(value.attr), (int, float)) and not isinstance(config.get(value.attr), bool)):
            out[node.targets[0].attr] = (float(config[value.attr]), f"config.{value.attr}")
        elif isinstance(value, ast.Constant) and isinstance(value.value, (int, float)):
            out[node.targets[0].attr] = (float(value.value), repr(value.value))
    return out


def _matmul_use(node: ast.AST, attr: str, name: str = "@") -> str:
    """"right:LINE" where the tensor (or a local computed from it) is the right-hand operand of `a @ b`,
    torch.bmm(a, b), torch.matmul(a, b), torch.mm(a, b); "left:LINE" where it is the left-hand one; else
    "NAME:LINE" (einsum, baddbmm: the operand order is not read)."""
    if isinstance(node, ast.BinOp):
        left, right = node.left, node.right
    elif name in ("bmm", "matmul", "mm") and len(node.args) == 2:
        left, right = node.args
    else:
        return f"{name}:{node.lineno}"

    def holds(side: ast.AST) -> bool:
        return any(isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
                   and n.attr == attr for n in subtree(side))
    if holds(right) and not holds(left):
        return f"right:{node.lineno}"
    if holds(left) and not holds(right):
        return f"left:{node.lineno}"
    return f"{name}:{node.lineno}"
