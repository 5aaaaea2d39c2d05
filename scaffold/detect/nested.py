"""A sublayer block nested in the decoder layer (DBRX's `norm_attn_norm`), read as the layer it computes.

DBRX's decoder layer hands its input to a module that holds the attention's norm, the attention and the MLP's norm
(`DbrxNormAttentionNorm`), adds the attention's residual itself and returns the residual and the normed sum; the layer
then runs the MLP and adds its residual. That is the usual pre-norm layer written in two classes. Here the block is
inlined into the layer, as Python would run it: the layer's __init__ builds the block's modules itself (the block's
`self.X = ...` in place of `self.block = Block(...)`), and the layer's forward runs the block's forward in place of the
call (its parameters bound to the call's arguments, its locals renamed apart, its return value assigned to the call's
targets). Every detector then reads that one class (`dataflow.layer_class`) and decides from what it computes which
form the layer is, or refuses it as it would a flat layer; the checkpoint's `block.` prefix is dropped from the
layer's tensor names on load (`spec.layer_block`, `renamed_substrings`).

A block is inlined only where the result is the same program: a module of the layer whose class builds modules and no
projection of its own, at least one norm beside an attention (a module holding projections that computes scores),
is built with the layer's own names for its constructor's parameters, is called once in the layer's forward as a
statement of its own, returns once, at the end of its forward (a tuple or one tensor), calls no method of its own, and gives no attribute a value the layer gives
otherwise. Anything else is left as it is (blocks.norm_attention_block then names the block in the refusal).
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass

from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _classes, _dotted, subtree

PREFIX = "_inlined_"
NORM_SUFFIXES = ("Norm", "LayerNorm", "RMSNorm")


@dataclass(frozen=True)
class Inlined:
    cls: ast.ClassDef  # the layer with the block inlined
    attr: str  # the block's attribute on the layer (norm_attn_norm)
    block: str  # its class
    evidence: str  # FILE:LINE: the call, as written


_CACHE: dict[int, tuple[ast.ClassDef, Inlined | None]] = {}


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _self_assign(stmt: ast.stmt) -> str | None:
    if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
            and _dotted(stmt.targets[0].value) == "self"):
        return stmt.targets[0].attr
    return None


def _built(init: ast.FunctionDef) -> dict[str, ast.expr]:
    return {a: stmt.value for stmt in init.body if (a := _self_assign(stmt)) is not None}


def _is_super_init(stmt: ast.stmt) -> bool:
    return (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "__init__")


def _bind(func: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr] | None:
    """The block method's parameters (self aside) -> the call's argument expressions (a default where not passed,
    None where it has none); None where the call cannot be matched (*args, unknown keywords)."""
    params = [a.arg for a in func.args.posonlyargs + func.args.args][1:]
    defaults = dict(zip(params[len(params) - len(func.args.defaults):], func.args.defaults))
    kwonly = [a.arg for a in func.args.kwonlyargs]
    defaults.update({a.arg: d for a, d in zip(func.args.kwonlyargs, func.args.kw_defaults) if d is not None})
    if any(isinstance(a, ast.Starred) for a in call.args) or len(call.args) > len(params):
        return None
    bound: dict[str, ast.expr] = dict(zip(params, call.args))
    for kw in call.keywords:
        if kw.arg is None:  # **kwargs handed on: the block's **kwargs, which the port does not read
            continue
        if kw.arg in params + kwonly and kw.arg not in bound:
            bound[kw.arg] = kw.value
        elif func.args.kwarg is None:
            return None
    for p in params + kwonly:
        if p not in bound:
            bound[p] = defaults.get(p, ast.Constant(None))
    return bound


class _Rename(ast.NodeTransformer):
    def __init__(self, names: set[str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.Name:
        if node.id in self.names:
            node.id = PREFIX + node.id
        return node


def _is_norm(sources: dict, value: ast.expr) -> bool:
    return isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1].endswith(NORM_SUFFIXES)


def _attention(sources: dict, value: ast.expr, linear: set[str]) -> bool:
    """A module built from a class of the code that holds projections and computes attention scores (a softmax,
    a product of activations, an attention function: `attention_interface(...)`, sdpa); not an MoE block."""
    if not isinstance(value, ast.Call):
        return False
    found = _classes(sources).get(_dotted(value.func).rsplit(".", 1)[-1])
    init = _method(found[1], "__init__") if found else None
    if init is None or not any(isinstance(v, ast.Call) and _dotted(v.func).rsplit(".", 1)[-1] in linear
                               for v in _built(init).values()):
        return False
    calls = {(_dotted(n.func) or getattr(n.func, "attr", "")).rsplit(".", 1)[-1]
             for n in subtree(found[1]) if isinstance(n, ast.Call)}
    return any("attention" in c.lower() or c in SCORES for c in calls)


SCORES = ("softmax", "matmul", "bmm", "einsum")


def inline_block(sources: dict, file: str, cls: ast.ClassDef) -> Inlined | None:
    """The layer class `cls` with its nested norm-attention block inlined (see the module's docstring); None where
    it has no block this inlines."""
    cached = _CACHE.get(id(cls))
    if cached is not None and cached[0] is cls:
        return cached[1]
    found = _inline(sources, file, cls)
    _CACHE[id(cls)] = (cls, found)
    return found


def _inline(sources: dict, file: str, cls: ast.ClassDef) -> Inlined | None:
    init, forward = _method(cls, "__init__"), _method(cls, "forward")
    if init is None or forward is None:
        return None
    classes = _classes(sources)
    linear = set(linear_classes(sources))
    layer_built = _built(init)
    for at, stmt in enumerate(init.body):
        attr = _self_assign(stmt)
        if attr is None or not isinstance(stmt.value, ast.Call):
            continue
        found = classes.get(_dotted(stmt.value.func).rsplit(".", 1)[-1])
        if found is None or found[0] != file or found[1] is cls:
            continue
        block = found[1]
        b_init, b_forward = _method(block, "__init__"), _method(block, "forward")
        if b_init is None or b_forward is None:
            continue
        built = _built(b_init)
        modules = {a: v for a, v in built.items() if isinstance(v, ast.Call)}
        if (any(isinstance(v, ast.Call) and _dotted(v.func).rsplit(".", 1)[-1] in linear for v in modules.values())
                or not any(_is_norm(sources, v) for v in modules.values())
                or not any(_attention(sources, v, linear) for v in modules.values())):
            continue
        # The constructor's parameters: the layer's own names, so its statements read the same.
        init_args = _bind(b_init, stmt.value)
        if init_args is None or any(not (isinstance(v, ast.Name) and v.id == p) and p in _assigned_names(b_init)
                                    | _read_names(b_init) for p, v in init_args.items()):
            continue
        # No attribute the layer gives another value.
        if any(a in layer_built and ast.dump(layer_built[a]) != ast.dump(v) for a, v in built.items()):
            continue
        # Its forward: one return, last; no method of its own called.
        returns = [n for n in subtree(b_forward) if isinstance(n, ast.Return)]
        last = b_forward.body[-1]
        if returns != [last] or last.value is None:
            continue
        own_methods = {f.name for f in block.body if isinstance(f, ast.FunctionDef)} - {"forward"}
        if any(isinstance(n, ast.Attribute) and _dotted(n.value) == "self" and n.attr in own_methods
               for n in subtree(b_forward)):
            continue
        # Called once in the layer's forward, as `targets = self.attr(...)`.
        calls = [n for n in subtree(forward) if isinstance(n, ast.Call) and _dotted(n.func) == f"self.{attr}"]
        reads = [n for n in subtree(forward) if isinstance(n, ast.Attribute) and _dotted(n) == f"self.{attr}"]
        site = next((i for i, s in enumerate(forward.body) if isinstance(s, ast.Assign) and len(s.targets) == 1
                     and s.value in calls), None)
        if len(calls) != 1 or len(reads) != 1 or site is None:
            continue
        call_stmt = forward.body[site]
        bound = _bind(b_forward, call_stmt.value)
        if bound is None:
            continue
        local = set(bound) | _assigned_names(b_forward)
        if b_forward.args.kwarg is not None:
            local.add(b_forward.args.kwarg.arg)
        body = [_Rename(local).visit(copy.deepcopy(s)) for s in b_forward.body]
        binds = [ast.copy_location(ast.Assign(targets=[ast.Name(PREFIX + p, ast.Store())], value=copy.deepcopy(v)),
                                   call_stmt) for p, v in bound.items()]
        if b_forward.args.kwarg is not None:
            binds.append(ast.copy_location(ast.Assign(targets=[ast.Name(PREFIX + b_forward.args.kwarg.arg,
                                                                        ast.Store())],
                                                      value=ast.Dict(keys=[], values=[])), call_stmt))
        result = body.pop()
        body.append(ast.copy_location(ast.Assign(targets=copy.deepcopy(call_stmt.targets), value=result.value),
                                      result))
        new_forward = copy.deepcopy(forward)
        new_forward.body[site:site + 1] = binds + body
        new_init = copy.deepcopy(init)
        block_init = [copy.deepcopy(s) for s in b_init.body if not _is_super_init(s)
                      and not (_self_assign(s) in layer_built)]
        new_init.body[at:at + 1] = block_init
        new_cls = copy.copy(cls)
        new_cls.body = [new_init if f is init else new_forward if f is forward else f for f in cls.body]
        ast.fix_missing_locations(new_cls)
        for node in ast.walk(new_cls):  # copies carry the walks sourcecode.subtree kept on the originals
            node.__dict__.pop("_scaffold_nodes", None)
        where = f"{file}:{call_stmt.lineno}: {ast.unparse(call_stmt).splitlines()[0]}"
        return Inlined(new_cls, attr, block.name, where)
    return None


def _assigned_names(func: ast.FunctionDef) -> set[str]:
    return {n.id for n in subtree(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _read_names(func: ast.FunctionDef) -> set[str]:
    return {n.id for n in subtree(func) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
