"""Attention temperature tuning read from the code: the queries scaled by a function of each token's position
before the scores, and the layers it applies to.

Llama 4 scales the queries of its NoPE layers (https://arxiv.org/abs/2501.19399):

    if self.attn_temperature_tuning and not self.use_rope:
        positions = torch.arange(...) + past_seen_tokens
        attn_scales = torch.log1p(torch.floor((positions.float() + 1.0) / self.floor_scale)) * self.attn_scale + 1.0
        query_states = (query_states * attn_scales...).to(query_states.dtype)

which vLLM's llama4.py computes as `log(floor((positions + 1) / floor_scale) + 1) * attn_scale + 1`. A lab may write
the same function otherwise (log of 1 + x, another operand order, its own names). So the scale is not matched as
text: the statements that compute it are interpreted over numbers (+ - * /, floor, log, log1p, casts and
reshapes, numbers, `self.A` read from __init__ as `self.A = config.KEY` or a number), at sample positions and
sample values of the config keys it reads, and compared with vLLM's function; which key is the floor scale and
which the scale is the assignment of the keys that reproduces it. The layers: where the guard around the
product holds, as config.json decides it, and `not` the rotary embedding's own condition (the NoPE layers).
Anything else is refused by name, not guessed.
"""

from __future__ import annotations

import ast
import itertools
import math
from dataclasses import dataclass

from scaffold.detect.sourcecode import _dotted, subtree

POSITIONS = list(range(64)) + [100, 1000, 8191, 8192, 20000]
# Sample values of (floor_scale, attn_scale) the keys take in turn: floors small enough that the positions cross them.
TRIALS = ((4.0, 0.1), (7.0, 0.35), (3.0, 1.5))


@dataclass(frozen=True)
class Temperature:
    floor_key: str
    scale_key: str
    nope_only: bool  # only where the rotary embedding does not run
    switch: str | None  # the config key switching it on, where one does
    evidence: str


class Refused(Exception):
    pass


class _Unknown(Exception):
    pass


def vllm_scale(position: float, floor_scale: float, attn_scale: float) -> float:
    """vLLM's Llama4Attention._get_attn_scale."""
    return math.log(math.floor((position + 1.0) / floor_scale) + 1.0) * attn_scale + 1.0


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


class _Eval:
    def __init__(self, env: dict, attrs: dict):
        self.env, self.attrs = env, attrs

    def __call__(self, node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in self.env:
            return self.env[node.id]
        if isinstance(node, ast.Attribute) and _dotted(node.value) == "self" and node.attr in self.attrs:
            return self.attrs[node.attr]
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = self(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Subscript):  # a reshape by indexing (t[None, :, None]): the same values
            return self(node.value)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv)):
            a, b = self(node.left), self(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv)) and b == 0:
                raise _Unknown(ast.unparse(node))
            return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.Div: a / b if b else 0.0,
                    ast.FloorDiv: math.floor(a / b) if b else 0.0}[type(node.op)]
        if isinstance(node, ast.Call):
            name = _name(node)
            receiver = node.func.value if isinstance(node.func, ast.Attribute) and _dotted(node.func.value) not in (
                "torch", "math", "np", "F") else None
            args = ([receiver] if receiver is not None else []) + list(node.args)
            if name in ("float", "double", "to", "type_as", "view", "reshape", "expand", "unsqueeze", "contiguous",
                        "tensor", "as_tensor") and args:
                return self(args[0])
            if name in ("floor", "log", "log1p") and len(args) == 1:
                x = self(args[0])
                if name == "floor":
                    return float(math.floor(x))
                if x + (name == "log1p") <= 0:
                    raise _Unknown(ast.unparse(node))
                return math.log1p(x) if name == "log1p" else math.log(x)
        raise _Unknown(ast.unparse(node)[:60])


def _assigned(func: ast.FunctionDef) -> dict[str, ast.AST]:
    return {_dotted(n.targets[0])[5:]: n.value for n in subtree(func) if isinstance(n, ast.Assign)
            and len(n.targets) == 1 and _dotted(n.targets[0]).startswith("self.")}


def _config_key(node: ast.AST) -> str | None:
    parts = _dotted(node).split(".")
    if len(parts) == 2 and parts[0] == "config" or len(parts) == 3 and parts[:2] == ["self", "config"]:
        return parts[-1]
    return None


def read_temperature(cls: ast.ClassDef, file: str, query_proj: str, config: dict, rotary_guard: str | None
                     ) -> Temperature | None:
    """The temperature tuning of the attention class `cls` (its queries from self.<query_proj>), or None where its
    forward scales no query by a function of positions. Raises Refused where it does, otherwise than vLLM's."""
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if forward is None:
        return None
    statements = sorted((n for n in subtree(forward) if isinstance(n, ast.Assign) and len(n.targets) == 1
                         and isinstance(n.targets[0], ast.Name)), key=lambda n: n.lineno)
    queries: set[str] = set()
    positions: set[str] = set()
    for stmt in statements:
        calls = {_dotted(c.func) for c in subtree(stmt.value) if isinstance(c, ast.Call)}
        if f"self.{query_proj}" in calls:
            queries.add(stmt.targets[0].id)
        if any(c.rsplit(".", 1)[-1] == "arange" for c in calls):
            positions.add(stmt.targets[0].id)
    for stmt in statements:
        target = stmt.targets[0].id
        if target not in queries:
            continue
        names = {n.id for n in subtree(stmt.value) if isinstance(n, ast.Name)}
        products = [n for n in subtree(stmt.value) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult)]
        for product in products:
            sides = [s for s in (product.left, product.right)
                     if not ({n.id for n in subtree(s) if isinstance(n, ast.Name)} & queries)]
            if len(sides) != 1 or not names & queries:
                continue
            factor = sides[0]
            depends = _depends(factor, statements, stmt.lineno)
            if not depends & positions:
                continue
            return _read(cls, init, forward, file, stmt, factor, statements, positions, config, rotary_guard)
    return None


def _depends(node: ast.AST, statements: list[ast.Assign], before: int) -> set[str]:
    """The names `node` reads, and those they were assigned from before line `before`, transitively."""
    out: set[str] = set()
    todo = [n.id for n in subtree(node) if isinstance(n, ast.Name)]
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        for stmt in statements:
            if stmt.lineno < before and stmt.targets[0].id == name:
                todo += [n.id for n in subtree(stmt.value) if isinstance(n, ast.Name)]
    return out


def _read(cls, init, forward, file, product_stmt, factor, statements, positions, config, rotary_guard):
    where = f"{file}:{product_stmt.lineno}"
    attrs = _assigned(init) if init is not None else {}
    keys = {a: k for a, v in attrs.items() if (k := _config_key(v)) is not None}
    numbers = {a: float(v.value) for a, v in attrs.items()
               if isinstance(v, ast.Constant) and isinstance(v.value, (int, float)) and not isinstance(v.value, bool)}
    steps = [s for s in statements if s.lineno < product_stmt.lineno and s.targets[0].id not in positions]
    read = sorted({n.attr for s in [*steps, factor] for n in subtree(s)
                   if isinstance(n, ast.Attribute) and _dotted(n.value) == "self" and n.attr in keys})
    if len(read) != 2:
        raise Refused(f"queries scaled by a function of the positions ({where}) that reads {len(read)} config "
                      f"value(s) ({', '.join(read) or 'none'}), where vLLM's temperature tuning reads a floor scale "
                      "and a scale")

    def value(floor_attr: str, floor_scale: float, attn_scale: float, position: int) -> float:
        env = {p: float(position) for p in positions}
        evaluate = _Eval(env, {**numbers, floor_attr: floor_scale, **{a: attn_scale for a in read if a != floor_attr}})
        for stmt in steps:
            try:
                env[stmt.targets[0].id] = evaluate(stmt.value)
            except _Unknown:
                continue  # a value the scale does not read (the projections' outputs); what it reads must evaluate
        return evaluate(factor)

    for floor_attr in read:
        try:
            worst = max(abs(value(floor_attr, f, a, p) - vllm_scale(p, f, a))
                        for (f, a), p in itertools.product(TRIALS, POSITIONS))
        except _Unknown as exc:
            raise Refused(f"queries scaled by a function of the positions ({where}) that computes {exc}, which the "
                          "formula reader does not follow") from None
        if worst < 1e-9:
            scale_attr = next(a for a in read if a != floor_attr)
            nope_only, switch = _layers(forward, product_stmt, attrs, config, rotary_guard, file)
            return Temperature(keys[floor_attr], keys[scale_attr], nope_only, switch,
                               f"{where}: queries scaled by log(floor((position + 1) / config.{keys[floor_attr]}) "
                               f"+ 1) * config.{keys[scale_attr]} + 1")
    raise Refused(f"queries scaled by a function of the positions ({where}: {ast.unparse(factor)[:60]}) that is not "
                  "vLLM's temperature tuning (log(floor((position + 1) / floor_scale) + 1) * attn_scale + 1)")


def _layers(forward, product_stmt, attrs, config, rotary_guard, file) -> tuple[bool, str | None]:
    """(only where the rotary embedding does not run, the config switch) from the guards around the product."""
    guards = [n.test for n in subtree(forward) if isinstance(n, ast.If)
              and any(s is product_stmt for b in n.body for s in subtree(b))]
    conjuncts = [c for g in guards for c in (g.values if isinstance(g, ast.BoolOp) and isinstance(g.op, ast.And)
                                              else [g])]
    nope_only, switch = False, None
    for test in conjuncts:
        negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
        inner = test.operand if negated else test
        name = _dotted(inner)
        resolved = attrs.get(name[5:]) if name.startswith("self.") and name.count(".") == 1 else inner
        key = _config_key(resolved) if resolved is not None else None
        if key is not None and isinstance(config.get(key), bool) and not negated:
            switch = key
            continue
        if negated and rotary_guard and resolved is not None and ast.unparse(resolved) == rotary_guard:
            nope_only = True
            continue
        raise Refused(f"queries scaled by a function of the positions under a condition the config does not "
                      f"decide ({file}:{test.lineno}: `{ast.unparse(test)}`)")
    return nope_only, switch
