"""The reading of modeling code that the finders of forms no port computes (scaffold.detect.forms) and the reader of
a bias per key and of residual scales (scaffold.detect.keybias) share: the classes of a file, what a class builds,
which classes compute attention, the decoder layer, the statements of a body, the reads of an expression, the mask
and q/k/v an attention call receives, and a node's file:line and code for a refusal."""

from __future__ import annotations

import ast

from scaffold.detect import dataflow, sourcecode
from scaffold.detect.blocks import _method
from scaffold.detect.sourcecode import _dotted, subtree

# Calls that compute attention (the softmax-weighted sum over keys) in transformers' files and a lab's.
ATTENTION_CALLS = {"scaled_dot_product_attention", "eager_attention_forward", "attention_interface",
                   "flash_attn_func", "flash_attn_varlen_func", "flex_attention"}


# Attribute reads that take a tensor's size or placement, not its values.
_META = {"shape", "dtype", "device", "size", "ndim", "dim"}


# ------------------------------------------------------------------ shared readings of the code
def _classes(sources: dict) -> dict[str, tuple[str, ast.ClassDef]]:
    return sourcecode._classes(sources)


def _built(cls: ast.ClassDef) -> dict[str, tuple[str, int]]:
    """self.X = Cls(...) in __init__ (or nn.ModuleList([Cls(...) ...])): X -> (the class's last name, line)."""
    init = _method(cls, "__init__")
    out: dict[str, tuple[str, int]] = {}
    for node in subtree(init) if init is not None else ():
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)):
            continue
        call = node.value
        name = _dotted(call.func).rsplit(".", 1)[-1]
        if name == "ModuleList" and call.args:
            elt = call.args[0]
            elt = elt.elt if isinstance(elt, (ast.ListComp, ast.GeneratorExp)) else \
                elt.elts[0] if isinstance(elt, (ast.List, ast.Tuple)) and elt.elts else elt
            if isinstance(elt, ast.Call):
                out.setdefault(node.targets[0].attr, (_dotted(elt.func).rsplit(".", 1)[-1], node.lineno))
            continue
        out.setdefault(node.targets[0].attr, (name, node.lineno))
    return out


def _appended(cls: ast.ClassDef) -> dict[str, str]:
    """self.X.append(Cls(...)) in __init__ (XLM's lists): X -> the class's last name."""
    init = _method(cls, "__init__")
    out = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "append"
                and isinstance(node.func.value, ast.Attribute) and _dotted(node.func.value.value) == "self"
                and node.args and isinstance(node.args[0], ast.Call)):
            out.setdefault(node.func.value.attr, _dotted(node.args[0].func).rsplit(".", 1)[-1])
    return out


def _layer_lists(cls: ast.ClassDef, classes: dict, stacks: bool = False) -> dict[str, str]:
    """self.X = nn.ModuleList([Cls(...) for ...]) in __init__ with Cls defined in the sources: X -> Cls. With
    `stacks`, only lists as long as a config value says (`for i in range(config.num_hidden_layers)`), not a
    layer's own pair of modules (LongCat-Flash's `for i in [0, 1]`)."""
    init = _method(cls, "__init__")
    out = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)
                and _dotted(node.value.func).rsplit(".", 1)[-1] == "ModuleList" and node.value.args
                and isinstance(node.value.args[0], (ast.ListComp, ast.GeneratorExp))
                and isinstance(node.value.args[0].elt, ast.Call)):
            name = _dotted(node.value.args[0].elt.func).rsplit(".", 1)[-1]
            loop = node.value.args[0].generators[0].iter
            if stacks and not any("config" in _dotted(n) for n in subtree(loop) if isinstance(n, ast.Attribute)):
                continue
            if name in classes:
                out[node.targets[0].attr] = name
    return out


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _computes_attention(cls: ast.ClassDef) -> bool:
    """A class whose methods compute attention: an attention function, or a softmax beside a product of tensors."""
    for func in cls.body:
        if not isinstance(func, ast.FunctionDef):
            continue
        calls = {_callee(n) for n in subtree(func) if isinstance(n, ast.Call)}
        if calls & ATTENTION_CALLS:
            return True
        products = calls & {"matmul", "einsum", "bmm", "baddbmm"} or any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult) for n in subtree(func))
        if products and (calls & {"softmax", "Softmax", "logsumexp"} or any(
                isinstance(n, ast.Attribute) and n.attr == "softmax" for n in subtree(func))):
            return True
    return False


def _attention_classes(sources: dict, direct: bool = False) -> set[str]:
    """Classes that compute attention, and (unless `direct`) those that build one, two deep (Reformer's
    ReformerAttention around its LSH and local attentions; a decoder layer is one of them too)."""
    classes = _classes(sources)
    found = {name for name, (_f, cls) in classes.items() if _computes_attention(cls)}
    for _ in range(0 if direct else 2):
        found |= {name for name, (_f, cls) in classes.items()
                  if any(inner in found for inner, _ in _built(cls).values()) and not _layer_lists(cls, classes, True)}
    return found


def _statements(body: list[ast.stmt]):
    """The statements of a body in order, those inside if / with / for / try blocks included."""
    for stmt in body:
        yield stmt
        for field in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, field, None)
            if isinstance(inner, list) and not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                yield from _statements(inner)
        for handler in getattr(stmt, "handlers", []) or []:
            yield from _statements(handler.body)


def _value_reads(node: ast.AST) -> list[ast.AST]:
    """The nodes of an expression that carry its values: what sits under .shape / .size() / .dtype is left out."""
    out = []

    def visit(n: ast.AST) -> None:
        if isinstance(n, ast.Attribute) and n.attr in _META:
            return
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _META:
            return
        out.append(n)
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return out


def _decoder_layer(sources: dict) -> tuple[str, ast.ClassDef] | None:
    """The decoder layer: the class a stack's nn.ModuleList holds, the stack not itself inside a listed block
    (LongCat-Flash's layer keeps its two attentions in a list of its own), holding an attention."""
    classes = _classes(sources)
    lists = [(owner, block) for owner, (_f, cls) in classes.items()
             for block in _layer_lists(cls, classes, True).values()]
    inner = {block for _owner, block in lists}
    attention = _attention_classes(sources)
    stacks = {block for owner, block in lists if owner not in inner and block in attention}
    if len(stacks) == 1:
        return classes[stacks.pop()]
    found = dataflow.layer_class(sources)
    return (found[0], found[1]) if found is not None else None


def _where(file: str, node: ast.AST) -> str:
    return f"{file}:{node.lineno}"


def _line(node: ast.AST, limit: int = 90) -> str:
    """The code of a node on one line; cut at `limit` with its brackets closed (a refusal's parentheses stay
    balanced: the catalogue folds what they hold)."""
    text = " ".join(ast.unparse(node).split())
    if len(text) <= limit:
        return text
    cut = text[:limit - 3]
    return cut + "..." + "]" * max(0, cut.count("[") - cut.count("]")) + ")" * max(0, cut.count("(") - cut.count(")"))


def _qkv_arguments(call: ast.Call) -> list[ast.AST]:
    """The queries, keys and values an attention call receives."""
    start = 0 if _callee(call) == "scaled_dot_product_attention" else 1
    named = [k.value for k in call.keywords if k.arg in ("query", "key", "value", "q", "k", "v")]
    return [*call.args[start:start + 3], *named]


def _mask_argument(call: ast.Call) -> ast.AST | None:
    """The mask an attention call receives: `attention_mask=` / `attn_mask=` / `mask=`, or its positional place."""
    name = _callee(call)
    if name not in ATTENTION_CALLS:
        return None
    for k in call.keywords:
        if k.arg in ("attention_mask", "attn_mask", "mask"):
            return k.value
    position = 3 if name == "scaled_dot_product_attention" else 4
    return call.args[position] if len(call.args) > position else None


def parameter_masks(forward: ast.FunctionDef, own: set[str]):
    """Each attention call in `forward` whose mask reads some of the module's own parameters or linears (`own`,
    followed through the locals derived from them) that its queries, keys and values do not: (call, mask, its
    q/k/v arguments, those names), in the order the statements run. A mask narrowed by what q, k and v read too
    (DeepSeek-V3.2's indexer scores from the low-rank query) is not one."""
    derived: dict[str, set[str]] = {}

    def reads(node: ast.AST) -> set[str]:
        out = set()
        for n in _value_reads(node):
            if isinstance(n, ast.Attribute) and _dotted(n.value) == "self" and n.attr in own:
                out.add(n.attr)
            elif isinstance(n, ast.Name):
                out |= derived.get(n.id, set())
        return out

    for stmt in _statements(forward.body):
        value = getattr(stmt, "value", None)
        if value is None:
            continue
        for call in (n for n in subtree(value) if isinstance(n, ast.Call)):
            mask = _mask_argument(call)
            if mask is None:
                continue
            qkv = _qkv_arguments(call)
            got = reads(mask) - set().union(set(), *(reads(a) for a in qkv))
            if got:
                yield call, mask, qkv, got
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            got = reads(value)
            for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                for n in subtree(target):
                    if isinstance(n, ast.Name):
                        derived[n.id] = got


def attention_forwards(sources: dict):
    """(name, file, class, forward) of each class that computes attention itself, by name: where the finders of
    an attention's forms (a mask from its parameters, routed heads, a bias per key) look."""
    classes = _classes(sources)
    for name in sorted(_attention_classes(sources, direct=True)):
        file, cls = classes[name]
        forward = _method(cls, "forward")
        if forward is not None:
            yield name, file, cls, forward
