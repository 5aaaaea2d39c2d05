"""How a mixture-of-experts block turns router logits into routing weights, read from the code.

The port routes with vLLM's FusedMoE: softmax over the router logits, the top k, optionally renormalized
(Qwen-MoE, Mixtral; top-k then softmax is the same computation). A lab's block can route otherwise: PhiMoE's
`sparsemixer` (masked softmaxes, no top-k), sigmoid scores with a correction bias (DeepSeek-V3), group-limited
top-k. Served through FusedMoE's softmax top-k those ports would be silently wrong, so a routing path that does
not take a top-k of softmax scores is refused, naming the code that computes it.

The routing path is the forward of the block that owns the experts and the router, the forward of the router's
own class, and the module-level functions they call (followed a few calls deep), all read with `ast`.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.sourcecode import _classes, _dotted, _parsed

MAX_DEPTH = 3


@dataclass(frozen=True)
class Routing:
    block: str  # the class that owns the experts and the router
    where: str  # file:line of that class
    calls: frozenset[str]  # last components of every call on the routing path
    helpers: tuple[str, ...]  # module-level functions of the source the path calls, as "name (file:line)"

    @property
    def standard(self) -> bool:
        return "topk" in self.calls and "softmax" in self.calls

    def problem(self) -> str | None:
        """Why FusedMoE's softmax top-k routing would not compute this block's, or None."""
        if self.standard:
            return None
        via = f" in {', '.join(self.helpers)}" if self.helpers else ""
        if "topk" not in self.calls:
            return (f"{self.block} ({self.where}) computes its routing weights{via} without a top-k of the router "
                    "scores, a routing the port's FusedMoE (softmax, top-k) does not compute")
        return (f"{self.block} ({self.where}) scores the experts{via} without a softmax"
                f"{' (sigmoid scores)' if 'sigmoid' in self.calls else ''}, a routing the port's FusedMoE "
                "(softmax, top-k) does not compute")


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _assigned_classes(init: ast.FunctionDef | None) -> dict[str, str]:
    """`self.X = Class(...)` of an __init__, as {X: last component of Class}."""
    out: dict[str, str] = {}
    for stmt in ast.walk(init) if init else ():
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self" and isinstance(stmt.value, ast.Call)):
            out[stmt.targets[0].attr] = _dotted(stmt.value.func).rsplit(".", 1)[-1]
    return out


def routing(sources: dict[str, str], experts: str) -> Routing | None:
    """The routing path of the class whose __init__ builds `self.<experts>`: its forward and the forwards of the
    other modules it builds from classes of the source (the router, whatever the code calls it: checkpoints saved
    in a legacy layout name it differently). None when the code has no such class."""
    classes = _classes(sources)
    functions = {node.name: (file, node) for file, tree in _parsed(sources) for node in tree.body
                 if isinstance(node, ast.FunctionDef)}
    for name, (file, cls) in classes.items():
        assigned = _assigned_classes(_method(cls, "__init__"))
        if experts not in assigned:
            continue
        forward = _method(cls, "forward")
        if forward is None:
            return None
        # (function body, the class whose `self.method(...)` calls it may make)
        frontier = [(forward, cls)]
        for attr, sub in assigned.items():
            if attr != experts and sub in classes and sub != name and _method(classes[sub][1], "forward"):
                frontier.append((_method(classes[sub][1], "forward"), classes[sub][1]))
        calls: set[str] = set()
        helpers: list[str] = []
        seen = {id(body) for body, _ in frontier}
        for _ in range(MAX_DEPTH):
            following = []
            for body, owner in frontier:
                for node in ast.walk(body):
                    if not isinstance(node, ast.Call):
                        continue
                    short = _dotted(node.func).rsplit(".", 1)[-1]
                    calls.add(short)
                    target = None
                    if isinstance(node.func, ast.Name) and short in functions:
                        f_file, target = functions[short]
                        helpers.append(f"{short} ({f_file}:{target.lineno})")
                    elif owner is not None and _dotted(node.func) == f"self.{short}":
                        target = _method(owner, short)  # the class's own method (a router's get_topk_indices)
                    if target is not None and id(target) not in seen:
                        seen.add(id(target))
                        following.append((target, owner if target in owner.body else None))
            frontier = following
        helpers = list(dict.fromkeys(helpers))
        return Routing(name, f"{file}:{cls.lineno}", frozenset(calls), tuple(helpers))
    return None
