"""Forms of a model that no port computes, named from what its code computes (read as text, never run), before
any detector tries to fit the model to a decoder layout. Each finder returns a short message naming the form and
file:line, or None; `check` refuses with the first found (the others follow it, after a semicolon).

- Bidirectional attention by config (XLM's `config.causal`, XLNet's `config.attn_type`): the code builds its
  causal (triangular) mask only under a condition on a config value, and config.json's value leaves it out, so
  every position attends to later ones: an encoder, which a decoder's KV cache cannot serve.
- A layer stack run more than once per forward (HRM's H and L modules iterated in cycles): a module holding the
  decoder layers called inside a loop, or the layer list iterated inside another loop.
- Reversible residual streams (Reformer's RevNet): the decoder layer's attention reads one stream and its output
  is added to another stream, a second argument of the layer.
- Several attention computations in one decoder layer (LongCat-Flash's two per layer): the layer calls attention
  modules at more than one place (cross-attention to an encoder's states is named elsewhere, scaffold.detect.layout).
- Routed attention (JetMoE's mixture of attention heads): the attention computes its queries or output through a
  module that routes each token to top-k experts.
- An attention mask computed from the attention's own parameters (Doge's dynamic mask: dt_proj and A over the
  values, then a top-k of the keys): vLLM's attention masks by position only.
- Learned residual scales (Doge's `self.input_residual * residual + hidden_states`): the residual multiplied by a
  parameter of the layer's own before the sublayer's output is added.
- A learned relative position bias (CPM-Ant's, T5's): a table of parameters indexed by the distance between key
  and query positions (`arange(k)[None, :] - arange(q)[:, None]`), added to the attention scores.
- A multimodal model: every causal-LM class of the file takes image, audio or video inputs (Fuyu's image_patches).
- Layers kept as parallel module lists, one per sublayer (XLM's attentions[i], ffns[i], layer_norm1[i] ...).
- Attention scores summed from several products (XLNet's `ac + bd + ef`: Transformer-XL's content and
  relative-position terms), in an attention class the decoder layer builds.
- An integer table the code indexes by token ids (DeepSeek-V4's hash routing `tid2eid[input_ids]`), named where the
  reader refuses the tensor's dtype (`read_checkpoint`).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from scaffold.checkpoint import Checkpoint
from scaffold.checkpoint import read_checkpoint as _read
from scaffold.detect import dataflow, sourcecode
from scaffold.detect.blocks import _method, _parameters
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import _dotted, subtree
from scaffold.errors import NonFloatTensor

# Calls that compute attention (the softmax-weighted sum over keys) in transformers' files and a lab's.
ATTENTION_CALLS = {"scaled_dot_product_attention", "eager_attention_forward", "attention_interface",
                   "flash_attn_func", "flash_attn_varlen_func", "flex_attention"}
CAUSAL_MASK_CALLS = {"tril", "triu", "tril_", "triu_"}
# Attribute reads that take a tensor's size or placement, not its values.
_META = {"shape", "dtype", "device", "size", "ndim", "dim"}


def check(ckpt: Checkpoint) -> None:
    """Refuse, naming the form and its file:line, a model whose code computes a form no port computes."""
    sources = sourcecode.modeling_sources(ckpt)
    found = blocking_forms(sources, ckpt.config) if sources else []
    if found:
        raise unsupported("; and ".join(found), ckpt.config_file, ckpt.config.get("model_type"))


def read_checkpoint(path: str | Path) -> Checkpoint:
    """scaffold.checkpoint.read_checkpoint, with a tensor of a dtype no port loads named by what the code computes
    with it where the code says (DeepSeek-V4's tid2eid: experts looked up by token id); else the reader's error."""
    try:
        return _read(path)
    except NonFloatTensor as exc:
        found = integer_table(sourcecode.modeling_sources(SimpleNamespace(sources=exc.sources or {},
                                                                           config=exc.config or {})),
                              exc.tensor, exc.dtype) if exc.config is not None else None
        if found is None:
            raise
        raise unsupported(found, Path(path).resolve() / "config.json", exc.config.get("model_type")) from None


def integer_table(sources: dict[str, str], tensor: str, dtype: str) -> str | None:
    """An integer table the code indexes by token ids (`self.tid2eid[input_ids]`): a lookup no float weight of a
    port stands for; with a class that reads a config key of experts, the experts each token goes to (hash
    routing)."""
    leaf = tensor.rsplit(".", 1)[-1]
    for file, tree in sourcecode._parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                ids = {a.arg for a in func.args.args if a.arg.endswith("ids")}
                for n in subtree(func):
                    if not (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute)
                            and _dotted(n.value.value) == "self" and n.value.attr == leaf and ids):
                        continue
                    read = {m.id for m in subtree(n.slice) if isinstance(m, ast.Name)} & ids
                    if not read:
                        continue
                    experts = any(isinstance(m, ast.Attribute) and "expert" in m.attr.lower()
                                  and _dotted(m.value) in ("config", "self.config") for m in subtree(cls))
                    stmt = next((s for s in _statements(func.body) if n in subtree(s)), n)
                    what = "the experts each token is routed to (hash routing)" if experts else "a value per token"
                    return (f"an integer table looked up by token ids: {cls.name}.{func.name} indexes {leaf} by "
                            f"{', '.join(sorted(read))} for {what} ({file}:{stmt.lineno}: {_line(stmt, 70)}, the "
                            f"table stored as {dtype} tensor {tensor!r}); a port's weights are float and its routing "
                            "reads the router's scores")
    return None


def blocking_forms(sources: dict[str, str], config: dict) -> list[str]:
    found = []
    for finder in FINDERS:
        message = finder(sources, config)
        if message:
            found.append(message)
    return found


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


# ------------------------------------------------------------------ bidirectional attention by config
def _causal_mask_expr(node: ast.AST) -> bool:
    """tril/triu, or a comparison of two broadcast position ranges (`a[None, :] <= a[:, None]`)."""
    for n in subtree(node):
        if isinstance(n, ast.Call) and _callee(n) in CAUSAL_MASK_CALLS:
            return True
        if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE)):
            sides = [n.left, n.comparators[0]]
            if all(any(isinstance(s, ast.Subscript) and any(isinstance(c, ast.Constant) and c.value is None
                                                            for c in subtree(s.slice)) for s in subtree(side))
                   for side in sides):
                return True
    return False


def _config_aliases(sources: dict) -> dict[str, str]:
    """self.X = config.Y (or self.config.Y) anywhere: 'self.X' -> Y."""
    out = {}
    for _file, tree in sourcecode._parsed(sources):
        for node in subtree(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                    and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Attribute)
                    and _dotted(node.value.value) in ("config", "self.config")):
                out.setdefault(f"self.{node.targets[0].attr}", node.value.attr)
    return out


def _evaluate(test: ast.expr, values: dict[str, object]) -> bool | None:
    """A condition over config values: `V`, `not V`, `V == c`, `V != c`, `V in (...)`; None where not that."""
    def value(n):
        key = _dotted(n)
        if key in values:
            return values[key]
        if isinstance(n, ast.Constant):
            return n.value
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)):
            items = [value(e) for e in n.elts]
            return None if any(i is _UNKNOWN for i in items) else items
        return _UNKNOWN

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _evaluate(test.operand, values)
        return None if inner is None else not inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, right = value(test.left), value(test.comparators[0])
        if left is _UNKNOWN or right is _UNKNOWN:
            return None
        op = test.ops[0]
        if isinstance(op, (ast.Eq, ast.Is)):
            return left == right
        if isinstance(op, (ast.NotEq, ast.IsNot)):
            return left != right
        if isinstance(op, ast.In) and isinstance(right, list):
            return left in right
        if isinstance(op, ast.NotIn) and isinstance(right, list):
            return left not in right
        return None
    got = value(test)
    return None if got is _UNKNOWN else bool(got)


_UNKNOWN = object()


def bidirectional_by_config(sources: dict, config: dict) -> str | None:
    """A causal mask the code builds only under a config condition that config.json's values leave false."""
    aliases = _config_aliases(sources)
    trees = list(sourcecode._parsed(sources))
    functions: dict[str, ast.FunctionDef] = {}
    for _file, tree in trees:
        for node in subtree(tree):
            if isinstance(node, ast.FunctionDef):
                functions.setdefault(node.name, node)
    builders = {name for name, func in functions.items() if _causal_mask_expr(func)}
    for file, tree in trees:
        for func in (n for n in subtree(tree) if isinstance(n, ast.FunctionDef)):
            params = [a.arg for a in func.args.args]
            for node in subtree(func):
                if not isinstance(node, ast.If):
                    continue
                branch = ast.Module(body=node.body, type_ignores=[])
                builds = _causal_mask_expr(branch) or any(
                    isinstance(n, ast.Call) and _callee(n) in builders and _callee(n) != func.name
                    for n in subtree(branch))
                if not builds or _causal_mask_expr(ast.Module(body=node.orelse, type_ignores=[])):
                    continue
                values, keys = {}, {}
                for n in subtree(node.test):
                    name = _dotted(n)
                    key = aliases.get(name) or (n.attr if isinstance(n, ast.Attribute)
                                                and _dotted(n.value) in ("config", "self.config") else None)
                    if key is None and isinstance(n, ast.Name) and n.id in params:
                        key = _argument_key(trees, func.name, params.index(n.id), n.id, aliases)
                    if key is not None and key in config:
                        values[name], keys[name] = config[key], key
                if not values or _evaluate(node.test, values) is not False:
                    continue
                said = ", ".join(f"{k} = {config[k]!r}" for k in dict.fromkeys(keys.values()))
                return (f"bidirectional attention by config: the causal mask is built only under `if "
                        f"{_line(node.test)}` ({_where(file, node)}), and config.json's {said} builds none, so every "
                        "position attends to the positions after it (an encoder), which a decoder's cache cannot serve")
    return None


def _argument_key(trees, function: str, index: int, param: str, aliases: dict) -> str | None:
    """The config key every call of `function` passes at `index` (or as `param=`), through self.X = config.Y."""
    keys = set()
    for _file, tree in trees:
        for call in (n for n in subtree(tree) if isinstance(n, ast.Call) and _callee(n) == function):
            arg = next((k.value for k in call.keywords if k.arg == param), None)
            if arg is None:
                offset = 1 if isinstance(call.func, ast.Attribute) and _dotted(call.func.value) == "self" else 0
                position = index - offset
                arg = call.args[position] if 0 <= position < len(call.args) else None
            if arg is None:
                return None
            name = _dotted(arg)
            key = aliases.get(name) or (arg.attr if isinstance(arg, ast.Attribute)
                                        and _dotted(arg.value) in ("config", "self.config") else None)
            if key is None:
                return None
            keys.add(key)
    return keys.pop() if len(keys) == 1 else None


# ------------------------------------------------------------------ a layer stack run more than once
def repeated_stack(sources: dict, config: dict) -> str | None:
    classes = _classes(sources)
    stacks = {name: lists for name, (_f, cls) in classes.items() if (lists := _layer_lists(cls, classes))}
    for name, (file, cls) in classes.items():
        built = _built(cls)
        own_lists = _layer_lists(cls, classes)
        for func in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"):
            for loop in (n for n in subtree(func) if isinstance(n, (ast.For, ast.While))):
                inner = [n for stmt in loop.body for n in subtree(stmt)]
                for n in inner:
                    if (isinstance(n, ast.For) and isinstance(n.iter, ast.Attribute) and _dotted(n.iter.value) == "self"
                            and n.iter.attr in own_lists):
                        return (f"a layer stack run more than once per forward: {name}.forward iterates "
                                f"self.{n.iter.attr} inside a loop ({own_lists[n.iter.attr]} layers, "
                                f"{_where(file, loop)}: `{_loop_head(loop)}`); the port runs each decoder layer once")
                    if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                            and _dotted(n.func.value) == "self" and n.func.attr in built
                            and built[n.func.attr][0] in stacks):
                        held = stacks[built[n.func.attr][0]]
                        attr, layer = next(iter(held.items()))
                        return (f"a layer stack run more than once per forward: {name}.forward calls "
                                f"self.{n.func.attr} inside a loop ({built[n.func.attr][0]}, whose {attr} holds {layer}, "
                                f"{_where(file, loop)}: `{_loop_head(loop)}`); the "
                                "port runs each decoder layer once")
    return None


def _loop_head(loop: ast.AST) -> str:
    if isinstance(loop, ast.For):
        return f"for {ast.unparse(loop.target)} in {_line(loop.iter, 60)}"
    return f"while {_line(loop.test, 60)}"


# ------------------------------------------------------------------ the decoder layer's attention calls
def _attention_calls(sources: dict) -> tuple[str, ast.ClassDef, ast.FunctionDef, list[tuple[ast.Call, str]]] | None:
    """(file, layer class, its forward, [(call, attribute)]) for every call of an attention module in the layer."""
    layer = _decoder_layer(sources)
    if layer is None:
        return None
    file, cls = layer
    forward = _method(cls, "forward")
    if forward is None:
        return None
    attention = _attention_classes(sources)
    built = _built(cls)
    attrs = {a for a, (c, _) in built.items() if c in attention}
    cross = set(dataflow.encoder_only_modules(sources))
    # Calls run only on an encoder's states (`if encoder_hidden_states is not None:`): cross-attention, named as
    # the decoder half of an encoder-decoder by scaffold.detect.layout.
    guarded = {id(n) for branch in subtree(forward) if isinstance(branch, ast.If) and "encoder" in
               ast.unparse(branch.test) for stmt in branch.body for n in subtree(stmt)}
    calls = []
    for n in subtree(forward):
        if not isinstance(n, ast.Call) or id(n) in guarded:
            continue
        target = n.func.value if isinstance(n.func, ast.Subscript) else n.func
        if isinstance(target, ast.Attribute) and _dotted(target.value) == "self" and target.attr in attrs \
                and target.attr not in cross:
            calls.append((n, target.attr))
    return file, cls, forward, calls


def _exclusive(forward: ast.FunctionDef) -> dict[int, set[tuple[int, str]]]:
    """For each node of the forward, the (if statement, branch) pairs it sits in."""
    where: dict[int, set[tuple[int, str]]] = {}
    for branch in (n for n in subtree(forward) if isinstance(n, ast.If)):
        for side, body in (("body", branch.body), ("orelse", branch.orelse)):
            for stmt in body:
                for n in subtree(stmt):
                    where.setdefault(id(n), set()).add((id(branch), side))
    return where


def several_attentions(sources: dict, config: dict) -> str | None:
    found = _attention_calls(sources)
    if found is None or len(found[3]) < 2:
        return None
    file, cls, forward, calls = found
    # Calls in the two branches of one `if` run one at a time: the layer computes one of them.
    where = _exclusive(forward)
    kept: list[tuple[ast.Call, str]] = []
    for call, attr in calls:
        mine = where.get(id(call), set())
        if not any((branch, other) in where.get(id(k), set()) for k, _ in kept for branch, side in mine
                   for other in ("body", "orelse") if other != side):
            kept.append((call, attr))
    calls = kept
    if len(calls) < 2:
        return None
    built = _built(cls)
    sites = ", ".join(f"{_where(file, c)}: self.{ast.unparse(c.func).removeprefix('self.')}(...)" for c, _ in calls)
    kinds = sorted({built[a][0] for _, a in calls})
    return (f"several attention computations in one decoder layer: {cls.name}.forward calls {', '.join(kinds)} "
            f"{len(calls)} times ({sites}); the port's decoder layer computes one attention")


def reversible_residual(sources: dict, config: dict) -> str | None:
    found = _attention_calls(sources)
    if found is None or not found[3]:
        return None
    file, cls, forward, calls = found
    params = {a.arg for a in forward.args.args[1:]} | {a.arg for a in forward.args.kwonlyargs}
    attention = {id(c) for c, _ in calls}
    deps: dict[str, set[str]] = {}
    inputs: set[str] = set()

    def reads(node: ast.AST) -> set[str]:
        out = set()
        for n in subtree(node):
            if isinstance(n, ast.Call) and id(n) in attention:
                out.add("<attention>")
            elif isinstance(n, ast.Name):
                out |= deps.get(n.id, {n.id} if n.id in params else set())
        return out

    # RevNet couples two streams: Y1 = X1 + f(X2) (the attention's output added to the argument it does not read),
    # and Y2 = X2 + g(Y1) (something of the attention's output added to the argument it reads, before or after the
    # first: ESMFold adds its attention to the sequence stream, then the sequence to the pair stream). The first
    # alone is a fused-add-norm layer (vLLM's style: layer(normed, residual) -> (normed, residual)), whose normed
    # input is no stream of its own: one residual stream, which the port keeps.
    named = None
    coupled = False
    for stmt in _statements(forward.body):
        value = getattr(stmt, "value", None)
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign)) or value is None:
            continue
        for n in subtree(value):
            if isinstance(n, ast.Call) and id(n) in attention and (n.args or n.keywords):
                inputs |= reads(n.args[0] if n.args else n.keywords[0].value)  # the states it attends over
        for n in subtree(value):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
                left, right = reads(n.left), reads(n.right)
                for out, other in ((left, right), (right, left)):
                    streams = other & params
                    if "<attention>" in out and "<attention>" not in other and streams and inputs & params \
                            and not streams & inputs and named is None:
                        named = (f"reversible residual streams: {cls.name}.forward adds the attention's output to "
                                 f"{', '.join(sorted(streams))} while the attention reads "
                                 f"{', '.join(sorted(inputs & params))} ({_where(file, stmt)}: {_line(stmt)}); the "
                                 "port's decoder layer keeps one residual stream")
                    elif "<attention>" in out and "<attention>" not in other and other & inputs & params:
                        coupled = True  # the argument the attention reads is a stream too
        if named is not None and coupled:
            return named
        got = reads(value)
        if isinstance(stmt, ast.AugAssign):
            got |= reads(stmt.target)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        for target in targets:
            for n in subtree(target):
                if isinstance(n, ast.Name):
                    deps[n.id] = got
    return None


def residual_scales(sources: dict, config: dict) -> str | None:
    layer = _decoder_layer(sources)
    if layer is None:
        return None
    file, cls = layer
    forward = _method(cls, "forward")
    own = _parameters(cls)
    if forward is None or not own:
        return None
    hits = []
    for n in subtree(forward):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            for side in (n.left, n.right):
                if isinstance(side, ast.BinOp) and isinstance(side.op, ast.Mult):
                    for factor in (side.left, side.right):
                        if isinstance(factor, ast.Attribute) and _dotted(factor.value) == "self" and factor.attr in own:
                            hits.append((factor.attr, n))
    if not hits:
        return None
    names = ", ".join(dict.fromkeys(a for a, _ in hits))
    return (f"learned residual scales: {cls.name}.forward multiplies the residual by parameters of its own ({names}) "
            f"before adding the sublayer's output ({_where(file, hits[0][1])}: {_line(hits[0][1])}); the port adds "
            "the residual as it is")


# ------------------------------------------------------------------ inside the attention
def _routes_to_experts(classes: dict, name: str, experts: bool = False, depth: int = 0) -> tuple[str, ast.Call] | None:
    """(class, its topk call) where a class (or a module it builds, three deep) routes tokens to experts: a top-k
    under a class that reads a config key of experts (JetMoE's MoA reads num_local_experts, its gating calls topk)."""
    if name not in classes or depth > 3:
        return None
    _file, cls = classes[name]
    experts = experts or any(isinstance(n, ast.Attribute) and "expert" in n.attr.lower()
                             and _dotted(n.value) in ("config", "self.config") for n in subtree(cls))
    topk = next((n for n in subtree(cls) if isinstance(n, ast.Call) and _callee(n) == "topk"), None)
    if topk is not None and experts:
        return name, topk
    for inner, _line_no in _built(cls).values():
        found = _routes_to_experts(classes, inner, experts, depth + 1)
        if found is not None:
            return found
    return None


def routed_attention(sources: dict, config: dict) -> str | None:
    classes = _classes(sources)
    for name in sorted(_attention_classes(sources, direct=True)):
        file, cls = classes[name]
        forward = _method(cls, "forward")
        if forward is None:
            continue
        for attr, (inner, line) in _built(cls).items():
            routed = _routes_to_experts(classes, inner)
            if routed is None:
                continue
            router, topk = routed
            used = next((n for n in subtree(forward) if isinstance(n, ast.Call) and (
                (isinstance(n.func, ast.Attribute) and _dotted(n.func.value) == f"self.{attr}")
                or _dotted(n.func) == f"self.{attr}")), None)
            if used is None:
                continue
            return (f"routed attention (a mixture of attention heads): {name}.forward computes through self.{attr}, "
                    f"which routes each token to top-k experts ({inner} built at {file}:{line}, {router}'s top-k at "
                    f"{classes[router][0]}:{topk.lineno}, called at {_where(file, used)}: {_line(used, 60)}); the port's "
                    "attention projections are the same for every token")
    return None


def dynamic_mask(sources: dict, config: dict) -> str | None:
    classes = _classes(sources)
    for name in sorted(_attention_classes(sources, direct=True)):
        file, cls = classes[name]
        forward = _method(cls, "forward")
        if forward is None:
            continue
        own = _parameters(cls) | {a for a, (c, _) in _built(cls).items() if c in ("Linear", "Parameter")}
        derived: dict[str, set[str]] = {}

        def reads(node: ast.AST, own: set[str] = own, derived: dict = derived) -> set[str]:
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
                # What the mask alone reads: a mask narrowed by what q, k and v read too (DeepSeek-V3.2's indexer
                # scores from the low-rank query, refused as an indexer by scaffold.detect.latent) is not this form.
                got = reads(mask) - set().union(set(), *(reads(a) for a in _qkv_arguments(call)))
                if got:
                    return (f"an attention mask computed from parameters of the attention ({', '.join(sorted(got))})"
                            f": {name}.forward hands {_line(mask, 40)} to {_callee(call)} ({_where(file, call)}); the mask "
                            "depends on the tokens' values, and the port's attention masks by position only")
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
                got = reads(value)
                for target in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]):
                    for n in subtree(target):
                        if isinstance(n, ast.Name):
                            derived[n.id] = got
    return None


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


# ------------------------------------------------------------------ a learned relative position bias
def _relative_positions(func: ast.FunctionDef) -> bool:
    """`a[None, :] - b[:, None]` (or the other way, or through locals: T5's `memory_position - context_position`):
    a matrix of distances between two position ranges, one of them an arange."""
    assigned = {stmt.targets[0].id: stmt.value for stmt in _statements(func.body)
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)}

    def broadcast(side: ast.AST) -> ast.AST | None:
        side = assigned.get(side.id, side) if isinstance(side, ast.Name) else side
        if isinstance(side, ast.Subscript) and any(isinstance(c, ast.Constant) and c.value is None
                                                   for c in subtree(side.slice)):
            return side
        return None

    for n in subtree(func):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub):
            sides = [broadcast(n.left), broadcast(n.right)]
            if all(sides) and any(isinstance(c, ast.Call) and _callee(c) == "arange"
                                  for side in sides for c in subtree(side)):
                return True
    return False


def relative_position_bias(sources: dict, config: dict) -> str | None:
    classes = _classes(sources)
    for name, (file, cls) in classes.items():
        tables = _parameters(cls) | {a for a, (c, _) in _built(cls).items() if c == "Embedding"}
        if not tables:
            continue
        for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            if not _relative_positions(func):
                continue
            for n in subtree(func):
                looked = None
                if isinstance(n, ast.Call) and _callee(n) == "embedding" and len(n.args) >= 2:
                    looked = n.args[1]
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _dotted(n.func.value) == "self" \
                        and n.func.attr in tables:
                    looked = n.func
                elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute):
                    looked = n.value
                if isinstance(looked, ast.Attribute) and _dotted(looked.value) == "self" and looked.attr in tables:
                    return (f"a learned relative position bias: {name}.{func.name} looks up its table "
                            f"{looked.attr} by the key-query distance ({_where(file, n)}: "
                            f"{_line(n, 60)}); the attention adds it to its scores, and the port's attention has "
                            "no such bias")
    return None




# ------------------------------------------------------------------ the model's inputs, the layers' lists, summed scores
MEDIA_INPUTS = ("pixel", "image", "audio", "video", "patches")


def media_inputs(sources: dict, config: dict) -> str | None:
    """A causal-LM class whose forward takes image, audio or video inputs, every such class of the file (Fuyu's
    image_patches, which its vision_embed_tokens projects into the token sequence): a multimodal model."""
    found = []
    for file, tree in sourcecode._parsed(sources):
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("ForCausalLM")):
            forward = _method(cls, "forward")
            if forward is None:
                continue
            media = [a.arg for a in forward.args.args + forward.args.kwonlyargs
                     if any(word in a.arg for word in MEDIA_INPUTS)]
            found.append((cls.name, media, file, forward))
    if not found or not all(media for _, media, _, _ in found):
        return None
    name, media, file, forward = found[0]
    return (f"a multimodal model: {name}.forward takes {', '.join(media)} ({_where(file, forward)}), inputs a text "
            "decoder's port has no place for")


def summed_scores(sources: dict, config: dict) -> str | None:
    """Attention scores summed from several products of tensors (XLNet's `(ac + bd + ef) * self.scale`, the
    content and relative-position terms of Transformer-XL's attention) before the softmax."""
    classes = _classes(sources)
    layer = _decoder_layer(sources)
    if layer is None:
        return None
    reached, frontier = set(), {layer[1].name}
    for _ in range(3):  # the attention classes the decoder layer builds (not Gemma 4's audio tower beside it)
        frontier = {inner for c in frontier if c in classes for inner, _ in _built(classes[c][1]).values()} - reached
        reached |= frontier
    for name in sorted(_attention_classes(sources, direct=True) & reached):
        file, cls = classes[name]
        for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            products: set[str] = set()
            for stmt in _statements(func.body):
                if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                        and isinstance(stmt.targets[0], ast.Name)):
                    continue
                value = stmt.value
                if isinstance(value, ast.Call) and _callee(value) in ("einsum", "matmul", "bmm") or (
                        isinstance(value, ast.BinOp) and isinstance(value.op, ast.MatMult)):
                    products.add(stmt.targets[0].id)
                    continue
                terms = _sum_terms(value.left if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Mult)
                                   else value)
                if len(terms) >= 2 and sum(isinstance(t, ast.Name) and t.id in products for t in terms) >= 2:
                    return (f"attention scores summed from several products ({name}.{func.name}, "
                            f"{_where(file, stmt)}: {_line(stmt, 60)}): a relative-position term beside the "
                            "content term, as Transformer-XL computes; the port's attention scores are one product "
                            "of queries and keys")
    return None


def _sum_terms(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _sum_terms(node.left) + _sum_terms(node.right)
    return [node]


def parallel_lists(sources: dict, config: dict) -> str | None:
    """Layers kept as parallel module lists, one per sublayer (XLM's attentions[i], layer_norm1[i], ffns[i],
    layer_norm2[i], appended in one loop): no decoder layer module holds a layer's parts."""
    classes = _classes(sources)
    attention = _attention_classes(sources, direct=True)
    for name, (file, cls) in classes.items():
        appended = _appended(cls)
        if len(appended) < 3 or not set(appended.values()) & attention:
            continue
        forward = _method(cls, "forward")
        indexed = sorted({n.value.attr for n in subtree(forward) if isinstance(n, ast.Subscript)
                          and isinstance(n.value, ast.Attribute) and _dotted(n.value.value) == "self"
                          and n.value.attr in appended}) if forward is not None else []
        if len(indexed) >= 3:
            return (f"layers kept as parallel module lists: {name} appends one module per layer to each of "
                    f"{', '.join(indexed)} ({_where(file, _method(cls, '__init__'))}) and its forward indexes them "
                    "by layer; the port reads a decoder layer as one module holding its attention, MLP and norms")
    return None


FINDERS = (bidirectional_by_config, media_inputs, repeated_stack, reversible_residual, parallel_lists,
           several_attentions, routed_attention, summed_scores, dynamic_mask, residual_scales, relative_position_bias)
