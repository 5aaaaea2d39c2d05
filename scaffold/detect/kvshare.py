"""Where each layer's attention takes its keys and values from, as the code computes them layer by layer.

Gemma 4's last `num_kv_shared_layers` layers compute no keys or values of their own: an earlier layer puts the
keys and values it hands its attention into a dict the model passes to every layer (`shared_kv_states[layer_type]
= key_states, value_states` under `self.store_full_length_kv`), and a shared layer reads them back under
`self.is_kv_shared_layer`. With `attention_k_eq_v`, its full-attention layers build no v_proj and take the keys'
projection as values (`value_states = key_states` before the key norm and the rotary embedding).

Nothing here reads those names. For every layer of config.json, in order:
- the attention's __init__ is run over numbers (`evaluate.py`) with the config and the layer's index: what it
  computes (flags, strings, which modules it builds, None for one it does not) is that layer's `self`; a
  statement the interpreter does not follow leaves what it assigns unknown;
- its forward is run by dataflow's interpreter, every branch decided by those values (a branch that stays
  undecided is taken both ways, as dataflow does); every module call tags what it returns with the module, a
  value read from the rotary argument carries that argument, so what reaches the attention call says through
  which projection, modules and rotary it came;
- an item stored into a forward argument (`state[key] = k, v`) is kept, under the key the layer computes, in one
  store all layers share (the model hands every layer the same object: `shared_argument` checks the decoder layer
  and the model loop pass it through unchanged); an item read from it is the value of the layer that stored it.

Each layer is then one of: its own keys and values (the layer the others are compared with), the keys'
projection used as values through the very steps the values take in the own layers (`k_eq_v`), or the keys and
values another layer handed its own attention (`shared`, with that layer). Anything else is refused naming the
attention call's line.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace

from scaffold.detect import conditions, dataflow
from scaffold.detect.dataflow import EMPTY, Origin, Tup, Undecided, _flat, _where
from scaffold.detect.evaluate import CannotEvaluate, Interpreter, Obj, Sentinel
from scaffold.detect.linears import linear_classes
from scaffold.detect.sourcecode import _dotted, subtree

UNKNOWN = Sentinel("not followed")
MAX_LAYERS = 512


@dataclass(frozen=True)
class _Module:
    """A module __init__ builds (its class as written, the line)."""

    cls: str
    line: int


@dataclass(frozen=True)
class LayerSources:
    """Per layer: "own", "k_eq_v" or the index of the layer whose keys and values it reads."""

    kinds: tuple  # per layer: "own" | "k_eq_v" | int
    evidence: str  # FILE:LINE of the attention call and what was read
    store_line: str  # FILE:LINE where the source layers store their keys and values ("" without sharing)
    # The top-level config.json keys the reading asked for (present or not), sorted: the kinds follow from them
    config_keys: tuple = ()

    @property
    def shared(self) -> dict[int, int]:
        return {i: k for i, k in enumerate(self.kinds) if isinstance(k, int)}

    @property
    def k_eq_v(self) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == "k_eq_v"]


class _InitReader(Interpreter):
    """The attention's __init__ over numbers: classes it calls are modules (opaque), a statement it cannot run
    leaves what it assigns UNKNOWN; reading an UNKNOWN is itself not followed."""

    def __init__(self, functions: dict):
        super().__init__(functions)

    def stmt(self, stmt: ast.stmt, env: dict):
        if isinstance(stmt, (ast.Assert, ast.Raise)):
            return None
        try:
            return super().stmt(stmt, env)
        except (CannotEvaluate, *_VALUE_ERRORS):
            for node in subtree(stmt):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                    node, (ast.AnnAssign, ast.AugAssign)) else []
                for target in targets:
                    for t in ast.walk(target):
                        if isinstance(t, ast.Attribute) and _dotted(t.value) == "self" and isinstance(
                                env.get("self"), Obj):
                            env["self"].attrs[t.attr] = UNKNOWN
                        elif isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store):
                            env[t.id] = UNKNOWN
            return None

    def attribute(self, node: ast.Attribute, env: dict):
        value = super().attribute(node, env)
        if value is UNKNOWN:
            raise CannotEvaluate(f"line {node.lineno}: {ast.unparse(node)} is not followed")
        return value

    def name(self, node: ast.Name, env: dict):
        value = env.get(node.id, None) if node.id in env else None
        if value is UNKNOWN:
            raise CannotEvaluate(f"line {node.lineno}: {node.id} is not followed")
        return super().name(node, env)

    def call(self, node: ast.Call, env: dict):
        func = node.func
        short = _dotted(func).rsplit(".", 1)[-1]
        if isinstance(func, ast.Attribute) and func.attr == "__init__" or isinstance(func, ast.Name) and (
                func.id == "super"):
            return Obj(name="super")
        if short[:1].isupper() and not (isinstance(func, ast.Name) and func.id in env):
            return _Module(_dotted(func), node.lineno)  # a module (nn.Linear, a norm class, nn.Buffer)
        return super().call(node, env)


_VALUE_ERRORS = (ValueError, TypeError, KeyError, IndexError, ZeroDivisionError, AttributeError)


class _Reads(dict):
    """config.json's values, recording each top-level key the reading asks for (present or not): the per-layer
    sources follow from those, so a port checks them against the config it is served with."""

    def __init__(self, config: dict, asked: set | None = None):
        super().__init__(config)
        self.asked = getattr(config, "asked", set()) if asked is None else asked

    def __getitem__(self, key):
        self.asked.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.asked.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.asked.add(key)
        return super().__contains__(key)


def _config_obj(config: dict) -> Obj:
    def convert(value):
        if isinstance(value, dict):
            return Obj({k: convert(v) for k, v in value.items()}, "config")
        if isinstance(value, list):
            return [convert(v) for v in value]
        return value
    obj = Obj({}, "config")
    # The top level records what the attention's __init__ reads (nested configs are read whole).
    obj.attrs = _Reads({k: convert(v) for k, v in dict.items(config)}, getattr(config, "asked", None))
    return obj


def layer_self(functions: dict, init: ast.FunctionDef, config: dict, layer: int) -> tuple[Obj, _InitReader]:
    """`self` as the attention's __init__ leaves it in layer `layer` (UNKNOWN where not followed)."""
    reader = _InitReader(functions)
    me = Obj({}, "self")
    params = [a.arg for a in init.args.args]
    env: dict = {params[0]: me}
    rest = params[1:]
    defaults = dict(zip(rest[len(rest) - len(init.args.defaults):], init.args.defaults))
    is_config = [p for p in rest if p in ("config", "cfg", "conf") or p.endswith("config")]
    # The layer's index: a parameter named so, else the one other parameter without a default.
    plain = [p for p in rest if p not in defaults and p not in is_config]
    index = [p for p in rest if any(w in p for w in ("layer", "idx", "index", "depth"))] or (
        plain if len(plain) == 1 else [])
    for p in rest:
        if p in is_config:
            env[p] = _config_obj(config)
        elif p in index:
            env[p] = layer
        elif p in defaults:
            try:
                env[p] = reader.evaluate(defaults[p], {})
            except CannotEvaluate:
                env[p] = UNKNOWN
        else:
            env[p] = UNKNOWN
    reader.steps = 0
    reader.block(init.body, env)
    return me, reader


class _LayerRun(dataflow.Interpreter):
    """dataflow's interpreter over one layer's forward, its branches decided by that layer's `self`."""

    def __init__(self, sources, file, cls, producers, config, layer: int, me: Obj, reader: _InitReader,
                 store: dict, containers: set, rotary: set):
        super().__init__(sources, file, cls, producers, config)
        self.layer, self.me, self.reader = layer, me, reader
        self.store, self.containers, self.rotary = store, containers, rotary
        self.stored: list = []  # (line, container, key, value)
        self.read: list = []  # (line, container, key, the layer that stored it or None)
        self.unread: list = []  # (line, what) of a key not computed

    def value_of(self, node: ast.expr):
        self.reader.steps = 0
        return self.reader.expr(node, {"self": self.me, "config": _config_obj(self.config)})

    def condition(self, test: ast.expr) -> bool | None:
        try:
            value = self.value_of(test)
        except (CannotEvaluate, *_VALUE_ERRORS):
            return super().condition(test)
        if isinstance(value, (bool, int, str, _Module, type(None), list, tuple)) and value is not UNKNOWN:
            return bool(value)
        return super().condition(test)

    def _key(self, node: ast.Subscript):
        try:
            key = self.value_of(node.slice)
        except (CannotEvaluate, *_VALUE_ERRORS) as exc:
            self.unread.append((node.lineno, f"the key `{ast.unparse(node.slice)}` is not computed ({exc})"))
            return UNKNOWN
        return key if isinstance(key, (str, int, tuple)) else UNKNOWN

    def assign(self, target, value, source, env) -> None:
        if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name) \
                and target.value.id in self.containers:
            key = self._key(target)
            if self.branch:
                self.unread.append((target.lineno, "an item stored under a branch this layer's values do not "
                                                    f"decide (`{ast.unparse(self.branch[-1][0])}`)"))
            self.stored.append((target.lineno, target.value.id, key, value))
            self.store[(target.value.id, key)] = (self.layer, value)
            return
        super().assign(target, value, source, env)

    def subscript(self, node: ast.Subscript, env: dict):
        if isinstance(node.value, ast.Name) and node.value.id in self.containers:
            key = self._key(node)
            held = self.store.get((node.value.id, key))
            self.read.append((node.lineno, node.value.id, key, None if held is None else held[0]))
            if held is None:
                return frozenset({Origin(f"@{node.value.id}[{key!r}] before any layer stored it", line=node.lineno)})
            source, value = held
            items = value.items if isinstance(value, Tup) else (value,)
            return Tup(tuple(frozenset({Origin(f"@{source}.{i}", line=node.lineno)}) for i in range(len(items))))
        return super().subscript(node, env)

    def expr(self, node, env):
        value = super().expr(node, env)
        if isinstance(node, ast.Name) and node.id in self.rotary:
            return frozenset({Origin("@rotary")})
        return value

    def call(self, node: ast.Call, env: dict):
        out = super().call(node, env)
        name = _dotted(node.func)
        short = name[5:] if name.startswith("self.") and name.count(".") == 1 else None
        if short and short not in self.producers and short in self.attr_values and _flat(out):
            # A module of the attention's own (a norm): what it returns is tagged with it.
            return _flat(out) | {Origin(f"#{short}")}
        return out


def _attention_args(events, q_src: str) -> list[tuple[int, frozenset, frozenset, frozenset]]:
    """(line, q, k, v) of the calls taking three derived values, the first from the query's projection."""
    out = []
    for line, args in events.calls:
        # The rotary argument's cos and sin are no values of the attention's.
        derived = [a for a in args if a and {o.src for o in a} != {"@rotary"}]
        if len(derived) >= 3 and q_src in {o.src for o in derived[0]}:
            out.append((line, derived[0], derived[1], derived[2]))
    return out


def _path(value: frozenset, rename: dict | None = None) -> frozenset:
    """What a value came through: projections, modules (#name), the rotary argument, other layers (@i.n)."""
    rename = rename or {}
    return frozenset(rename.get(o.src, o.src) for o in value)


def read(sources: dict, config: dict, list_attr: str | None = None) -> LayerSources | str | None:
    """Per layer, where its attention's keys and values come from (see the module's docstring); None where every
    layer computes its own alike (or the form is not the one read here), a reason (FILE:LINE ...) where the
    layers differ in a way the port does not compute."""
    config = _Reads(config)
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or isinstance(layers, bool) or not 0 < layers <= MAX_LAYERS:
        return None
    found = dataflow.layer_class(sources, list_attr)
    if found is None:
        return None
    _file, cls, _ = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    functions = {n.name: n for _f, tree in dataflow._parsed(sources) for n in tree.body
                 if isinstance(n, ast.FunctionDef)}
    for attr, value in dataflow._init_assignments(init).items():
        sub = dataflow._submodule_class(sources, conditions.selected(value, config) or value)
        if sub is None:
            continue
        producers = set(dataflow.linears(sub[0], sub[1], set(linear_classes(sources))))
        if not producers:
            continue
        whole = dataflow.Interpreter(sources, sub[0], sub[1], producers, config)
        try:
            whole.run_method("forward", [EMPTY, EMPTY, EMPTY])
        except Undecided:
            pass
        if not whole.layer_branches:
            continue
        found = _read_attention(sources, config, sub[0], sub[1], producers, functions, layers, attr)
        return replace(found, config_keys=tuple(sorted(config.asked))) if isinstance(found, LayerSources) \
            else found
    return None


def _read_attention(sources, config, file, cls, producers, functions, layers, attr) -> LayerSources | str:
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    forward = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
    if init is None or forward is None:
        return f"{file}:{cls.lineno}: {cls.name} has no __init__ or forward to read"
    params = [a.arg for a in forward.args.args[1:]]
    rotary = {p for p in params if p in ("cos", "sin") or any(w in p for w in ("position_embeddings", "rotary", "freqs",
                                                                              "cos_sin"))}
    containers = set(params[1:]) - rotary
    store: dict = {}
    runs = []
    for i in range(layers):
        try:
            me, reader = layer_self(functions, init, config, i)
        except (CannotEvaluate, *_VALUE_ERRORS) as exc:
            return f"{file}:{init.lineno}: {cls.name}.__init__ is not followed in layer {i} ({exc})"
        run = _LayerRun(sources, file, cls, producers, config, i, me, reader, store, containers, rotary)
        try:
            run.run_method("forward", [EMPTY] * len(params))
        except Undecided as exc:
            return f"{file}:{forward.lineno}: {cls.name}.forward is not followed in layer {i} ({exc})"
        if run.unread:
            line, what = run.unread[0]
            return _where(file, line, f"{cls.name}.forward in layer {i}: {what}")
        runs.append(run)
    # The layers that compute their own q, k, v from three projections: the reference path of each.
    own = {}
    for i, run in enumerate(runs):
        for line, args in run.events.calls:
            derived = [a for a in args if a]
            if len(derived) < 3:
                continue
            srcs = [{o.src for o in a} & producers for a in derived[:3]]
            if all(len(s) == 1 for s in srcs) and len({next(iter(s)) for s in srcs}) == 3:
                own.setdefault(i, []).append((*(next(iter(s)) for s in srcs), (line, *derived[:3])))
    own = {i: calls[0] for i, calls in own.items() if len(calls) == 1}
    if not own:
        return f"{file}:{forward.lineno}: no layer's {cls.name}.forward takes q, k, v from three projections"
    ref = min(own)
    q_src, k_src, v_src, (line, _q, k_ref, v_ref) = own[ref]
    k_path, v_path = _path(k_ref), _path(v_ref)
    where = _where(file, line, f"{cls.name}.forward's attention call")
    kinds = []
    stored_where = ""
    for i, run in enumerate(runs):
        calls = _attention_args(run.events, q_src)
        if len(calls) != 1:
            return f"{where} (layer {i}): {len(calls)} attention calls take the queries, not one"
        _line, _qv, k, v = calls[0]
        if _path(k) == k_path and _path(v) == v_path:
            kinds.append("own")
        elif _path(k) == k_path and _path(v, {k_src: v_src}) == v_path and v_src not in _path(v):
            # Values through the steps the own layers' values take, from the keys' projection.
            kinds.append("k_eq_v")
        elif (ks := {o.src for o in k}) and len(ks) == 1 and (vs := {o.src for o in v}) and len(vs) == 1 \
                and next(iter(ks)).startswith("@") and next(iter(vs)).startswith("@"):
            kt, vt = next(iter(ks)), next(iter(vs))
            if " before any layer" in kt or " before any layer" in vt:
                return f"{where} (layer {i}): keys and values read {kt[1:]}"
            src_layer, ki = kt[1:].split(".")
            src_layer2, vi = vt[1:].split(".")
            if src_layer != src_layer2:
                return f"{where} (layer {i}): keys and values read from different layers ({src_layer}, {src_layer2})"
            j = int(src_layer)
            held = runs[j].stored
            value = next((val for _l, _c, _k, val in reversed(held)), None)
            items = value.items if isinstance(value, Tup) else ()
            their = _attention_args(runs[j].events, q_src)
            if not (len(their) == 1 and len(items) > max(int(ki), int(vi))
                    and _flat(items[int(ki)]) == their[0][2] and _flat(items[int(vi)]) == their[0][3]
                    and kinds[j] in ("own", "k_eq_v")):
                return (f"{where} (layer {i}): keys and values read from what layer {j} stored, which is not the "
                        "keys and values layer {j} hands its own attention")
            kinds.append(j)
            stored_where = _where(file, held[-1][0], f"layer {j} stores the keys and values its attention takes")
        else:
            return (f"{where} (layer {i}): keys through {sorted(_path(k))}, values through {sorted(_path(v))}; the "
                    f"layers that compute their own take {sorted(k_path)} and {sorted(v_path)}")
    if all(k == "own" for k in kinds):
        return None
    shared = {i: k for i, k in enumerate(kinds) if isinstance(k, int)}
    parts = []
    if shared:
        parts.append("layer(s) " + ", ".join(f"{i} read layer {j}'s keys and values" for i, j in shared.items()))
    keq = [i for i, k in enumerate(kinds) if k == "k_eq_v"]
    if keq:
        parts.append(f"layer(s) {', '.join(map(str, keq))} take the keys' projection {k_src} as values")
    return LayerSources(tuple(kinds), f"{where}: {'; '.join(parts)}", stored_where)


def sizes_by_layer(sources: dict, config: dict, module: str, layers: tuple[int, int]) -> str | None:
    """Where the decoder layer's submodule `module` (its attribute, `mlp`) computes a size from the layer's index
    (Gemma 4's double-wide MLP in its KV-shared layers, `config.intermediate_size * (2 if use_double_wide_mlp
    else 1)`): FILE:LINE and the numbers its __init__ assigns differently in the two layers; None where it assigns
    the same or is not followed."""
    found = dataflow.layer_class(sources, None)
    if found is None:
        return None
    _file, cls, _ = found
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    value = dataflow._init_assignments(init).get(module)
    sub = dataflow._submodule_class(sources, conditions.selected(value, config) or value) if value is not None else None
    if sub is None:
        return None
    file, sub_cls = sub
    sub_init = next((n for n in sub_cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if sub_init is None:
        return None
    functions = {n.name: n for _f, tree in dataflow._parsed(sources) for n in tree.body
                 if isinstance(n, ast.FunctionDef)}
    try:
        selves = [layer_self(functions, sub_init, config, i)[0].attrs for i in layers]
    except (CannotEvaluate, *_VALUE_ERRORS):
        return None
    differ = [a for a, v in selves[0].items() if isinstance(v, int) and not isinstance(v, bool)
              and isinstance(selves[1].get(a), int) and selves[1][a] != v]
    if not differ:
        return None
    lines = {t.attr: node.lineno for node in subtree(sub_init) if isinstance(node, ast.Assign)
             for t in node.targets if isinstance(t, ast.Attribute)}
    a = differ[0]
    return _where(file, lines.get(a, sub_init.lineno),
                  f"{sub_cls.name}.__init__ computes {a} = {selves[0][a]} in layer {layers[0]} and {selves[1][a]} in "
                  f"layer {layers[1]}")
