"""Several copies of the residual stream handed through the decoder layers (Gemma-3n's alternating updates, AltUp):
the tensor the model's forward hands its first decoder layer is built by stacking several tensors along a new axis
(`torch.stack([h0, proj_1(h0), ...])`, or one tensor unsqueezed and expanded / repeated into copies), and every
layer takes that stack and returns it. The port's decoder layers carry one residual stream of hidden_size per
token, so such a model is refused by name (scaffold.detect.policy), before the forms a layer computes on one copy
(per-layer inputs, norms) are read.

Read from what the forward computes, not from names: the loop over the layer list, the value its layer call takes
as the hidden states, followed back through the forward's assignments to a stack or an expansion; the count of
copies from the loop or list that builds the stacked list, the reduction after the layers (a mean or sum over the
copies' axis) where the code has one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import layerinputs
from scaffold.detect.sourcecode import _dotted, subtree

STACKS = ("stack",)  # torch.stack(list, dim=0): a new axis of copies
EXPANSIONS = ("expand", "repeat", "expand_as")  # x.unsqueeze(k).expand(n, ...): copies of one tensor
REDUCTIONS = ("mean", "sum")
MAX_FOLLOW = 8  # assignments followed back from the layer call's argument


@dataclass(frozen=True)
class Streams:
    """Where the model's forward stacks copies of the residual stream for its layers."""

    model_cls: str
    where: str  # file:line of the stack or expansion
    code: str  # that statement, shortened
    copies: str | None  # the count: a config expression or a number, where the code says it
    merged: str | None  # file:line and code of the reduction over the copies after the layers, if any
    expanded: bool = False  # copies of one tensor (hyper-connections' streams), not a stack of several

    def __str__(self) -> str:
        count = f"{self.copies} " if self.copies else "several "
        if self.expanded:
            what = (f"hyper-connections: {self.model_cls}.forward expands the hidden states into {count}residual "
                    "streams")
        else:
            what = (f"alternating updates (AltUp): {self.model_cls}.forward stacks {count}copies of the residual "
                    "stream")
        merged = f", and reduces them to one after the last layer ({self.merged})" if self.merged else ""
        return (f"{what}, which every decoder layer takes and returns ({self.where}: {self.code}){merged}; the port's "
                "decoder layers carry one residual stream of hidden_size per token")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _short(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 100 else text[:97] + "..."


def _layer_loop(forward: ast.FunctionDef, stack: str) -> tuple[ast.For, ast.Call] | None:
    """The loop over self.<stack> and the layer call in it."""
    for loop in subtree(forward):
        if not isinstance(loop, ast.For) or not any(
                isinstance(n, ast.Attribute) and n.attr == stack and _dotted(n.value) == "self"
                for n in ast.walk(loop.iter)):
            continue
        names = {n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)}
        for node in (n for stmt in loop.body for n in ast.walk(stmt)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if (isinstance(func, ast.Name) and func.id in names) or (
                    isinstance(func, ast.Subscript) and isinstance(func.value, ast.Attribute)
                    and func.value.attr == stack and _dotted(func.value.value) == "self"):
                return loop, node
    return None


def _hidden_argument(call: ast.Call) -> str | None:
    """The name the layer call hands as its hidden states: its first positional argument, else the keyword
    hidden_states / x / h."""
    if call.args and isinstance(call.args[0], ast.Name):
        return call.args[0].id
    for keyword in call.keywords:
        if keyword.arg in ("hidden_states", "x", "h", "hidden") and isinstance(keyword.value, ast.Name):
            return keyword.value.id
    return None


def _assignments(forward: ast.FunctionDef, before: int) -> dict[str, ast.Assign]:
    """name -> the last plain assignment to it above line `before` (outside the layer loop)."""
    out: dict[str, ast.Assign] = {}
    for node in sorted((n for n in subtree(forward) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if node.lineno >= before:
            break
        for target in node.targets:
            if isinstance(target, ast.Name):
                out[target.id] = node
    return out


def _copies_of(value: ast.AST) -> ast.Call | None:
    """The stack or expansion that makes copies in `value`, if any."""
    for node in ast.walk(value):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func).rsplit(".", 1)[-1]
        if name in STACKS and node.args:
            return node
        if name in EXPANSIONS and isinstance(node.func, ast.Attribute) and any(
                isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == "unsqueeze"
                for n in ast.walk(node.func.value)):
            return node
    return None


def _count(forward: ast.FunctionDef, made: ast.Call) -> str | None:
    """How many copies: a stacked list literal's length; a list built as [first] then appended to in
    `for i in range(1, N)` (N copies); an expansion's / repeat's size on the new axis."""
    name = _dotted(made.func).rsplit(".", 1)[-1]
    if name in EXPANSIONS:  # the size at the axis unsqueeze inserted: x.unsqueeze(2).expand(-1, -1, N, -1)
        axis = next((n.args[0].value for n in ast.walk(made.func.value) if isinstance(n, ast.Call)
                     and _dotted(n.func).rsplit(".", 1)[-1] == "unsqueeze" and n.args
                     and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, int)), None)
        sizes = made.args
        if axis is None or axis < 0 or axis >= len(sizes) or any(isinstance(a, ast.Starred) for a in sizes):
            return None
        return _short(sizes[axis])
    listed = made.args[0]
    if isinstance(listed, (ast.List, ast.Tuple)) and not any(isinstance(e, ast.Starred) for e in listed.elts):
        return str(len(listed.elts))
    if not isinstance(listed, ast.Name):
        return None
    start = next((n for n in subtree(forward) if isinstance(n, ast.Assign) and n.lineno < made.lineno
                  and any(isinstance(t, ast.Name) and t.id == listed.id for t in n.targets)
                  and isinstance(n.value, ast.List)), None)
    for loop in subtree(forward):
        if not (isinstance(loop, ast.For) and loop.lineno < made.lineno and isinstance(loop.iter, ast.Call)
                and _dotted(loop.iter.func) == "range" and len(loop.iter.args) == 2
                and isinstance(loop.iter.args[0], ast.Constant) and start is not None
                and loop.iter.args[0].value == len(start.value.elts)):
            continue
        appends = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append"
                      and _dotted(n.func.value) == listed.id for n in ast.walk(loop))
        if appends:
            return _short(loop.iter.args[1])
    return None


def _reduction(forward: ast.FunctionDef, after: int) -> str | None:
    """`line: code` of the first mean / sum over axis 0 below line `after` (the stack's axis; hyper-connections
    merge theirs with a module of their own, which this does not name)."""
    for node in sorted((n for n in subtree(forward) if isinstance(n, ast.Call) and n.lineno > after),
                       key=lambda n: n.lineno):
        if _dotted(node.func).rsplit(".", 1)[-1] not in REDUCTIONS:
            continue
        dims = [k.value for k in node.keywords if k.arg in ("dim", "axis")]
        args = node.args[1:] if isinstance(node.func, ast.Attribute) and _dotted(node.func.value) == "torch" \
            else node.args
        dims += args[:1]
        if any(isinstance(d, ast.Constant) and d.value == 0 for d in dims):
            return f"{node.lineno}: {_short(node)}"
    return None


def read(sources: dict) -> Streams | None:
    """The copies of the residual stream the model's forward hands its decoder layers; None where it hands them one
    stream (or the reader does not find the layer loop)."""
    for file, owner, stack in layerinputs._stack_owners(sources):
        forward = _method(owner, "forward")
        found = _layer_loop(forward, stack) if forward is not None else None
        if found is None:
            continue
        loop, call = found
        name = _hidden_argument(call)
        assigned = _assignments(forward, loop.lineno)
        seen = 0
        while name is not None and name in assigned and seen < MAX_FOLLOW:
            seen += 1
            value = assigned[name].value
            made = _copies_of(value)
            if made is not None:
                merged = _reduction(forward, max(n.lineno for n in ast.walk(loop) if hasattr(n, "lineno")))
                return Streams(owner.name, f"{file}:{assigned[name].lineno}", _short(assigned[name]),
                               _count(forward, made), f"{file}:{merged}" if merged else None,
                               _dotted(made.func).rsplit(".", 1)[-1] in EXPANSIONS)
            name = value.id if isinstance(value, ast.Name) else None
    return None
