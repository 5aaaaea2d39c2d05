"""Forms of a model that no port computes, named from what its code computes (read as text, never run), before
any detector tries to fit the model to a decoder layout. Each finder returns a short message naming the form and
file:line, or None; `check` refuses with the first found (the others follow it, after a semicolon).

- Bidirectional attention by config (XLM's `config.causal`, XLNet's `config.attn_type`): the code builds its
  causal (triangular) mask only under a condition on a config value, and config.json's value leaves it out, so
  every position attends to later ones: an encoder, which a decoder's KV cache cannot serve.
- Bidirectional attention by a term filled with ones (CPM-Ant's `context`): the mask builder ORs its causal mask with
  a term read from one of its parameters, and every caller passes that parameter filled with ones, so every position
  attends to every other, later ones included: an encoder, as transformers computes it.
- LSH attention (Reformer's LSHSelfAttention): an attention class hashes its vectors into buckets by a random
  rotation (an argmax over their product with a random draw, redrawn at every call unless a seed is set) and sorts
  the keys by bucket, so each query attends to a key set chosen by hashing, not by position.
- A layer stack run more than once per forward: a module holding the decoder layers called inside a loop, or the
  layer list iterated inside another loop; but the cycles scaffold.detect.recurrence.Plan ports (HRM's H and L
  modules), which scaffold.detect.recurrence.view reads.
- Reversible residual streams (Reformer's RevNet): the decoder layer's attention reads one stream and its output
  is added to another stream, a second argument of the layer.
- Several attention computations in one decoder layer (LongCat-Flash's two per layer): the layer calls attention
  modules at more than one place (cross-attention to an encoder's states is named elsewhere, scaffold.detect.layout).
- (Not refused here: routed attention, JetMoE's mixture of attention heads, the attention computing its queries or
  output through a module that routes each token to top-k experts. `routed_attention` finds it, and
  scaffold.detect.moa reads it with the checkpoint's tensors, ported or refused by name there.)
- An attention mask computed from the attention's own parameters, other than a bias per key from its values
  (Doge's dt_proj and A, which scaffold.detect.keybias reads and the port computes): vLLM's attention masks by
  position only.
- Learned residual scales other than a residual times a parameter before the attention's or the MLP's output is
  added (Doge's `self.input_residual * residual + hidden_states`, read by scaffold.detect.keybias and ported).
- Experts kept as rows of embedding tables (Doge's CDMoE under is_moe: `self.down_embed(indices)` for the indices
  of a top-k), in the module the decoder layer builds under config.json's values.
- A learned relative position bias (CPM-Ant's, T5's): a table of parameters indexed by the distance between key
  and query positions (`arange(k)[None, :] - arange(q)[:, None]`), added to the attention scores. vLLM 0.32's CPU
  attention takes ALiBi slopes, sinks and a soft cap, no bias table; FlexAttention's score_mod is the one backend
  hook for such a bias, and FlexAttention does not run in the CPU build (its KV-cache write calls
  reshape_and_cache_flash, which the CPU build lacks).
- A multimodal model: every causal-LM class of the file takes image, audio or video inputs (Fuyu's image_patches).
- Layers kept as parallel module lists, one per sublayer (XLM's attentions[i], ffns[i], layer_norm1[i] ...).
- Attention scores summed from several products (XLNet's `ac + bd + ef`: Transformer-XL's content and
  relative-position terms), in an attention class the decoder layer builds.
- Hyper-connections (HY-V4's, DeepSeek-V4's): a module of the decoder layer mixes the layer's input (several
  residual streams) into the attention's input and weights the attention's output added back to each stream.
- An integer table the code indexes by token ids (DeepSeek-V4's hash routing `tid2eid[input_ids]`), named where the
  reader refuses the tensor's dtype (`read_checkpoint`), unless scaffold.detect.hashrouting reads a hash routing the
  port computes (then the table is read as integers).
- Keys and values extended by what a module of the attention computes from its input (DeepSeek-V4's compressor,
  whose entries the attention attends over beside the tokens' own: `kv = torch.cat([kv, compressed_kv], dim=2)`).
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from scaffold.checkpoint import INTEGER_DTYPES, MASK_DTYPES, Checkpoint
from scaffold.checkpoint import read_checkpoint as _read
from scaffold.detect import (
    codekeys,
    conditions,
    dataflow,
    hashrouting,
    hyperconn,
    keybias,
    layerinputs,
    parallelmoe,
    recurrence,
    sourcecode,
    sublayers,
)
from scaffold.detect.blocks import _method, _parameters
from scaffold.detect.common import unsupported
from scaffold.detect.formcode import (
    ATTENTION_CALLS,
    _appended,
    _attention_classes,
    _built,
    _callee,
    _classes,
    _decoder_layer,
    _layer_lists,
    _line,
    _statements,
    _where,
    attention_forwards,
    parameter_masks,
)
from scaffold.detect.sourcecode import _dotted, subtree
from scaffold.errors import NonFloatTensor

CAUSAL_MASK_CALLS = {"tril", "triu", "tril_", "triu_"}


def check(ckpt: Checkpoint) -> None:
    """Refuse, naming the form and its file:line, a model whose code computes a form no port computes."""
    sources = sourcecode.modeling_sources(ckpt)
    found = blocking_forms(sources, ckpt.config) if sources else []
    if found:
        raise unsupported("; and ".join(found), ckpt.config_file, ckpt.config.get("model_type"))


def read_checkpoint(path: str | Path) -> Checkpoint:
    """scaffold.checkpoint.read_checkpoint, with a tensor of a dtype no port loads named by what the code computes
    with it where the code says (DeepSeek-V4's tid2eid: experts looked up by token id), or read where it is a
    boolean buffer the code registers (CodeGen-style `causal_mask`, saved with the weights, recomputed by the port);
    else the reader's error."""
    tables: frozenset[str] = frozenset()
    while True:
        try:
            return _read(path, integer_tables=tables)
        except NonFloatTensor as exc:
            leaf = exc.tensor.rsplit(".", 1)[-1]
            sources = sourcecode.modeling_sources(SimpleNamespace(sources=exc.sources or {}, config=exc.config or {})) \
                if exc.config is not None else {}
            if leaf not in tables and exc.dtype in MASK_DTYPES and codekeys.stored_buffers(sources, [exc.tensor]):
                tables |= {leaf}
                continue
            found = integer_table(sources, exc.tensor, exc.dtype) if exc.config is not None else None
            if found is None or leaf in tables:
                raise
            # Hash routing the port computes (scaffold.detect.hashrouting): the table is read as integers.
            why = hash_table_problem(sources, exc.config, exc.tensor, exc.dtype)
            if why is None:
                tables |= {leaf}
                continue
            raise unsupported(f"{found}; {why}" if why else found, Path(path).resolve() / "config.json",
                              exc.config.get("model_type")) from None


def hash_table_problem(sources: dict[str, str], config: dict, tensor: str, dtype: str) -> str | None:
    """None where `tensor` is the table of a hash routing the port computes (hashrouting.read finds the routing and
    the ids are the model's input_ids); else why not ("" where the table is not indexed by token ids for experts)."""
    leaf = tensor.rsplit(".", 1)[-1]
    lookup = next((found for found in hashrouting.lookups(sources) if found.table == leaf), None)
    if lookup is None or dtype not in INTEGER_DTYPES or not any(
            isinstance(m, ast.Attribute) and "expert" in m.attr.lower() and _dotted(m.value) in ("config", "self.config")
            for m in subtree(lookup.cls)):
        return ""
    read = hashrouting.read(sources, config, lookup, 8, 2)
    if isinstance(read, str):
        return read
    return hashrouting.ids_from_model(sources, lookup)


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


# ------------------------------------------------------------------ bidirectional attention by a term filled with ones
def _filled_with_ones(node: ast.AST) -> bool:
    """torch.ones(...) / ones_like(...), or torch.full(shape, 1) / full_like(x, True): every element set."""
    if not isinstance(node, ast.Call):
        return False
    name = _callee(node)
    if name in ("ones", "ones_like", "new_ones"):
        return True
    fill = node.args[1] if name in ("full", "full_like", "new_full") and len(node.args) >= 2 else next(
        (k.value for k in node.keywords if k.arg == "fill_value"), None)
    return (name in ("full", "full_like", "new_full") and isinstance(fill, ast.Constant)
            and fill.value is not None and not isinstance(fill.value, str) and bool(fill.value) and fill.value == 1)


def _functions(sources: dict):
    """(file, owner, function): every function of the files, owner the class it is a method of (else None)."""
    for file, tree in sourcecode._parsed(sources):
        for node in subtree(tree):
            if isinstance(node, ast.ClassDef):
                for func in node.body:
                    if isinstance(func, ast.FunctionDef):
                        yield file, node.name, func
        for func in tree.body:
            if isinstance(func, ast.FunctionDef):
                yield file, None, func


def _positions_ordered(node: ast.AST) -> bool:
    """A causal mask: tril/triu or broadcast ranges compared (`_causal_mask_expr`), or two aranges compared, one of
    them reshaped (`arange(n) <= arange(n).view(-1, 1)`)."""
    if _causal_mask_expr(node):
        return True
    for n in subtree(node):
        if (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Lt, ast.LtE, ast.Gt, ast.GtE))
                and all(any(isinstance(c, ast.Call) and _callee(c) == "arange" for c in subtree(side))
                        for side in (n.left, n.comparators[0]))):
            return True
    return False


def _overridden_causal_mask(func: ast.FunctionDef) -> tuple[ast.BinOp, str, str] | None:
    """`P | (... causal ...)`: a causal mask OR'ed with a term read from the function's parameter P alone (CPM-Ant's
    `context[:, None, :] | (context[:, :, None].logical_not() & directional_mask_2d)`): where P is set, a query
    attends to every key, later ones included. The OR, its description and P."""
    params = [a.arg for a in func.args.args]
    causal_names: set[str] = set()
    for stmt in _statements(func.body):
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                and _positions_ordered(stmt.value):
            causal_names.add(stmt.targets[0].id)

    def causal(node: ast.AST) -> bool:
        return _positions_ordered(node) or any(isinstance(n, ast.Name) and n.id in causal_names for n in subtree(node))

    for stmt in _statements(func.body):
        if not isinstance(stmt, (ast.Assign, ast.Return)) or stmt.value is None:
            continue
        for n in subtree(stmt.value):
            if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr)):
                continue
            for term, other in ((n.left, n.right), (n.right, n.left)):
                read = {r.id for r in subtree(term) if isinstance(r, ast.Name)}
                if causal(other) and not causal(term) and len(read) == 1 and read <= set(params[1:] or params):
                    mask = next((m.id for m in subtree(other) if isinstance(m, ast.Name) and m.id in causal_names),
                                None)
                    return n, f"{_line(term, 40)} OR'ed with the causal mask{f' {mask}' if mask else ''}", read.pop()
    return None


def _call_argument(call: ast.Call, func: ast.FunctionDef, param: str, method: bool) -> ast.AST | None:
    arg = next((k.value for k in call.keywords if k.arg == param), None)
    if arg is not None:
        return arg
    position = [a.arg for a in func.args.args].index(param) - (1 if method else 0)
    return call.args[position] if 0 <= position < len(call.args) else None


def bidirectional_by_fill(sources: dict, config: dict) -> str | None:
    """A causal mask OR'ed with a term of a parameter that every caller fills with ones (CPM-Ant's `context`, which
    CpmAntModel.forward sets to torch.full(..., 1)): every position attends to every other, later ones included."""
    functions = list(_functions(sources))
    for file, owner, func in functions:
        found = _overridden_causal_mask(func)
        if found is None:
            continue
        union, term, param = found
        fills = []
        for caller_file, caller_owner, caller in functions:
            for call in (n for n in subtree(caller) if isinstance(n, ast.Call) and _callee(n) == func.name):
                arg = _call_argument(call, func, param, owner is not None and isinstance(call.func, ast.Attribute))
                if isinstance(arg, ast.Name):
                    arg = next((s for s in reversed(list(_statements(caller.body))) if isinstance(s, ast.Assign)
                                and s.lineno < call.lineno and len(s.targets) == 1
                                and isinstance(s.targets[0], ast.Name) and s.targets[0].id == arg.id), arg)
                value = arg.value if isinstance(arg, ast.Assign) else arg
                fills.append((caller_file, caller_owner, caller, arg, value is not None and _filled_with_ones(value)))
        if not fills or not all(ones for *_, ones in fills):
            continue
        caller_file, caller_owner, caller, arg, _ = fills[0]
        name = f"{owner}.{func.name}" if owner else func.name
        by = f"{caller_owner}.{caller.name}" if caller_owner else caller.name
        return (f"bidirectional attention: {by} fills {param} with ones ({_where(caller_file, arg)}: {_line(arg, 60)}), "
                f"which lifts the causal mask at every key ({name}, {_where(file, union)}: {term}), so every position "
                "attends to the positions after it (an encoder), which a decoder's cache cannot serve")
    return None


# ------------------------------------------------------------------ a layer stack run more than once
def repeated_stack(sources: dict, config: dict) -> str | None:
    cycles = recurrence.read(sources, config)
    if cycles is not None and isinstance(recurrence.plan(cycles, sources), recurrence.Plan):
        return None  # the port computes it (scaffold.detect.recurrence.view)
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
                        cycles = recurrence.read(sources, config)
                        if cycles is not None and cycles.owner == name:
                            return _recurrence_message(cycles, config, sources)
                        held = stacks[built[n.func.attr][0]]
                        attr, layer = next(iter(held.items()))
                        return (f"a layer stack run more than once per forward: {name}.forward calls "
                                f"self.{n.func.attr} inside a loop ({built[n.func.attr][0]}, whose {attr} holds {layer}, "
                                f"{_where(file, loop)}: `{_loop_head(loop)}`); the "
                                "port runs each decoder layer once")
    return None


def _recurrence_message(cycles: recurrence.Recurrence, config: dict, sources: dict) -> str:
    """The stacks, their inputs and loops as scaffold.detect.recurrence reads them, and what the port's cycles
    (recurrence.Plan) do not compute."""
    loop = cycles.loop
    message = (f"a layer stack run more than once per forward: {cycles.owner}.forward runs {cycles.describe()} "
               f"({cycles.file}:{loop.line}: `{loop.head}`)")
    steps = [(call.runs(config), config.get(call.length_key) if call.length_key else None) for call in cycles.calls]
    if all(isinstance(runs, int) and isinstance(length, int) for runs, length in steps):
        lengths = {call.attr: length for call, (_runs, length) in zip(cycles.calls, steps)}
        calls = sum(runs * length for runs, length in steps)
        message += (f", {calls} attention calls with the weights of {sum(lengths.values())} layers in "
                    f"{len(lengths)} lists")
    reason = recurrence.plan(cycles, sources)
    return message + f"; the port's cycles do not compute {reason if isinstance(reason, str) else 'this form'}"


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
    """The layer calls attention at more than one place, or in a loop over a list of attentions; with the
    sublayers it runs and a shortcut beside them read by `sublayers` (LongCat-Flash's), and identity experts
    inside that shortcut named as also unported."""
    found = _attention_calls(sources)
    if found is None:
        return None
    form = sublayers.layer_form(sources, config)
    if form is not None and isinstance(form[2], sublayers.Portable):
        return None  # pre-norm sublayers the port runs (scaffold.detect.sublayers.view)
    file, cls, forward, calls = found
    if len(calls) < 2:
        return _looped_attention(file, cls, forward, sources, config)
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
    message = (f"several attention computations in one decoder layer: {cls.name}.forward calls {', '.join(kinds)} "
               f"{len(calls)} times ({sites})")
    return message + _sublayers_tail(sources, config, cls, forward, built)


def _sublayers_tail(sources: dict, config: dict, cls: ast.ClassDef, forward: ast.FunctionDef, built: dict) -> str:
    attention = {a for a, (c, _) in built.items() if c in _attention_classes(sources)}
    found = sublayers.sublayers(cls, forward, attention, built)
    if found is None:
        return "; the port's decoder layer computes one attention"
    return f"; {found.describe()}{_unported_sublayers(sources, config)}"


def _unported_sublayers(sources: dict, config: dict) -> str:
    """What keeps the sublayers from the form the port runs (`sublayers.read`), as the refusal's tail."""
    form = sublayers.layer_form(sources, config)
    if form is None or not isinstance(form[2], str):
        return "; the port's decoder layer computes one attention and one MLP"
    return f"; the port runs pre-norm sublayers, and {form[2]}"


def _looped_attention(file: str, cls: ast.ClassDef, forward: ast.FunctionDef, sources: dict,
                      config: dict) -> str | None:
    """An attention called once in the forward's text, inside a loop over a list of attention modules."""
    built = _built(cls)
    attention = {a for a, (c, _) in built.items() if c in _attention_classes(sources)}
    found = sublayers.looped(cls, forward, attention)
    if found is None:
        return None
    loop, attr, layout = found
    if layout.count in ("0", "1"):
        return None
    return (f"several attention computations in one decoder layer: {cls.name}.forward calls {built[attr][0]} "
            f"{layout.count} times, in a loop over self.{attr} ({_where(file, loop)}: for {ast.unparse(loop.target)} "
            f"in {_line(loop.iter, 50)}); {layout.describe()}{_unported_sublayers(sources, config)}")


# ------------------------------------------------------------------ keys chosen per token by hashing (LSH attention)
RANDOM_DRAWS = {"randn", "rand", "randn_like", "rand_like", "normal", "normal_", "uniform_", "randint"}
PRODUCTS = {"einsum", "matmul", "bmm", "mm"}
BUCKET_PICKS = {"argmax", "argmin"}


def _hash(func: ast.FunctionDef) -> tuple[ast.AST, ast.stmt] | None:
    """A projection hash: the function's vectors multiplied with a random draw (Reformer's `argmax(cat([x @ R,
    -(x @ R)]))` with R = torch.randn(...)) or with a tensor the module keeps (self.X), the bucket an argmax over the
    product. The draw's statement (or the kept tensor's read) and the pick's statement."""
    params = {a.arg for a in func.args.args[1:]}
    drawn: dict[str, ast.AST] = {}  # names holding the draw, or the kept tensor
    hashed: dict[str, ast.AST] = {}  # names holding the product of the vectors with it, or what follows: its source
    derived = set(params)  # names that follow from the function's inputs
    called = {id(n.func) for n in subtree(func) if isinstance(n, ast.Call)}

    def reads(node: ast.AST, names) -> bool:
        return any(isinstance(n, ast.Name) and n.id in names for n in subtree(node))

    def kept(node: ast.AST) -> bool:  # self.X read as a tensor, not called as a module
        return isinstance(node, ast.Attribute) and _dotted(node.value) == "self" and id(node) not in called

    for stmt in _statements(func.body):
        if not isinstance(stmt, (ast.Assign, ast.Return)) or stmt.value is None:
            continue
        targets = [n.id for t in getattr(stmt, "targets", []) for n in subtree(t) if isinstance(n, ast.Name)]
        value = stmt.value
        for n in subtree(value):
            if isinstance(n, ast.Call) and _callee(n) in BUCKET_PICKS and reads(n, hashed):
                return next(hashed[r.id] for r in subtree(n) if isinstance(r, ast.Name) and r.id in hashed), stmt
        draw = any(isinstance(n, ast.Call) and _callee(n) in RANDOM_DRAWS for n in subtree(value))
        for n in subtree(value):
            operands = ([n.left, n.right] if isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult)
                        else list(n.args) if isinstance(n, ast.Call) and _callee(n) in PRODUCTS else [])
            source = next((drawn[r.id] for o in operands for r in subtree(o) if isinstance(r, ast.Name)
                           and r.id in drawn), None) or next((o for o in operands if kept(o)), None)
            if source is not None and reads(n, derived):
                hashed.update({name: source for name in targets})
        for name in targets:
            if draw:
                drawn[name] = stmt
            elif kept(value):
                drawn[name] = value
            elif name not in hashed and reads(value, hashed):
                hashed[name] = next(hashed[r.id] for r in subtree(value) if isinstance(r, ast.Name) and r.id in hashed)
            if reads(value, derived):
                derived.add(name)
    return None


def _guards(func: ast.FunctionDef, target: ast.AST) -> list[ast.expr] | None:
    """The tests of the if statements around `target` in `func` (an else branch's test negated), or None."""
    def walk(body, tests):
        for stmt in body:
            if stmt is target or any(n is target for n in subtree(stmt)) and not isinstance(stmt, ast.If):
                return tests
            if isinstance(stmt, ast.If):
                found = walk(stmt.body, tests + [stmt.test])
                if found is not None:
                    return found
                found = walk(stmt.orelse, tests + [ast.UnaryOp(op=ast.Not(), operand=stmt.test)])
                if found is not None:
                    return found
            elif isinstance(stmt, (ast.For, ast.While, ast.With, ast.Try)):
                for field in ("body", "orelse", "finalbody"):
                    found = walk(getattr(stmt, field, []) or [], tests)
                    if found is not None:
                        return found
        return None
    return walk(func.body, [])


def _possible(tests: list[ast.expr], aliases: dict, config: dict) -> bool:
    """Whether config.json's lists allow every `L[...] == "name"` among the tests (Reformer's
    `self.attn_layers[self.layer_id] == "lsh"`, with self.attn_layers = config.attn_layers): the name is one of the
    list's items. Tests of another form, and lists config.json does not hold, are taken as possible."""
    for test in tests:
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            continue
        for n in subtree(test):
            if not (isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], ast.Eq)):
                continue
            sides = [n.left, n.comparators[0]]
            for sub, const in (sides, sides[::-1]):
                if isinstance(sub, ast.Subscript) and isinstance(const, ast.Constant) and isinstance(const.value, str):
                    key = aliases.get(_dotted(sub.value)) or (sub.value.attr if isinstance(sub.value, ast.Attribute)
                                                             and _dotted(sub.value.value) in ("config", "self.config")
                                                             else None)
                    items = config.get(key) if key else None
                    if isinstance(items, list) and const.value not in items:
                        return False
    return True


def _built_somewhere(sources: dict, name: str, config: dict) -> bool:
    """Whether a class of the files builds `name` in __init__ under conditions config.json's values allow."""
    aliases = _config_aliases(sources)
    sites = 0
    for _file, cls in _classes(sources).values():
        init = _method(cls, "__init__")
        for call in (n for n in subtree(init) if isinstance(n, ast.Call)) if init is not None else ():
            if _dotted(call.func).rsplit(".", 1)[-1] != name:
                continue
            sites += 1
            tests = _guards(init, call)
            if _possible(tests or [], aliases, config):
                return True
    return sites == 0


def hashed_keys(sources: dict, config: dict) -> str | None:
    """LSH attention (Reformer's LSHSelfAttention): an attention class hashes its vectors into buckets by a random
    rotation and attends each query to the keys of its bucket: a key set chosen per token by hashing."""
    aliases = _config_aliases(sources)
    classes = _classes(sources)
    for name in sorted(_attention_classes(sources, direct=True)):
        file, cls = classes[name]
        for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
            found = _hash(func)
            sort = next((n for m in cls.body if isinstance(m, ast.FunctionDef) for n in subtree(m)
                         if isinstance(n, ast.Call) and (_callee(n) == "sort" or _callee(n).endswith("argsort"))), None)
            if found is None or sort is None or not _built_somewhere(sources, name, config):
                continue
            source, pick = found
            if isinstance(source, ast.Attribute):
                how = (f"by a projection it keeps ({_line(source)}; {func.name}, {_where(file, pick)}: "
                       f"{_line(pick.value, 40)})")
            else:
                seed = next((n for n in subtree(func) if isinstance(n, ast.Call) and _callee(n) == "manual_seed"), None)
                key = aliases.get(_dotted(seed.args[0])) if seed is not None and seed.args else None
                if seed is None:
                    drawn = "drawn anew at every call"
                elif key is not None and key in config and config[key] is None:
                    drawn = f"drawn anew at every call (config.json's {key} is null)"
                elif key is not None and key in config:
                    drawn = f"seeded with config.json's {key} = {config[key]!r}"
                else:
                    drawn = f"drawn anew at every call unless config.{key or _line(seed.args[0], 30)} is set"
                how = (f"by a random rotation {drawn} ({func.name}, {_where(file, source)}: {_line(source.value, 30)}; "
                       f"{_where(file, pick)}: {_line(pick.value, 40)})")
            return (f"LSH attention: {name} attends each query only to keys in its hash bucket, hashing the vectors "
                    f"{how} and sorting the keys by bucket ({_where(file, sort)}: {_line(sort, 40)}); paged attention "
                    "reads a query's keys by position, not a set chosen per token by hashing")
    return None


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


def hyper_connections(sources: dict, config: dict) -> str | None:
    """Hyper-connections (HY-V4's, DeepSeek-V4's): a module of the decoder layer reads the layer's input (several
    residual streams) and gives both what the attention reads (the streams mixed into one) and the weights with
    which the attention's output is added back to every stream: `post, x = self.attn_hc(streams)`, then
    `post * attention(norm(x)) + streams`. Read from what the forward's values derive from, not from names."""
    found = _attention_calls(sources)
    if found is None or not found[3] or hyperconn.ported(sources, config) is not None:
        return None  # none, or the form the port computes (scaffold.detect.hyperconn)
    file, cls, forward, calls = found
    params = {a.arg for a in forward.args.args[1:]} | {a.arg for a in forward.args.kwonlyargs}
    attention = {id(c) for c, _ in calls}
    built = _built(cls)
    deps: dict[str, set[str]] = {}
    attention_reads: set[str] = set()

    def reads(node: ast.AST) -> set[str]:
        """The layer's inputs, "<attention>" and "<module:X>" (a call of self.X) that `node`'s value derives from;
        the attention's output derives from the attention alone (what it reads is kept in attention_reads)."""
        if isinstance(node, ast.Call) and id(node) in attention:
            for arg in list(node.args) + [k.value for k in node.keywords]:
                attention_reads.update(reads(arg))
            return {"<attention>"}
        if isinstance(node, ast.Name):
            return set(deps.get(node.id, {node.id} if node.id in params else set()))
        out = set()
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _dotted(node.func.value) == "self" \
                and node.func.attr in built:
            out.add(f"<module:{node.func.attr}>")
        for child in ast.iter_child_nodes(node):
            out |= reads(child)
        return out

    modules_read: dict[str, set[str]] = {}  # self.X -> what its calls' arguments derive from
    for stmt in _statements(forward.body):
        value = getattr(stmt, "value", None)
        if not isinstance(stmt, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return)) or value is None:
            continue
        for n in subtree(value):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _dotted(n.func.value) == "self" \
                    and n.func.attr in built and id(n) not in attention:
                for arg in list(n.args) + [k.value for k in n.keywords]:
                    modules_read.setdefault(n.func.attr, set()).update(reads(arg))
        got = reads(value)
        for n in subtree(value):
            if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)):
                continue
            left, right = reads(n.left), reads(n.right)
            for out, other in ((left, right), (right, left)):
                if "<attention>" not in out or "<attention>" in other or not other & params:
                    continue
                # The mixer's output weights the attention's output: a product of the two in this side of the sum
                # (not a parallel block's MLP reading the same normed input).
                side = n.left if out is left else n.right
                weights = set().union(*[reads(f) for p in subtree(side) if isinstance(p, ast.BinOp)
                                        and isinstance(p.op, ast.Mult) for a, f in ((p.left, p.right),
                                                                                      (p.right, p.left))
                                        if "<attention>" in reads(a) and "<attention>" not in reads(f)])
                mixers = [m[len("<module:"):-1] for m in sorted(out & weights) if m.startswith("<module:")
                          and m in attention_reads and modules_read.get(m[len("<module:"):-1], set()) & params
                          and "<attention>" not in modules_read.get(m[len("<module:"):-1], set())]
                if mixers:
                    mixer = mixers[0]
                    return (f"hyper-connections: {cls.name}.forward computes the attention's input with "
                            f"self.{mixer} ({built[mixer][0]}) from the layer's input "
                            f"{', '.join(sorted(modules_read[mixer] & params))} and adds the attention's output "
                            f"weighted by what self.{mixer} gives to that input ({_where(file, stmt)}: "
                            f"{_line(stmt)}): several residual streams mixed around each sublayer; the port's "
                            "decoder layer keeps one residual stream")
        if isinstance(stmt, ast.Return):
            continue
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
    # A residual times a parameter of the layer before the attention's or the MLP's output is added (Doge's
    # input_residual, post_attention_residual) is ported (scaffold.detect.keybias reads it); anything else is named.
    try:
        if keybias.residual_scales(sources):
            return None
        why = "the port adds the residual as it is"
    except keybias.Unmatched as exc:
        why = f"{exc}"
    names = ", ".join(dict.fromkeys(a for a, _ in hits))
    return (f"learned residual scales: {cls.name}.forward multiplies the residual by parameters of its own ({names}) "
            f"before adding the sublayer's output ({_where(file, hits[0][1])}: {_line(hits[0][1])}); {why}")


def embedded_experts(sources: dict, config: dict) -> str | None:
    """Experts kept as rows of embedding tables (Doge's CDMoE: `self.down_embed(indices)` for the indices of a
    top-k over the router's scores, one vector per expert), in the module the decoder layer builds under
    config.json's values: no MLP per expert for FusedMoE to compute."""
    layer = _decoder_layer(sources)
    if layer is None:
        return None
    classes = _classes(sources)
    init = _method(layer[1], "__init__")
    for node in subtree(init) if init is not None else ():
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Attribute) and _dotted(node.targets[0].value) == "self"):
            continue
        chosen = conditions.selected(node.value, config)
        if not isinstance(chosen, ast.Call):
            continue
        name = _dotted(chosen.func).rsplit(".", 1)[-1]
        if name not in classes:
            continue
        file, cls = classes[name]
        forward = _method(cls, "forward")
        tables = {a for a, (c, _) in _built(cls).items() if c == "Embedding"}
        if forward is None or not tables or not any(isinstance(n, ast.Call) and _callee(n) == "topk"
                                                    for n in subtree(forward)):
            continue
        looked = sorted((n for n in subtree(forward) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                         and _dotted(n.func.value) == "self" and n.func.attr in tables),
                        key=lambda n: (n.lineno, n.col_offset))
        if looked:
            names = ", ".join(dict.fromkeys(n.func.attr for n in looked))
            return (f"experts kept as rows of embedding tables: {name}.forward looks up {names} by the indices of "
                    f"its top-k ({_where(file, looked[0])}: {_line(looked[0], 60)}), one vector per expert; the "
                    "port's experts are MLPs that FusedMoE computes")
    return None


# ------------------------------------------------------------------ inside the attention
_PRODUCTS = {"matmul", "einsum", "bmm", "baddbmm", "mm"}


def _router_topk(cls: ast.ClassDef) -> ast.Call | None:
    """A router in one of the class's methods: a top-k over scores a projection of the class's own computes from
    each token (self.P(x) with P a linear layer built in __init__, or F.linear / a product with a parameter of its
    own, then only per-row transforms: .float(), softmax, a scale; no product of two computed tensors, which a top-k
    of keys, DeepSeek-V3.2's indexer, has), whose chosen indices the method reads after it: the top-k picks among P's outputs, one per expert, for
    each token. Names play no part (JetMoE's `self.layer(hidden_states).float().topk(...)`, a lab's
    `torch.topk(self.score(x).softmax(-1), k)`)."""
    linears = {a for a, (c, _line) in _built(cls).items() if c.endswith("Linear")}
    params = _parameters(cls)

    def own_param(node: ast.AST) -> bool:
        node = node.value if isinstance(node, ast.Subscript) else node
        return isinstance(node, ast.Attribute) and _dotted(node.value) == "self" and node.attr in params

    def products(expr: ast.AST) -> list[tuple[ast.AST, list[ast.AST]]]:
        out = []
        for n in subtree(expr):
            if isinstance(n, ast.Call) and _callee(n) in _PRODUCTS | {"linear"}:
                out.append((n, [*n.args, *(k.value for k in n.keywords)]))
            elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.MatMult):
                out.append((n, [n.left, n.right]))
        return out

    def from_projection(expr: ast.AST, scores: set[str]) -> bool:
        found = products(expr)
        if any(not any(own_param(a) for a in operands) for _n, operands in found):
            return False  # a product of two computed tensors (scores of keys), not a projection of each token
        return bool(found) or any(
            isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _dotted(n.func.value) == "self"
            and n.func.attr in linears or isinstance(n, ast.Name) and n.id in scores for n in subtree(expr))

    for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        scores: set[str] = set()
        statements = list(_statements(func.body))
        for at, stmt in enumerate(statements):
            if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
                continue  # their bodies come next, on their own
            for call in (n for n in subtree(stmt) if isinstance(n, ast.Call) and _callee(n) == "topk"):
                receiver = call.func.value if isinstance(call.func, ast.Attribute) else None
                scored = call.args[0] if receiver is None or _dotted(receiver) == "torch" and call.args else receiver
                if scored is None or not from_projection(scored, scores):
                    continue
                chosen = _chosen_indices(stmt, call)
                later = [n for s in statements[at + 1:] for n in subtree(s)]
                if chosen == "" or chosen is not None and any(_reads_indices(n, *chosen) for n in later):
                    return call
            if isinstance(stmt, ast.Assign) and from_projection(stmt.value, scores):
                scores |= {n.id for t in stmt.targets for n in subtree(t) if isinstance(n, ast.Name)}
    return None


def _chosen_indices(stmt: ast.stmt, call: ast.Call) -> tuple[str, bool] | str | None:
    """Where the top-k's indices go: "" where the statement reads them in place (`.indices`, `[1]`); (name, False)
    for `values, chosen = ....topk(k)`; (name, True) for `top = torch.topk(...)`, whose `.indices` / `[1]` a later
    statement reads; None where the statement keeps the values alone."""
    if any(_indices_of(n, lambda inner: inner is call) for n in subtree(stmt)):
        return ""
    if isinstance(stmt, ast.Assign) and stmt.value is call and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Tuple) and len(target.elts) == 2 and isinstance(target.elts[1], ast.Name):
            return target.elts[1].id, False
        if isinstance(target, ast.Name):
            return target.id, True
    return None


def _reads_indices(node: ast.AST, name: str, whole: bool) -> bool:
    """A read of the indices bound by `_chosen_indices`: the name itself, or the result's `.indices` / `[1]`."""
    if not whole:
        return isinstance(node, ast.Name) and node.id == name
    return _indices_of(node, lambda inner: isinstance(inner, ast.Name) and inner.id == name)


def _indices_of(node: ast.AST, owner) -> bool:
    """`X.indices` or `X[1]` (a top-k result's indices), with `owner(X)` true."""
    if isinstance(node, ast.Attribute):
        return node.attr == "indices" and owner(node.value)
    return (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value == 1
            and owner(node.value))


def _routes_to_experts(classes: dict, name: str, depth: int = 0) -> tuple[str, ast.Call] | None:
    """(class, its router's top-k) where a class (or a module it builds, three deep) routes each token to top-k
    of a projection's outputs (`_router_topk`: JetMoE's MoA builds JetMoeTopKGating, whose forward takes the top-k
    of self.layer(hidden_states))."""
    if name not in classes or depth > 3:
        return None
    _file, cls = classes[name]
    topk = _router_topk(cls)
    if topk is not None:
        return name, topk
    for inner, _line_no in _built(cls).values():
        found = _routes_to_experts(classes, inner, depth + 1)
        if found is not None:
            return found
    return None


def _routed_roles(forward: ast.FunctionDef, attr: str) -> list[tuple[ast.Call, str]]:
    """The forward's calls through self.<attr>, each with what it computes: before the attention call (the
    queries: JetMoE's `self.experts.map`), or on what the attention call returned (the output projection:
    `self.experts.reduce`)."""
    attended: set[str] = set()
    out = []
    for stmt in _statements(forward.body):
        if isinstance(stmt, (ast.For, ast.While, ast.If, ast.With, ast.Try)):
            continue
        nodes = list(subtree(stmt))
        for n in nodes:
            if isinstance(n, ast.Call) and ((isinstance(n.func, ast.Attribute) and _dotted(n.func.value) == f"self.{attr}")
                                            or _dotted(n.func) == f"self.{attr}"):
                after = any(isinstance(m, ast.Name) and m.id in attended for a in (*n.args, *(k.value for k in n.keywords))
                            for m in subtree(a))
                out.append((n, "on the attention's output" if after else "before the attention"))
        if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            value = stmt.value
            if value is not None and any(isinstance(n, ast.Call) and _callee(n) in ATTENTION_CALLS
                                         or isinstance(n, ast.Name) and n.id in attended for n in subtree(value)):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                attended |= {n.id for t in targets for n in subtree(t) if isinstance(n, ast.Name)}
    return out


def routed_attention(sources: dict, config: dict) -> str | None:
    classes = _classes(sources)
    for name, file, cls, forward in attention_forwards(sources):
        for attr, (inner, line) in _built(cls).items():
            routed = _routes_to_experts(classes, inner)
            if routed is None:
                continue
            router, topk = routed
            calls = _routed_roles(forward, attr)
            if not calls:
                continue
            roles = "; ".join(f"{_line(call, 50)} {role} ({_where(file, call)})" for call, role in calls)
            both = {role for _call, role in calls} == {"before the attention", "on the attention's output"}
            what = ("each token's queries and output are computed by the projections of the top-k experts its router "
                    "chose" if both else "a projection of the attention is chosen per token by its router")
            return (f"routed attention (a mixture of attention heads): {name}.forward computes through self.{attr}, "
                    f"which routes each token to top-k experts ({inner} built at {file}:{line}, {router}'s top-k at "
                    f"{classes[router][0]}:{topk.lineno}; {roles}): {what}, while the port's attention projections "
                    "are the same for every token")
    return None


def dynamic_mask(sources: dict, config: dict) -> str | None:
    for name, file, cls, forward in attention_forwards(sources):
        own = _parameters(cls) | {a for a, (c, _) in _built(cls).items() if c in ("Linear", "Parameter")}
        for call, mask, _qkv, got in parameter_masks(forward, own):
            # A bias per key computed from its values (Doge's) rides in the KV cache with the key:
            # scaffold.detect.keybias reads it; any other such mask is named here.
            try:
                if keybias.key_bias(sources, config) is not None:
                    return None
                why = "the mask depends on the tokens' values, and the port's attention masks by position only"
            except keybias.Unmatched as exc:
                why = f"{exc}"
                if why.startswith(f"{name}.forward hands "):
                    why = why.split("): ", 1)[1] if "): " in why else why
            return (f"an attention mask computed from parameters of the attention ({', '.join(sorted(got))})"
                    f": {name}.forward hands {_line(mask, 40)} to {_callee(call)} ({_where(file, call)}); "
                    f"{why}")
    return None






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
                            f"{_line(n, 60)}); the attention adds it to its scores, and vLLM's CPU attention adds "
                            "no such bias (ALiBi slopes only; FlexAttention's score_mod, the one backend hook for it, "
                            "does not run in the CPU build)")
    return None




# ------------------------------------------------------------------ the model's inputs, the layers' lists, summed scores
MEDIA_INPUTS = ("pixel", "image", "audio", "video", "patches")


def media_inputs(sources: dict, config: dict) -> str | None:
    """A causal-LM class whose forward takes image, audio or video inputs, every such class of the file (Fuyu's
    image_patches, which its vision_embed_tokens projects into the token sequence): a multimodal model.

    An input counts where some computation on the branches config.json runs reads it: Ming's Bailing MoE takes
    image_start_indices and hands them down to its MoE blocks, which read them only under `if self.multi_gate:`
    (config.multi_gate, false for a text checkpoint); such inputs, only handed on or read on branches config.json
    turns off, are no media inputs of this checkpoint and a text port computes what the model does."""
    found = []
    for file, tree in sourcecode._parsed(sources):
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("ForCausalLM")):
            forward = _method(cls, "forward")
            if forward is None:
                continue
            media = [a.arg for a in forward.args.args + forward.args.kwonlyargs
                     if any(word in a.arg for word in MEDIA_INPUTS)]
            read = _media_read(tree, config) if media else None
            found.append((cls.name, media if read else [], file, forward, read))
    if not found or not all(media for _, media, _, _, _ in found):
        return None
    name, media, file, forward, read = found[0]
    return (f"a multimodal model: {name}.forward takes {', '.join(media)} ({_where(file, forward)}; read at "
            f"{file}:{read.lineno}: {_line(read, 50)}), inputs a text decoder's port has no place for")


def _media_named(name: str) -> bool:
    return any(word in name for word in MEDIA_INPUTS)


def _media_read(tree: ast.Module, config: dict) -> ast.AST | None:
    """The first place in the file where a media-named parameter's value is read on a branch config.json may run,
    other than handed on to a parameter of the same kind (`image_start_indices=image_start_indices`, or by position to
    a method or module of the file whose parameter there is media-named), None where there is none. Branches are
    decided through __init__'s `self.X = config.KEY` (conditions.branch_taken); one it cannot decide counts as run."""
    classes = {c.name: c for c in ast.walk(tree) if isinstance(c, ast.ClassDef)}
    for cls in classes.values():
        init = _method(cls, "__init__")
        assigned = conditions.self_assignments(init)
        for func in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"):
            params = {a.arg for a in func.args.args + func.args.kwonlyargs + func.args.posonlyargs
                      if _media_named(a.arg)}
            if not params:
                continue
            handed: set[int] = set()
            for node, tests in conditions.guarded(func.body):
                if isinstance(node, ast.Call):
                    handed |= _handed_on(node, params, cls, assigned, classes)
                if isinstance(node, ast.Dict):  # `{"image_start_indices": image_start_indices}`: the next call's inputs
                    handed |= {id(v) for k, v in zip(node.keys, node.values)
                               if isinstance(k, ast.Constant) and isinstance(k.value, str) and _media_named(k.value)
                               and isinstance(v, ast.Name) and v.id in params}
                if not (isinstance(node, ast.Name) and node.id in params and isinstance(node.ctx, ast.Load)):
                    continue
                if id(node) in handed or conditions.branch_taken(tests, assigned, config) is False:
                    continue
                return node
    return None


def _handed_on(call: ast.Call, params: set[str], cls: ast.ClassDef, assigned: dict, classes: dict) -> set[int]:
    """ids of the media-named names `call` hands to a parameter of the same kind."""
    out = {id(k.value) for k in call.keywords
           if k.arg and _media_named(k.arg) and isinstance(k.value, ast.Name) and k.value.id in params}
    # The FunctionDefs the call may run: a method of the class, or the forward of a module it builds (each class of
    # `A(...) if COND else B(...)`; one whose forward cannot take this many arguments is not the one called).
    targets = []
    if isinstance(call.func, ast.Attribute) and _dotted(call.func.value) == "self":
        method = _method(cls, call.func.attr)
        built = assigned.get(call.func.attr)
        if method is not None:
            targets = [method]
        elif built is not None:
            branches = [built]
            while any(isinstance(b, ast.IfExp) for b in branches):
                branches = [x for b in branches for x in ((b.body, b.orelse) if isinstance(b, ast.IfExp) else (b,))]
            for b in branches:
                sub = classes.get(_dotted(b.func).rsplit(".", 1)[-1]) if isinstance(b, ast.Call) else None
                forward = _method(sub, "forward") if sub is not None else None
                if forward is None:
                    return out  # a module the file does not define, or not a constructor: not followed
                targets.append(forward)
    takes = []
    for target in targets:
        names = [a.arg for a in target.args.posonlyargs + target.args.args]
        names = names[1:] if names[:1] == ["self"] else names
        if len(call.args) <= len(names) or target.args.vararg is not None:
            takes.append(names)
    if not takes:
        return out
    for i, arg in enumerate(call.args):
        if isinstance(arg, ast.Name) and arg.id in params and all(i < len(n) and _media_named(n[i]) for n in takes):
            out.add(id(arg))
    return out


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


# ------------------------------------------------------------------ experts beside the dense MLP
def _three_d_parameters(cls: ast.ClassDef) -> list[str]:
    """self.X = nn.Parameter(torch.<empty|zeros|ones|randn>(a, b, c)) in __init__: experts stored one 3-D tensor per
    projection."""
    init = _method(cls, "__init__")
    out = []
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and isinstance(node.value, ast.Call) and _callee(node.value) == "Parameter" and node.value.args
                and isinstance(node.value.args[0], ast.Call) and len(node.value.args[0].args) == 3):
            out.append(node.targets[0].attr)
    return out


def experts_beside_mlp(sources: dict, config: dict) -> str | None:
    """A decoder layer that runs a mixture of experts of its own beside its dense MLP and adds the two (Gemma 4's
    enable_moe_block: self.mlp and self.experts, routed by self.router, each normed, summed): the port's layer has
    one feed-forward block, dense or routed. Read from what the layer's forward computes (layerinputs' symbolic
    reading, on the branches config.json decides)."""
    layer = _decoder_layer(sources)
    if layer is None or _method(layer[1], "forward") is None:
        return None
    file, cls = layer
    classes = _classes(sources)
    built = _built(cls)
    experts = {attr for attr, (name, _line_no) in built.items()
               if name in classes and _three_d_parameters(classes[name][1])}
    if not experts:
        return None
    sym = layerinputs._Sym(cls, file, sources, config, set())
    forward = _method(cls, "forward")
    out = sym.body(forward.body, {a.arg: ("param", a.arg) for a in forward.args.args if a.arg != "self"}, 0)
    if out is None:
        return None
    modules = {t[1] for t in layerinputs._subterms(out) if t[0] == "module"}
    for attr in sorted(experts & modules):
        for term in layerinputs._subterms(out):
            if term[0] != "add":
                continue
            sides = [{t[1] for t in layerinputs._subterms(side) if t[0] in ("module", "linear")} for side in term[1:]]
            for one, other in (sides, sides[::-1]):
                dense = sorted(m for m in other - one - experts if m in built and built[m][0] in classes
                               and not _three_d_parameters(classes[built[m][0]][1])
                               and m not in _attention_attrs(cls, sources))
                if attr in one and attr not in other and dense:
                    # Ported where the layer computes the form scaffold.detect.parallelmoe reads (Gemma 4's); the
                    # router, over the checkpoint's tensors, is read by the layout detector.
                    read = parallelmoe.read(sources, config, layer, None)
                    if isinstance(read, parallelmoe.ParallelMoe):
                        return None
                    return (f"a mixture of experts beside the dense MLP in each decoder layer: {cls.name}.forward "
                            f"({file}:{forward.lineno}) adds what self.{attr} ({built[attr][0]}, {file}:"
                            f"{built[attr][1]}) computes to what self.{dense[0]} ({built[dense[0]][0]}) computes, "
                            f"otherwise than the port's experts beside the dense MLP: {read}")
    return None


def _attention_attrs(cls: ast.ClassDef, sources: dict) -> set[str]:
    attention = _attention_classes(sources)
    return {attr for attr, (name, _n) in _built(cls).items() if name in attention}


def appended_keys(sources: dict, config: dict) -> str | None:
    """Keys and values extended by what a module of the attention computes (DeepSeek-V4's compressed entries: its
    compressor pools blocks of earlier tokens into entries the attention also attends over): in the forward of a
    class computing attention, `kv = torch.cat([kv, m], ...)` with kv handed to the attention call and m what a call
    of a module of its own (`self.X(...)`) returned. Read from the values, not from names."""
    classes = _classes(sources)
    for name in sorted(_attention_classes(sources, direct=True)):
        file, cls = classes[name]
        forward = _method(cls, "forward")
        if forward is None:
            continue
        attended = {a.id for call in subtree(forward) if isinstance(call, ast.Call) and _callee(call) in ATTENTION_CALLS
                    for a in [*call.args, *(k.value for k in call.keywords)] if isinstance(a, ast.Name)}
        first = forward.args.args[1].arg if len(forward.args.args) > 1 else None
        module_out: dict[str, str] = {}  # a name -> the self.X whose call returned it
        for stmt in _statements(forward.body):
            if not isinstance(stmt, ast.Assign) or len(stmt.targets) != 1:
                continue
            value, target = stmt.value, stmt.targets[0]
            # A module of its own reading the attention's input itself (not a norm of projected keys).
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                    and _dotted(value.func.value) == "self" and any(
                        isinstance(a, ast.Name) and a.id == first for a in value.args):
                for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                    if isinstance(t, ast.Name):
                        module_out[t.id] = value.func.attr
                continue
            if not (isinstance(target, ast.Name) and target.id in attended and isinstance(value, ast.Call)
                    and _callee(value) in ("cat", "concat", "concatenate") and value.args
                    and isinstance(value.args[0], (ast.List, ast.Tuple))):
                continue
            parts = [e.id for e in value.args[0].elts if isinstance(e, ast.Name)]
            added = [p for p in parts if p in module_out and p != target.id]
            own = [p for p in parts if p not in added]
            if own and added:
                module = module_out[added[0]]
                init = _method(cls, "__init__")
                built = next((n for n in subtree(init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                              and _dotted(n.targets[0]) == f"self.{module}"), None) if init else None
                how = f"; self.{module} built at {file}:{built.lineno}: {_line(built, 120)}" if built else ""
                return (f"keys and values from a module of the attention: {name}.forward appends what "
                        f"self.{module} returns ({added[0]}) to {own[0]}, the keys and values it "
                        f"attends over ({file}:{stmt.lineno}: {_line(stmt, 60)}{how}); the port's attention "
                        "attends over the keys and values each token stores in the KV cache")
    return None


FINDERS = (bidirectional_by_config, bidirectional_by_fill, media_inputs, repeated_stack, hashed_keys, reversible_residual,
           hyper_connections, parallel_lists, several_attentions, summed_scores, dynamic_mask, residual_scales,
           relative_position_bias, experts_beside_mlp, embedded_experts, appended_keys)
