"""Experts kept as banks: modules of the MoE block each holding one projection of every expert as a 3-D `weight`
(JetMoE's JetMoeParallelExperts: input_linear [experts, 2 x width, hidden], output_linear [experts, hidden, width]),
run per expert by the bank's own forward, the block's forward cutting and activating between them.

The checkpoint's tensors are the same as GraniteMoE's (`mlp.input_linear.weight`), but the code differs: no
transformers renaming gives them the fused-experts names (`experts.gate_up_proj`) `stacked.experts_code` reads.
Read here from the block's code, into the same `stacked.ExpertsCode`:

- the bank each forward call runs: the first bank's output cut in two by `chunk(2, dim=-1)`, the activation applied
  to one half (the gate) and the product with the other half handed to the second bank (down);
- how the bank's class multiplies by its weight: `F.linear(x, self.weight[i])` ([out, in]) or `x @ self.weight[i]`
  ([in, out]);
- a bias of the block's own added to what it returns (`layer_output + self.bias`): `output_bias`.

Anything else the block's forward computes between them is not read: refused by name (`read` returns a problem).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect import dataflow, stacked
from scaffold.detect.blocks import _method, _parameters
from scaffold.detect.sourcecode import _classes, _dotted, subtree


@dataclass(frozen=True)
class Banks:
    code: stacked.ExpertsCode
    output_bias: str | None  # the block's parameter added to its output (bias), or None
    bias_evidence: str
    activation: str  # "config.K" (self.act = ACT2FN[config.K]) or the function the block calls (silu)


def block_class(sources: dict[str, str], layers_attr: str, mlp: str) -> tuple[str, ast.ClassDef] | None:
    """The class the decoder layer builds as self.<mlp> (file, class)."""
    layer = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    if layer is None:
        return None
    init = _method(layer[1], "__init__")
    built = next((n.value for n in subtree(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and _dotted(n.targets[0]) == f"self.{mlp}" and isinstance(n.value, ast.Call)), None) if init else None
    name = _dotted(built.func).rsplit(".", 1)[-1] if built is not None else None
    return _classes(sources).get(name) if name else None


def _built(init: ast.FunctionDef | None) -> dict[str, str]:
    out = {}
    for n in subtree(init) if init is not None else ():
        if (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Attribute)
                and _dotted(n.targets[0].value) == "self" and isinstance(n.value, ast.Call)):
            out.setdefault(n.targets[0].attr, _dotted(n.value.func).rsplit(".", 1)[-1])
    return out


def _storage(cls: ast.ClassDef) -> tuple[bool, str] | None:
    """(in_out, how) from the bank class's forward: F.linear(x, self.weight[...]) is [out, in]; x @ self.weight[...]
    or matmul(x, self.weight[...]) is [in, out]; None where it does neither."""
    forward = _method(cls, "forward")
    params = _parameters(cls)
    for n in subtree(forward) if forward is not None else ():
        if isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == "linear" and len(n.args) == 2 \
                and isinstance(n.args[1], ast.Subscript) and _dotted(n.args[1].value) in {f"self.{p}" for p in params}:
            return False, f"line {n.lineno}: {ast.unparse(n)}"
        right = n.right if isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) else \
            n.args[1] if isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == "matmul" \
            and len(n.args) == 2 else None
        if isinstance(right, ast.Subscript) and _dotted(right.value) in {f"self.{p}" for p in params}:
            return True, f"line {n.lineno}: {ast.unparse(n)}"
    return None


def read(sources: dict[str, str], layers_attr: str, mlp: str, held: dict[str, list[int]]) -> Banks | str | None:
    """The block's banks, where its modules named in `held` (attribute -> the 3-D shape of its weight) are run as
    expert banks; a str naming what the code computes otherwise; None where no block class is found."""
    found = block_class(sources, layers_attr, mlp)
    if found is None:
        return None
    file, cls = found
    built = _built(_method(cls, "__init__"))
    classes = _classes(sources)
    forward = _method(cls, "forward")
    if forward is None or not set(held) <= set(built):
        return None
    order = []  # (bank attribute, the local its output is bound to, line)
    for stmt in (s for s in subtree(forward) if isinstance(s, ast.Assign)):
        call = stmt.value
        if isinstance(call, ast.Call) and _dotted(call.func) in {f"self.{a}" for a in held} \
                and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            order.append((_dotted(call.func)[5:], stmt.targets[0].id, stmt))
    where = f"{file}:{forward.lineno}"
    if len(order) != 2:
        return f"{cls.name}.forward ({where}) does not run its two expert banks ({', '.join(held)}) once each"
    (first, out1, _s1), (second, _out2, s2) = order
    # first's output cut in two, one half activated, times the other, into second.
    halves = next((s for s in subtree(forward) if isinstance(s, ast.Assign) and len(s.targets) == 1
                   and isinstance(s.value, ast.Call) and _dotted(s.value.func) == f"{out1}.chunk" and s.value.args
                   and isinstance(s.value.args[0], ast.Constant) and s.value.args[0].value == 2
                   and _last_dim(s.value)), None)
    if halves is None:
        return f"{cls.name}.forward ({where}) does not cut {first}'s output in two along its last dim with chunk(2)"
    target = halves.targets[0]
    if isinstance(target, ast.Name):  # h = x.chunk(2, dim=-1): h[0], h[1]
        half = {f"{target.id}[{i}]": i for i in (0, 1)}
    elif isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(e, ast.Name) for e in target.elts):
        half = {target.elts[0].id: 0, target.elts[1].id: 1}  # g, u = x.chunk(2, dim=-1)
    else:
        half = {}
    gate = None
    for n in subtree(forward):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
            for act, other in ((n.left, n.right), (n.right, n.left)):
                if (isinstance(act, ast.Call) and len(act.args) == 1 and ast.unparse(act.args[0]) in half
                        and ast.unparse(other) in half
                        and {half[ast.unparse(act.args[0])], half[ast.unparse(other)]} == {0, 1}):
                    gate = (half[ast.unparse(act.args[0])], n)
    if gate is None:
        return (f"{cls.name}.forward ({where}) does not multiply an activation of one half of {first}'s output by "
                "the other")
    activation = _activation(cls, gate[1])
    if activation is None:
        return (f"{cls.name}.forward ({file}:{gate[1].lineno}) activates the gate half with a function read neither "
                "from a table by a config key (ACT2FN[config.K]) nor by its name")
    storages = {a: _storage(classes[built[a]][1]) if built[a] in classes else None for a in (first, second)}
    if None in storages.values() or storages[first][0] != storages[second][0]:
        return (f"the expert banks' class ({', '.join(sorted({built[a] for a in held}))}) multiplies by its weight "
                "neither as F.linear(x, self.weight[e]) nor as x @ self.weight[e], alike in both banks")
    in_out, how = storages[first]
    evidence = (f"{file}:{gate[1].lineno}: {cls.name}.forward cuts self.{first}'s output by chunk(2) and "
                f"computes {ast.unparse(gate[1])} into self.{second} (line {s2.lineno})")
    code = stacked.ExpertsCode(cls.name, file, first, second, up_first=gate[0] == 1, evidence=evidence,
                               in_out=in_out, storage_evidence=f"{classes[built[first]][0]}: {built[first]}.forward "
                                                                f"{how}")
    params = _parameters(cls)
    added = [n for n in subtree(forward) if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)
             and any(_dotted(side) in {f"self.{p}" for p in params} for side in (n.left, n.right))]
    bias = next((_dotted(side)[5:] for n in added for side in (n.left, n.right)
                 if _dotted(side).startswith("self.")), None)
    if len(added) > 1:
        return f"{cls.name}.forward ({where}) adds {len(added)} parameters of its own"
    if added:
        # Added to what the block returns: the statement's result is returned, reshaped at most.
        stmts = [s for s in forward.body]
        at = next(i for i, s in enumerate(stmts) if added[0] in subtree(s))
        target = stmts[at].targets[0].id if isinstance(stmts[at], ast.Assign) and isinstance(
            stmts[at].targets[0], ast.Name) else None
        rest = stmts[at + 1:]
        returned = isinstance(stmts[at], ast.Return) or (
            target is not None and len(rest) == 1 and isinstance(rest[0], ast.Return)
            and _reshaped(rest[0].value, target))
        if not returned:
            return (f"{cls.name}.forward ({file}:{added[0].lineno}) adds self.{bias} ({ast.unparse(added[0])}) "
                    "elsewhere than to what it returns")
    bias_evidence = f"{file}:{added[0].lineno}: {cls.name}.forward returns {ast.unparse(added[0])}" if added else ""
    return Banks(code, bias, bias_evidence, activation)


def _reshaped(node: ast.AST | None, name: str) -> bool:
    """`name`, or `name.view(...)` / `.reshape(...)` of it (its values as they are)."""
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("view",
                                                                                                   "reshape"):
        node = node.func.value
    return isinstance(node, ast.Name) and node.id == name


def _last_dim(call: ast.Call) -> bool:
    """chunk(2, dim=-1) or chunk(2, -1) (the rows of each expert's output, as FusedMoE cuts w13)."""
    dims = [k.value for k in call.keywords if k.arg == "dim"] + call.args[1:2]
    return bool(dims) and ast.unparse(dims[0]) == "-1"


def _activation(cls: ast.ClassDef, product: ast.BinOp) -> str | None:
    """What the activated half goes through: "config.K" where the block calls self.A built as ACT2FN[config.K] (a
    table indexed by a config key), or the function's own name (F.silu -> "silu")."""
    act = next(side for side in (product.left, product.right) if isinstance(side, ast.Call))
    called = _dotted(act.func)
    if not called.startswith("self."):
        return called.rsplit(".", 1)[-1] or None
    init = _method(cls, "__init__")
    built = next((n.value for n in subtree(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and _dotted(n.targets[0]) == called), None) if init is not None else None
    if isinstance(built, ast.Subscript) and isinstance(built.slice, ast.Attribute) \
            and _dotted(built.slice.value) in ("config", "self.config"):
        return f"config.{built.slice.attr}"
    return None
