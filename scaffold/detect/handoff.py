"""Keys and values one layer's attention hands the next layers through the model's loop (cross-layer attention).

Hunyuan-Large's model loop keeps a local (`prev_kv_states = None` before the loop), passes it to every layer's
call (`decoder_layer(..., kv_states=prev_kv_states)`) and sets it from what a layer returns under a test of the
layer's index (`if self.cla and layer_idx % self.cla_share_factor == 0: prev_kv_states = layer_outputs[-1]`); the
decoder layer passes it to its attention and returns the attention's last output; the attention uses it, in the
layers whose __init__ builds no k_proj / v_proj, in place of its own projections, and returns what it computed
(or was handed) before its rotary embedding and its key norm.

Nothing here reads those names. From the code:
- the model's loop over the decoder layers: a local set to None before the loop, passed to the layer's call (not
  as its first argument, the hidden states) and set inside the loop from the call's result (`out[k]`, directly or
  through another local), under tests run over numbers for each layer's index (the model's __init__ gives `self`);
  so for each layer, the earlier layer whose output it is handed, or none;
- the decoder layer's forward: the parameter that call fills is passed on to the attention, and the item of the
  decoder layer's output the loop reads is a name unpacked from the attention's result, at a position;
- the attention's forward is run by dataflow's interpreter per layer (its branches decided by that layer's `self`,
  as kvshare.py does, and by whether the layer is handed something: `x is not None`, `isinstance(x, tuple)`); what
  it is handed is tagged with the layer it comes from, what passes a rotary call is tagged `#rotary`, what passes
  a module of the attention's own (a norm) `#name`.

A layer handed keys and values that its attention takes is KV sharing where what it attends over is exactly what
the source layer's attention took (what vLLM's shared KV cache holds): the steps the source applies after handing
its keys (values) off are the steps the sharing layer applies to them, and none of those steps holds weights of its
own (the rotary, computed alike in every layer: a key norm with weights would be the sharing layer's own over the
source's keys, which the cache does not hold). Anything else is refused naming why.
"""

from __future__ import annotations

import ast
import copy

from scaffold.detect import conditions, dataflow, kvshare
from scaffold.detect.dataflow import EMPTY, ROTARY_CALL, Origin, Tup, Undecided, _flat, _where
from scaffold.detect.evaluate import CannotEvaluate
from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _dotted, subtree

_ERRORS = (CannotEvaluate, *kvshare._VALUE_ERRORS)


class Handoff:
    """What the model's loop hands from layer to layer: per layer the layer whose output it is given (or None),
    the keyword the layer's call takes it by, the item of the layer's output read, FILE:LINE of the loop."""

    def __init__(self, given: list, keyword: str, index: int, where: str, config_keys: set):
        self.given, self.keyword, self.index, self.where, self.config_keys = given, keyword, index, where, config_keys


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _is_layers(node: ast.expr, list_attr: str) -> bool:
    """`self.layers` (or `self.layers[: n]`) as the loop's iterable or enumerate's argument."""
    if isinstance(node, ast.Call) and _dotted(node.func) == "enumerate" and node.args:
        node = node.args[0]
    if isinstance(node, ast.Subscript):
        node = node.value
    return _dotted(node) == f"self.{list_attr}"


def model_loop(sources: dict, config: dict, list_attr: str) -> Handoff | str | None:
    """The model loop's handoff (see the module's docstring); None where no loop hands a layer's output to later
    layers; a reason where one does but is not followed."""
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or not 0 < layers <= kvshare.MAX_LAYERS:
        return None
    for file, tree in dataflow._parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            forward = _method(cls, "forward")
            if forward is None:
                continue
            for loop in (n for n in subtree(forward) if isinstance(n, ast.For) and _is_layers(n.iter, list_attr)):
                found = _read_loop(sources, config, file, cls, forward, loop, layers)
                if found is not None:
                    return found
    return None


def _read_loop(sources, config, file, cls, forward, loop: ast.For, layers: int) -> Handoff | str | None:
    target = loop.target
    if isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(e, ast.Name) for e in target.elts):
        index_var, layer_var = target.elts[0].id, target.elts[1].id
    elif isinstance(target, ast.Name):
        index_var, layer_var = None, target.id
    else:
        return None
    # Locals set to None before the loop.
    before = {t.id for n in forward.body if isinstance(n, ast.Assign) and n.lineno < loop.lineno
              and isinstance(n.value, ast.Constant) and n.value.value is None
              for t in n.targets if isinstance(t, ast.Name)}
    calls = [n for n in subtree(loop) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
             and isinstance(n.value.func, ast.Name) and n.value.func.id == layer_var and len(n.targets) == 1
             and isinstance(n.targets[0], (ast.Name, ast.Tuple))]
    for assign in calls:
        call, target = assign.value, assign.targets[0]
        # The locals the call is handed: by keyword, or by position after the hidden states (an int: the position).
        handed = {k.value.id: k.arg for k in call.keywords if k.arg and isinstance(k.value, ast.Name)
                  and k.value.id in before}
        handed.update({a.id: n for n, a in enumerate(call.args) if n and isinstance(a, ast.Name) and a.id in before})
        for local, keyword in handed.items():
            # Where the loop sets it: from `result[k]` (or a name unpacked from the call's result at k), directly or
            # through another local, under tests.
            if isinstance(target, ast.Name):
                result, items = target.id, {target.id: None}
            else:
                result = None
                items = {e.id: n - len(target.elts) for n, e in enumerate(target.elts) if isinstance(e, ast.Name)}
            sets = []  # (the tests around it, the item index)

            def walk(body, tests):
                for stmt in body:
                    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                        name, value = stmt.targets[0].id, stmt.value
                        index = None
                        if result is not None and isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
                                and value.value.id == result and isinstance(value.slice, (ast.Constant, ast.UnaryOp)):
                            try:
                                index = ast.literal_eval(value.slice)
                            except ValueError:
                                index = None
                        elif isinstance(value, ast.Name) and value.id in items:
                            index = items[value.id]
                        if name == local:
                            sets.append((tuple(tests), index, stmt.lineno))
                        elif index is not None and not tests:
                            items[name] = index
                    elif isinstance(stmt, ast.If):
                        walk(stmt.body, [*tests, (stmt.test, True)])
                        walk(stmt.orelse, [*tests, (stmt.test, False)])
            walk(loop.body, [])
            if result is None and local in items:
                sets.append(((), items[local], assign.lineno))
            if not sets:
                continue
            where = _where(file, loop.lineno, f"{cls.name}.forward's loop over the layers hands `{local}`")
            if any(index is None or not isinstance(index, int) for _t, index, _l in sets) or len(
                    {index for _t, index, _l in sets}) != 1:
                return f"{where}: set from something other than one item of the layer's output"
            index = sets[0][1]
            init = _method(cls, "__init__")
            functions = {n.name: n for _f, t in dataflow._parsed(sources) for n in t.body
                         if isinstance(n, ast.FunctionDef)}
            reads = kvshare._Reads(config)
            try:
                me, reader = kvshare.layer_self(functions, init, reads, 0) if init is not None else (None, None)
            except _ERRORS as exc:
                return f"{where}: {cls.name}.__init__ is not followed ({exc})"
            if me is not None:
                me.attrs.setdefault("config", kvshare._config_obj(reads))
            given, holder = [], None
            for i in range(layers):
                given.append(holder)
                for tests, _index, line in sets:
                    holds = True
                    for test, polarity in tests:
                        env = {"self": me, "config": kvshare._config_obj(reads)}
                        if index_var:
                            env[index_var] = i
                        try:
                            reader.steps = 0
                            value = bool(reader.expr(copy.deepcopy(test), env)) if reader else None
                        except _ERRORS as exc:
                            return f"{where}: the test `{ast.unparse(test)}` (line {line}) is not followed ({exc})"
                        if value is None or value != polarity:
                            holds = False
                            break
                    if holds:
                        holder = i
            # The config.json keys the tests follow: read directly, or through what __init__ assigns to `self`.
            keys = set()
            assigned = dataflow._init_assignments(init)
            for tests, _index, _line in sets:
                for test, _polarity in tests:
                    for node in ast.walk(test):
                        if isinstance(node, ast.Attribute) and _dotted(node.value) == "self" and node.attr in assigned:
                            node = assigned[node.attr]
                        for sub in ast.walk(node):
                            if isinstance(sub, ast.Attribute) and _dotted(sub.value).endswith("config") \
                                    and sub.attr in config:
                                keys.add(sub.attr)
            return Handoff(given, keyword, index, where, keys)
    return None


def _decoder_passes(sources, keyword: str | int, index: int, list_attr: str) -> tuple[str, str | int, int] | str:
    """(the attention's attribute, the attention forward's parameter it is passed as: a name or a position, the
    position of the attention's result the decoder layer returns at `index`), or a reason. `keyword`: the decoder
    layer forward's parameter the loop fills, by name or position (after the hidden states)."""
    found = dataflow.layer_class(sources, list_attr)
    if found is None:
        return "no decoder layer class is found"
    file, cls, _ = found
    forward = _method(cls, "forward")
    params = [a.arg for a in forward.args.args[1:]] if forward is not None else []
    if isinstance(keyword, int):
        keyword = params[keyword] if keyword < len(params) else None
    if forward is None or keyword not in params + [a.arg for a in forward.args.kwonlyargs]:
        return f"{file}:{cls.lineno}: {cls.name}.forward takes no such parameter"
    attn_call = None
    for node in subtree(forward):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Tuple):
            call = node.value
            passed = [k.arg for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id == keyword]
            passed += [n for n, a in enumerate(call.args) if isinstance(a, ast.Name) and a.id == keyword]
            name = _dotted(call.func)
            if passed and name.startswith("self.") and name.count(".") == 1:
                attn_call = (name[5:], passed[0], node)
    if attn_call is None:
        return _where(file, forward.lineno, f"{cls.name}.forward passes `{keyword}` to no module whose result it unpacks")
    attr, param, node = attn_call
    names = [e.id if isinstance(e, ast.Name) else None for e in node.targets[0].elts]
    returns = [s for s in subtree(forward) if isinstance(s, ast.Return)]
    ret = returns[0] if len(returns) == 1 else None
    value = None
    if ret is not None and isinstance(ret.value, ast.Tuple):  # return hidden_states, kv_states
        elts = ret.value.elts
        value = elts[index] if -len(elts) <= index < len(elts) else None
    elif ret is not None and isinstance(ret.value, ast.Name) and index == -1 and ret in forward.body:
        # `return outputs` with `outputs += (kv_states,)` (or `outputs = (..., kv_states)`) the last before it
        out = ret.value.id
        last = next((s for s in reversed(forward.body[:forward.body.index(ret)])
                     if isinstance(s, (ast.Assign, ast.AugAssign)) and any(
                         isinstance(t, ast.Name) and t.id == out for t in
                         (s.targets if isinstance(s, ast.Assign) else [s.target]))), None)
        if last is not None and isinstance(last.value, ast.Tuple) and last.value.elts:
            value = last.value.elts[-1]
    if not (isinstance(value, ast.Name) and value.id in names):
        return _where(file, forward.lineno, f"{cls.name}.forward's output item {index} is not followed to what its "
                                            f"{attr} returns")
    return attr, param, names.index(value.id)


class _HandedRun(kvshare._LayerRun):
    """One layer's attention forward, handed `param` (a pair tagged with the layer it comes from) or nothing."""

    def __init__(self, *args, param: str, handed: int | None):
        super().__init__(*args)
        self.param, self.handed = param, handed

    def condition(self, test: ast.expr) -> bool | None:
        names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
        if self.param not in names:
            return super().condition(test)
        given = self.handed is not None
        param = self.param

        class Sub(ast.NodeTransformer):
            def visit_Compare(self, node):
                if (isinstance(node.left, ast.Name) and node.left.id == param and len(node.ops) == 1
                        and isinstance(node.ops[0], (ast.Is, ast.IsNot))
                        and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None):
                    return ast.Constant(given == isinstance(node.ops[0], ast.IsNot))
                return self.generic_visit(node)

            def visit_Call(self, node):
                if _dotted(node.func) == "isinstance" and node.args and isinstance(node.args[0], ast.Name) \
                        and node.args[0].id == param:
                    return ast.Constant(given)
                return self.generic_visit(node)

            def visit_Name(self, node):
                return ast.Constant(given) if node.id == param else node

        resolved = Sub().visit(copy.deepcopy(test))
        try:
            value = self.value_of(resolved)
        except _ERRORS:
            return None
        return bool(value) if isinstance(value, (bool, int, type(None))) else None

    def call(self, node: ast.Call, env: dict):
        out = super().call(node, env)
        name = _dotted(node.func)
        if ROTARY_CALL.search(name.rsplit(".", 1)[-1] if name else "") and _flat(out):
            tag = frozenset({Origin("#rotary")})
            return Tup(tuple(_flat(x) | tag if _flat(x) else x for x in out.items)) if isinstance(out, Tup) \
                else _flat(out) | tag
        return out


def _qkv(events, q_src: str) -> list:
    """(line, q, k, v) of the attention: one call taking the three (sdpa, an attention function), else the two
    products an eager attention writes (q @ k^T, then the weights @ v)."""
    calls = kvshare._attention_args(events, q_src)
    if calls:
        return calls
    scores = [(line, left, right) for line, left, right in events.matmuls
              if q_src in {o.src for o in left} and q_src not in {o.src for o in right}]
    if not scores:
        return []
    line, q, k = min(scores, key=lambda s: s[0])  # the scores; a later product of them with the values
    mixed = [(l2, right) for l2, left, right in events.matmuls if l2 > line and {o.src for o in q} <= {o.src for o in left}
             and q_src not in {o.src for o in right}]
    return [(line, q, k, mixed[0][1])] if len(mixed) == 1 else []


def read(sources: dict, config: dict, list_attr: str, weighted) -> kvshare.LayerSources | str | None:
    """Per layer, whose keys and values its attention takes when the model's loop hands them (module docstring).
    `weighted(layer, module)`: whether the checkpoint holds tensors of that attention module in that layer. None
    where no loop hands anything or no layer takes what it is handed."""
    loop = model_loop(sources, config, list_attr)
    # Anything not followed up to the attention's keys and values is no reading of this form: None (a layer
    # building no k_proj is then refused by attention.py, naming the config that decides it).
    if loop is None or isinstance(loop, str):
        return None
    passes = _decoder_passes(sources, loop.keyword, loop.index, list_attr)
    if isinstance(passes, str) or all(j is None for j in loop.given):
        return None
    attr, param, position = passes
    found = dataflow.layer_class(sources, list_attr)
    init = _method(found[1], "__init__")
    value = dataflow._init_assignments(init).get(attr)
    sub = dataflow._submodule_class(sources, conditions.selected(value, config) or value) if value is not None \
        else None
    if sub is None:
        return None
    file, cls = sub
    producers = set(dataflow.linears(file, cls, set(linear_classes(sources))))
    a_init, a_forward = _method(cls, "__init__"), _method(cls, "forward")
    if a_init is None or a_forward is None:
        return None
    params = [a.arg for a in a_forward.args.args[1:]]
    if isinstance(param, int):
        param = params[param] if param < len(params) else None
    if param not in params:
        return None
    functions = {n.name: n for _f, t in dataflow._parsed(sources) for n in t.body if isinstance(n, ast.FunctionDef)}
    reads = kvshare._Reads(config, set())
    runs, returned = [], []
    for i, j in enumerate(loop.given):
        try:
            me, reader = kvshare.layer_self(functions, a_init, reads, i)
        except _ERRORS:
            return None
        run = _HandedRun(sources, file, cls, producers, reads, i, me, reader, {}, set(), set(),
                         param=param, handed=j)
        args = [Tup((frozenset({Origin(f"@{j}.0")}), frozenset({Origin(f"@{j}.1")}))) if p == param and j is not None
                else EMPTY for p in params]
        try:
            out = run.run_method("forward", args)
        except Undecided:
            return None
        runs.append(run)
        item = out.items[position] if isinstance(out, Tup) and len(out.items) > position else None
        returned.append(item.items if isinstance(item, Tup) and len(item.items) == 2 else None)
    # The queries' projection: the one projection whose output the attention takes in every layer handed keys and
    # values (a layer that takes them calls no keys' or values' projection; the output's takes the result).
    seen = None
    for i, run in enumerate(runs):
        if loop.given[i] is not None:
            taken = {o.src for _l, args in run.events.calls for a in args for o in a} | {
                o.src for _l, left, right in run.events.matmuls for o in left | right}
            seen = taken & producers if seen is None else seen & taken
    q_src = next(iter(seen)) if seen and len(seen) == 1 else None
    where = _where(file, a_forward.lineno, f"{cls.name}.forward")
    kinds, notes = [], []
    for i, run in enumerate(runs):
        if loop.given[i] is None:
            kinds.append("own")  # handed nothing: its attention is read as every layer's is
            continue
        calls = _qkv(run.events, q_src) if q_src else []
        if len(calls) != 1:
            return None  # no one attention read
        _line, _q, k, v = calls[0]
        src_k = {o.src for o in k if o.src.startswith("@")}
        src_v = {o.src for o in v if o.src.startswith("@")}
        if not src_k and not src_v:
            kinds.append("own")
            continue
        j = loop.given[i]
        if src_k != {f"@{j}.0"} or src_v != {f"@{j}.1"}:
            return (f"{where} (layer {i}): takes {sorted(src_k) or 'its own keys'} and {sorted(src_v) or 'its own values'}"
                    f" of what layer {j} hands ({loop.where}), not its keys and values both")
        # Follow a layer that hands on what it was handed to the layer that computed it.
        while j is not None and kinds[j] != "own":
            j = kinds[j]
        if j is None or returned[loop.given[i]] is None:
            return f"{where} (layer {i}): what it is handed is not a pair of keys and values layer {j} computed"
        source_calls = _qkv(runs[j].events, q_src)
        if len(source_calls) != 1:
            return f"{where} (layer {j}): no one attention takes the queries"
        _l, _qj, k_j, v_j = source_calls[0]
        for what, mine, theirs, handed in (("keys", k, k_j, returned[loop.given[i]][0]),
                                           ("values", v, v_j, returned[loop.given[i]][1])):
            handed_path = {o.src for o in handed}
            after_source = {o.src for o in theirs} - handed_path
            after_mine = {o.src for o in mine} - {f"@{loop.given[i]}.{0 if what == 'keys' else 1}"}
            if not handed_path <= {o.src for o in theirs}:
                return (f"{where} (layer {i}): layer {j} hands {what} through {sorted(handed_path)}, which are not "
                        f"the {what} its attention takes ({sorted(o.src for o in theirs)})")
            own_weights = sorted(m[1:] for m in after_mine if m.startswith("#") and m != "#rotary" and weighted(i, m[1:]))
            if own_weights:
                def steps(path):
                    return " and ".join(sorted(f"layer {i if m[1:] in own_weights else j}'s own {m[1:]}"
                                               if m != "#rotary" and weighted(i, m[1:]) else m[1:]
                                               for m in path if m.startswith("#"))) or "nothing"
                made = sorted(p for p in handed_path if not p.startswith(("#", "@")))
                return (f"{where} (layer {i}): layer {i} takes the {what} layer {j} hands it ({loop.where}) as "
                        f"{' and '.join(made) or 'layer ' + str(j)} gave them (before the handoff: "
                        f"{steps(handed_path)}) and applies {steps(after_mine)} "
                        f"to them, while layer {j}'s attention, whose KV cache a shared layer reads, takes them "
                        f"through {steps(after_source).replace(f'layer {i}', f'layer {j}')}: vLLM's shared KV cache "
                        f"(kv_sharing_target_layer_name) would give layer {i} layer {j}'s {what}, not these")
            if after_mine != after_source:
                return (f"{where} (layer {i}): layer {i} applies {sorted(after_mine)} to the {what} layer {j} hands it "
                        f"({loop.where}), layer {j}'s attention {sorted(after_source)} after handing them: they do not "
                        f"attend over the same {what}")
            if len([s for s in after_mine if s.startswith("#")]) > 1:
                return (f"{where} (layer {i}): the {what} pass {sorted(after_mine)} after the handoff; their order is "
                        "not read")
        kinds.append(j)
        notes.append(f"{i} <- {j}")
    if all(k == "own" for k in kinds):
        return None
    keys = tuple(sorted(reads.asked | loop.config_keys))
    return kvshare.LayerSources(tuple(kinds), f"{where}: layer(s) {', '.join(notes)} attend over the keys and values "
                                              f"the source layer's attention takes, handed through the model's loop",
                                loop.where, keys)
