"""Experts stored as one 3-D tensor per projection: what the experts' code computes with them.

transformers' fused-experts classes (GraniteMoE's, Mixtral's since v5) hold every expert's gate and up
projection in one parameter `gate_up_proj` [experts, 2 x width, hidden] and the down projection in
`down_proj` [experts, hidden, width]. Which half of `gate_up_proj` is the gate, and whether the code
multiplies by the stored matrix as [out, in] (F.linear) or [in, out] (torch.bmm, `@`), is read from the
class's methods, never guessed: a cut the port's FusedMoE does not compute (interleaved gate/up columns,
a clamped SwiGLU) is named in the refusal.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

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


def experts_code(sources: dict[str, str], attrs: tuple[str, str]) -> ExpertsCode | None:
    """How the class holding both 3-D parameters `attrs` computes with them; None when no class holds both.

    Raises ValueError with the reason when the code is found but does not say which half is the gate."""
    owner = next(((file, cls) for file, cls in _classes(sources).values() if set(attrs) <= _parameters(cls)), None)
    if owner is None:
        return None
    file, cls = owner
    wanted = set(attrs)
    derived: dict[str, str] = {}  # local variable -> the 3-D parameter it was computed from
    uses: dict[str, set[str]] = {a: set() for a in attrs}  # attribute -> "linear" / "matmul" (line)
    splits, problems = [], []
    products = []
    for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
        for node in sorted((n for n in subtree(func) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset)):
            if isinstance(node, ast.Call):
                name = _callee(node)
                arg = node.args[1] if name in LINEAR_CALLS and len(node.args) > 1 else None
                if arg is not None and (attr := _self_attr(arg, wanted)):
                    uses[attr].add(f"linear:{node.lineno}")
                elif name in MATMUL_CALLS and (attr := _self_attr(node, wanted)):
                    uses[attr].add(f"matmul:{node.lineno}")
                if name == "clamp":
                    problems.append(f"a clamped SwiGLU ({file}:{node.lineno}: {ast.unparse(node)[:60]})")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult) and (
                    attr := _self_attr(node, wanted)):
                uses[attr].add(f"matmul:{node.lineno}")
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
                products.append(node)
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
                source = _self_attr(value, wanted) or next(
                    (derived[n.id] for n in subtree(value) if isinstance(n, ast.Name) and n.id in derived), None)
                if isinstance(target, ast.Name) and source:
                    derived[target.id] = source
                if isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(
                        isinstance(e, ast.Name) for e in target.elts):
                    if isinstance(value, ast.Call) and _callee(value) == "chunk" and value.args and isinstance(
                            value.args[0], ast.Constant) and value.args[0].value == 2 and source:
                        splits.append((target.elts[0].id, target.elts[1].id, source, node.lineno))
                    elif isinstance(value, ast.Tuple) and any(
                            isinstance(s, ast.Slice) and s.step is not None
                            for s in subtree(value)):
                        problems.append(f"gate and up interleaved column by column ({file}:{node.lineno}: "
                                        f"{ast.unparse(node)[:70]})")
    where = f"{file}:{cls.lineno}"
    if problems:
        return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where, problems[0])
    transposed = sorted(a for a, u in uses.items() if any(x.startswith("matmul") for x in u))
    if transposed:
        line = min(int(x.split(":")[1]) for x in uses[transposed[0]] if x.startswith("matmul"))
        return ExpertsCode(cls.name, file, attrs[0], attrs[1], False, where,
                           f"experts stored [in, out] (self.{transposed[0]} multiplied as the right-hand matrix, "
                           f"{file}:{line})")
    if len(splits) != 1:
        raise ValueError(f"{cls.name} ({where}) cuts its projections into two halves {len(splits)} times "
                         "(one chunk(2) of the gate-and-up projection expected)")
    first, second, gate_up, line = splits[0]
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
    if not any(u.startswith("linear") for u in uses[gate_up]) or not any(u.startswith("linear") for u in uses[down]):
        raise ValueError(f"{cls.name} ({where}) does not apply self.{gate_up} and self.{down} as F.linear weights")
    up_first = gated == {second}
    return ExpertsCode(cls.name, file, gate_up, down, up_first,
                       f"{file}:{line}: {first}, {second} = self.{gate_up}(...).chunk(2); the activation takes "
                       f"{gated.pop()}")
