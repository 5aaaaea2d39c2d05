"""Keys and values fused in one projection beside a projection of the queries alone (qkv_layout "kv_pairs",
TeleChat's `query` and `key_value`), read from the attention's code.

The form: the attention's forward views the output of the key-value projection per KV head as
[..., kv_heads, 2 * head_dim] and cuts each head's row in two, so the projection's rows hold, per KV head, that
head's key rows and then its value rows (or the values first). The reader follows the code, not the names: the
output of `self.<kv>(...)` (the attribute the tensors single out), the view with a trailing `2 * head_dim` (or
`head_dim * 2`) size, given as arguments or as a tuple the view unpacks, and the two-way unpacking of the viewed
tensor (torch.split, .split, .chunk, or a helper of the class taking it). Which half is the key is read from
where each half goes: the key enters a call together with the queries (the rotary function, the scores'
product) before the value does; the value does not.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.sourcecode import _classes, _dotted, ruled_out, subtree

# Methods that pass a tensor on unchanged but for its shape or layout.
SHAPE_METHODS = frozenset({"view", "reshape", "transpose", "contiguous", "permute", "flatten", "unflatten",
                           "squeeze", "unsqueeze", "to", "float", "type_as", "clone"})
SPLITS = frozenset({"split", "chunk", "tensor_split"})


@dataclass(frozen=True)
class Pairs:
    """Per KV head, key rows then value rows (key_first) or the values first, as the code at file:line cuts
    them."""

    key_first: bool
    file: str
    line: int
    cls: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in subtree(node) if isinstance(n, ast.Name)}


def _root(node: ast.AST) -> ast.AST:
    """The tensor a chain of shape methods starts from (`x.view(...).transpose(1, 2)` -> x)."""
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
           and node.func.attr in SHAPE_METHODS):
        node = node.func.value
    return node


def _is_call_of(node: ast.AST, attribute: str) -> bool:
    return isinstance(node, ast.Call) and _dotted(node.func) == f"self.{attribute}"


def _doubled(node: ast.AST) -> bool:
    """`2 * d` or `d * 2` (d anything but a constant)."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult)
            and any(isinstance(s, ast.Constant) and s.value == 2 for s in (node.left, node.right))
            and not all(isinstance(s, ast.Constant) for s in (node.left, node.right)))


def _view_sizes(call: ast.Call, assigned: dict[str, ast.AST]) -> list[ast.AST] | None:
    """The sizes a view/reshape call gives, with `*shape` read from `shape = x.size()[:-1] + (a, b)` or a
    tuple."""
    args = list(call.args)
    if len(args) == 1 and isinstance(args[0], ast.Tuple):
        args = list(args[0].elts)
    if len(args) == 1 and isinstance(args[0], ast.Starred) and isinstance(args[0].value, ast.Name):
        value = assigned.get(args[0].value.id)
        if isinstance(value, ast.Tuple):
            return list(value.elts)
        if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add) and isinstance(value.right, ast.Tuple):
            return list(value.right.elts)
        return None
    return args


def read(sources: dict[str, str], attn_cls: str, kv: str, query: str, config: dict | None = None) -> Pairs | str | None:
    """How class `attn_cls` cuts the output of `self.<kv>(...)`: Pairs where it views it per KV head as
    [..., heads, 2 * head_dim] and unpacks the two halves, a reason where it does so but the code does not show
    which half is the key, None where it does not view it so."""
    found = _classes(sources).get(attn_cls)
    if found is None:
        return None
    file, cls = found
    off = ruled_out(cls, config)
    for func in subtree(cls):
        if not isinstance(func, ast.FunctionDef) or not any(_is_call_of(n, kv) for n in subtree(func)):
            continue
        statements = sorted((n for n in subtree(func) if isinstance(n, ast.Assign) and id(n) not in off),
                            key=lambda n: (n.lineno, n.col_offset))
        assigned: dict[str, ast.AST] = {}
        raw: set[str] = set()  # names holding the projection's output, not yet viewed per head
        viewed: set[str] = set()  # names holding it viewed as [..., heads, 2 * head_dim]
        cut: tuple[set[str], set[str]] | None = None
        cut_at = 0
        queries: set[str] = set()
        for node in statements:
            target = node.targets[0] if len(node.targets) == 1 else None
            value = node.value
            if isinstance(target, ast.Name):
                name = target.id
                root = _root(value)
                from_name = root.id if isinstance(root, ast.Name) else None
                was_query, was_raw, was_viewed = (from_name in g for g in (queries, raw, viewed))
                for group in (raw, viewed, queries):
                    group.discard(name)
                if _is_call_of(root, query) or was_query:
                    queries.add(name)
                if _is_call_of(root, kv) or was_raw or was_viewed:
                    per_head = any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                                   and c.func.attr in ("view", "reshape")
                                   and (sizes := _view_sizes(c, assigned)) and len(sizes) >= 2
                                   and _doubled(sizes[-1])
                                   for c in subtree(value))
                    (viewed if per_head or was_viewed else raw).add(name)
                if cut is not None:  # a half passed on through shape methods keeps its side
                    for half in cut:
                        if from_name in half:
                            half.add(name)
                assigned[name] = value
            elif (isinstance(target, ast.Tuple) and len(target.elts) == 2
                  and all(isinstance(e, ast.Name) for e in target.elts) and isinstance(value, ast.Call)):
                names = [e.id for e in target.elts]
                inputs = _names(value)
                callee = value.func.attr if isinstance(value.func, ast.Attribute) else _dotted(value.func)
                if cut is None and inputs & viewed and (callee in SPLITS or _dotted(value.func).startswith("self.")):
                    cut, cut_at = ({names[0]}, {names[1]}), node.lineno
                    continue
                if cut is not None:
                    for half in cut:  # `q, k = rotary(q, k, ...)`: the rotated key keeps its side
                        half.update(n for n in names if n in half)
                for group in (raw, viewed, queries):
                    group.difference_update(names)
                if inputs & queries:
                    queries.update(names[:1])
        if cut is None:
            continue
        first, second = cut
        calls = sorted((n for n in subtree(func) if isinstance(n, ast.Call) and n.lineno > cut_at
                        and id(n) not in off), key=lambda n: (n.lineno, n.col_offset))
        for call in calls:
            used = _names(call)
            if not used & _query_names(func, query, off):
                continue
            sides = [bool(used & first), bool(used & second)]
            if sides == [True, False]:
                return Pairs(True, file, cut_at, attn_cls)
            if sides == [False, True]:
                return Pairs(False, file, cut_at, attn_cls)
        return (f"{file}:{cut_at} views the output of self.{kv} per KV head as [..., heads, 2 * head_dim] and cuts "
                "it in two, but no call takes one half together with the queries, so the code does not show which "
                "half is the key")
    return None


def _query_names(func: ast.FunctionDef, query: str, off: set[int]) -> set[str]:
    """The names that hold the queries' projection, as it is or reshaped, anywhere in `func`."""
    names: set[str] = set()
    statements = sorted((n for n in subtree(func) if isinstance(n, ast.Assign) and id(n) not in off),
                        key=lambda n: (n.lineno, n.col_offset))
    for node in statements:
        root = _root(node.value)
        if _is_call_of(root, query) or (isinstance(root, ast.Name) and root.id in names):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names
