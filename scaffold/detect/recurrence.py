"""Layer stacks run in cycles (HRM's hierarchical recurrence), read from what the model's forward computes.

A module holding a list of decoder layers (a stack) called inside loops of a model's forward, each call's input a
sum of the forward's states and its output one of those states:

    z_H = embeds;  z_L = self.z_L_init
    for _ in range(config.H_cycles):
        for _ in range(config.L_cycles):
            z_L = self.L_module(z_L + z_H)
        z_H = self.H_module(z_H + z_L)

`read` returns, for the first forward that does so: the loops (their line, the config key bounding each: read
from `range(config.K)`, `range(self.config.K)`, a local or an attribute __init__ copies from the config, or a
`while i < ...` test of one), the stack calls in the order the forward makes them (the stack's class, its layer
list, the config key of its length, the terms summed into its input with `.to(...)` / `.contiguous()` taken off,
the state it assigns, the loops around it) and how each state is first set. Names do not matter: the states are
whatever the calls assign, the stacks whatever classes build a layer list as long as a config value says.

Beside the loops, what else a port of the forward has to compute: the module each stack's forward applies to its
layers' output (HrmTextStack's `return self.final_norm(hidden_states)`; `StackCall.after`), a state whose first
value is a parameter or buffer of the model (HRM's `self.z_L_init`, stored in the checkpoint; `Recurrence.held`),
and the state the forward returns (`Recurrence.result`: `BaseModelOutputWithPast(last_hidden_state=...)`, a plain
`return x`, or a tuple's first item).

`Recurrence.attention_steps(config)` counts the attention calls one forward makes per decoder layer position
(each stack call runs every layer of its list once): what a port needs as many KV caches of (vLLM's hrm_text.py
registers one Attention per (layer, step), sharing the projections).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field, replace

from scaffold.checkpoint import Checkpoint, TensorInfo
from scaffold.detect import renamings
from scaffold.detect.blocks import _method
from scaffold.detect.common import unsupported
from scaffold.detect.formcode import _built, _classes, _layer_lists, _line
from scaffold.detect.sourcecode import _dotted, config_aliases, modeling_sources, subtree, weightless_norms
from scaffold.spec import Source, Spec

PASS_THROUGH = {"to", "contiguous", "clone", "type_as", "float"}


@dataclass(frozen=True)
class Loop:
    head: str  # `for i in range(self.config.H_cycles)`, on one line
    key: str | None  # the config key bounding it, None where the bound is not a config value
    line: int

    def count(self, config: dict) -> int | None:
        value = config.get(self.key) if self.key else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class StackCall:
    attr: str  # self.<attr>
    stack: str  # the class it builds
    layers: str  # that class's layer list attribute
    layer_class: str
    length_key: str | None  # config key of the list's length (`range(config.num_layers_per_stack)`)
    inputs: tuple[str, ...]  # the terms summed into its input
    output: str  # the state it assigns
    loops: tuple[Loop, ...]  # outermost first
    line: int
    after: tuple[str, str, int] | None = None  # (attr, class, line): the module the stack applies after its layers

    def runs(self, config: dict) -> int | None:
        counts = [loop.count(config) for loop in self.loops]
        if None in counts:
            return None
        total = 1
        for n in counts:
            total *= n
        return total


@dataclass(frozen=True)
class Recurrence:
    owner: str  # the class whose forward runs it
    file: str
    loop: Loop  # the outermost loop
    calls: tuple[StackCall, ...]
    initial: dict[str, str] = field(default_factory=dict)  # state -> its first value, on one line
    held: dict[str, tuple[str, str, int]] = field(default_factory=dict)  # state -> (attr, kind, line) of a
    # parameter or buffer of the model its first value reads (kind "parameter" or "buffer")
    result: str | None = None  # the state the forward returns, None where it returns something else

    def attention_steps(self, config: dict) -> int | None:
        """Stack calls per forward (each runs every layer of its stack once): the KV caches per layer position."""
        runs = [call.runs(config) for call in self.calls]
        return None if None in runs else sum(runs)

    def describe(self) -> str:
        """`config.H_cycles cycles of self.L_module (HrmTextStack, on a + b) config.L_cycles times, then
        self.H_module (HrmTextStack, on b + a)`: the stacks and their inputs in parentheses, which the catalogue
        folds out of the feature it counts."""
        parts = []
        for call in self.calls:
            times = " x ".join(f"config.{loop.key}" if loop.key else f"`{loop.head}`" for loop in call.loops[1:])
            part = f"self.{call.attr} ({call.stack}, on {' + '.join(call.inputs) or 'its input'})"
            parts.append(part + (f" {times} times" if times else ""))
        outer = f"config.{self.loop.key}" if self.loop.key else f"`{self.loop.head}`"
        return f"{outer} cycles of {', then '.join(parts)}"


def read(sources: dict, config: dict | None = None) -> Recurrence | None:
    """The first forward that calls a layer stack inside a loop, read as above; None where none does."""
    classes = _classes(sources)
    stacks = {name: lists for name, (_f, cls) in classes.items()
              if (lists := _layer_lists(cls, classes, stacks=True))}
    for name, (file, cls) in classes.items():
        forward = _method(cls, "forward")
        if forward is None:
            continue
        built = {attr: built_cls for attr, (built_cls, _line_no) in _built(cls).items() if built_cls in stacks}
        if not built:
            continue
        keys = _bound_keys(cls, forward)
        calls: list[StackCall] = []
        _walk(forward.body, (), built, stacks, classes, keys, calls)
        looped = [call for call in calls if call.loops]
        if not looped:
            continue
        outer = looped[0].loops[0]
        states = {call.output for call in looped}
        initial = _initial(forward, states, outer.line)
        held = _held(cls, initial)
        return Recurrence(owner=name, file=file, loop=outer, calls=tuple(looped), initial=initial, held=held,
                          result=_result(forward, states))
    return None


def _walk(body: list[ast.stmt], loops: tuple[Loop, ...], built: dict, stacks: dict, classes: dict,
          keys: dict[str, str], out: list[StackCall]) -> None:
    for stmt in body:
        if isinstance(stmt, (ast.For, ast.While)):
            loop = Loop(_head(stmt), _loop_key(stmt, keys), stmt.lineno)
            _walk(stmt.body, (*loops, loop), built, stacks, classes, keys, out)
            continue
        if isinstance(stmt, (ast.With, ast.If, ast.Try)):
            for block in (stmt.body, getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])):
                _walk(block, loops, built, stacks, classes, keys, out)
            continue
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.value, ast.Call)):
            continue
        call = stmt.value
        if not (isinstance(call.func, ast.Attribute) and _dotted(call.func.value) == "self"
                and call.func.attr in built):
            continue
        target = stmt.targets[0]
        target = target.elts[0] if isinstance(target, ast.Tuple) and target.elts else target
        stack = built[call.func.attr]
        attr, layer = next(iter(stacks[stack].items()))
        argument = call.args[0] if call.args else next(
            (k.value for k in call.keywords if k.arg in ("hidden_states", "x", "h", "hidden")), None)
        out.append(StackCall(attr=call.func.attr, stack=stack, layers=attr, layer_class=layer,
                             length_key=_list_length_key(classes[stack][1], attr),
                             inputs=tuple(_terms(argument)) if argument is not None else (),
                             output=ast.unparse(target), loops=loops, line=stmt.lineno,
                             after=_after(classes[stack][1])))


def _head(loop: ast.For | ast.While) -> str:
    if isinstance(loop, ast.For):
        return f"for {ast.unparse(loop.target)} in {_line(loop.iter, 60)}"
    return f"while {_line(loop.test, 60)}"


def _bound_keys(cls: ast.ClassDef, forward: ast.FunctionDef) -> dict[str, str]:
    """What reads a config key in the forward: `self.A` (copied from config in the class), `cfg.K` through a
    local alias of the config, and locals assigned one of those: dotted name -> key."""
    keys = {f"self.{attr}": key for attr, key in config_aliases(cls).items()}
    configs = {"config", "self.config"}
    for node in subtree(forward):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = node.value
            if _dotted(value) in configs:
                configs.add(node.targets[0].id)
            elif isinstance(value, ast.Attribute) and _dotted(value.value) in configs:
                keys[node.targets[0].id] = value.attr
            elif _dotted(value) in keys:
                keys[node.targets[0].id] = keys[_dotted(value)]
    keys.update({f"{c}.{n.attr}": n.attr for n in subtree(forward) if isinstance(n, ast.Attribute)
                 for c in configs if _dotted(n.value) == c})
    return keys


def _loop_key(loop: ast.For | ast.While, keys: dict[str, str]) -> str | None:
    if isinstance(loop, ast.For):
        it = loop.iter
        if isinstance(it, ast.Call) and _dotted(it.func) == "range" and len(it.args) == 1:
            return keys.get(_dotted(it.args[0]))
        return None
    test = loop.test
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Lt):
        return keys.get(_dotted(test.comparators[0]))
    return None


def _list_length_key(cls: ast.ClassDef, attr: str) -> str | None:
    init = _method(cls, "__init__")
    aliases = config_aliases(cls)
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == attr and isinstance(node.value, ast.Call) and node.value.args
                and isinstance(node.value.args[0], (ast.ListComp, ast.GeneratorExp))):
            it = node.value.args[0].generators[0].iter
            if isinstance(it, ast.Call) and _dotted(it.func) == "range" and len(it.args) == 1:
                bound = it.args[0]
                if isinstance(bound, ast.Attribute) and _dotted(bound.value) in ("config", "self.config"):
                    return bound.attr
                if isinstance(bound, ast.Attribute) and _dotted(bound.value) == "self":
                    return aliases.get(bound.attr)
    return None


def _terms(node: ast.AST) -> list[str]:
    """The terms of a sum, each with pass-through calls (`x.to(device)`, `.contiguous()`) taken off."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _terms(node.left) + _terms(node.right)
    while (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
           and node.func.attr in PASS_THROUGH):
        node = node.func.value
    return [_line(node, 60)]


def _initial(forward: ast.FunctionDef, states: set[str], before: int) -> dict[str, str]:
    """Each state's value as last assigned before the loop (a pass-through chain taken off)."""
    found: dict[str, str] = {}
    for node in subtree(forward):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id in states and node.lineno < before):
            value = node.value
            while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in (
                    PASS_THROUGH | {"expand_as", "expand"}):
                value = value.func.value
            if node.targets[0].id not in found or node.lineno > found[node.targets[0].id][0]:
                found[node.targets[0].id] = (node.lineno, _line(value, 60))
    return {state: text for state, (_n, text) in found.items()}


def _after(cls: ast.ClassDef) -> tuple[str, str, int] | None:
    """(attr, class, line) where every return of the stack's forward is `self.<attr>(...)` of a module its __init__
    builds (HrmTextStack's `return self.final_norm(hidden_states)`); None where it returns its layers' output."""
    forward = _method(cls, "forward")
    returns = [n for n in subtree(forward) if isinstance(n, ast.Return)] if forward is not None else []
    built = _built(cls)
    found = set()
    for node in returns:
        value = node.value
        if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and _dotted(value.func.value) == "self" and value.func.attr in built):
            return None
        found.add((value.func.attr, built[value.func.attr][0], node.lineno))
    return found.pop() if len(found) == 1 else None


def _held(cls: ast.ClassDef, initial: dict[str, str]) -> dict[str, tuple[str, str, int]]:
    """state -> (attr, "parameter" | "buffer", line) where its first value is `self.<attr>` and __init__ makes that
    attribute an nn.Parameter or registers it as a buffer (HRM's `self.z_L_init = nn.Parameter(...)`)."""
    init = _method(cls, "__init__")
    kinds: dict[str, tuple[str, int]] = {}
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and _dotted(node.targets[0].value) == "self" and isinstance(node.value, ast.Call)):
            name = _dotted(node.value.func).rsplit(".", 1)[-1]
            if name in ("Parameter", "Buffer"):
                kinds[node.targets[0].attr] = ("parameter" if name == "Parameter" else "buffer", node.lineno)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_buffer"
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            kinds[node.args[0].value] = ("buffer", node.lineno)
    out = {}
    for state, text in initial.items():
        attr = text.removeprefix("self.")
        if text.startswith("self.") and attr in kinds:
            out[state] = (attr, *kinds[attr])
    return out


RESULT_KEYWORDS = ("last_hidden_state", "hidden_states")


def _result(forward: ast.FunctionDef, states: set[str]) -> str | None:
    """The state the forward returns: `return x`, the first item of a returned tuple, or the last_hidden_state (else
    first argument) of a returned output class; None where the returns do not agree on one state."""
    found = set()
    for node in (n for n in subtree(forward) if isinstance(n, ast.Return) and n.value is not None):
        value = node.value
        if isinstance(value, ast.Tuple) and value.elts:
            value = value.elts[0]
        if isinstance(value, ast.Call):
            given = {k.arg: k.value for k in value.keywords}
            value = next((given[k] for k in RESULT_KEYWORDS if k in given), value.args[0] if value.args else None)
        found.add(_dotted(value) if value is not None else None)
    if len(found) != 1:
        return None
    state = found.pop()
    return state if state in states else None


# ------------------------------------------------------------------ the form a port computes
@dataclass(frozen=True)
class Plan:
    """A recurrence the port computes: every stack of one class, called once per cycle (or a config key's number of
    times in a row inside it), its input a sum of stacks' states and the embeddings, each state started from the
    embeddings, zeros or a stored vector, a norm without parameters (or nothing) after each stack's layers, and a
    stack's state returned."""

    stacks: tuple[str, ...]
    layers: str
    layer_class: str
    length: tuple[str, str, int]  # (config key, file, line) of the layer list's length
    outer: str
    inner: tuple[str, ...]
    inputs: tuple[str, ...]
    start: tuple[str, ...]
    result: str
    norm: str
    evidence: str  # file:line of the outer loop

    def describe(self) -> str:
        calls = []
        for stack, inner, inputs in zip(self.stacks, self.inner, self.inputs):
            times = f" config.{inner} times" if inner else ""
            calls.append(f"{stack}({inputs.replace('+', ' + ')}){times}")
        return f"config.{self.outer} cycles of {', then '.join(calls)}"


EMBEDDINGS = "embeddings"
ZEROS = "zeros"


def plan(cycles: Recurrence, sources: dict) -> Plan | str:
    """The recurrence as the port computes it, or what the port does not compute (a phrase)."""
    classes = _classes(sources)
    owner = classes[cycles.owner][1]
    forward = _method(owner, "forward")
    states = {call.output: call.attr for call in cycles.calls}
    if len(states) != len(cycles.calls) or len(set(states.values())) != len(cycles.calls):
        return "a stack called at more than one place of a cycle, or two calls assigning one state"
    if len({call.stack for call in cycles.calls}) != 1:
        return "stacks of different classes (" + ", ".join(sorted({c.stack for c in cycles.calls})) + ")"
    first = cycles.calls[0]
    if first.length_key is None:
        return f"{first.stack}.{first.layers} not counted by a config key"
    if cycles.loop.key is None:
        return f"a cycle count that is no config key (`{cycles.loop.head}`)"
    inner = []
    for call in cycles.calls:
        if call.loops[0] != cycles.loop or len(call.loops) > 2:
            return f"self.{call.attr} called in loops of their own ({call.line})"
        if len(call.loops) == 2 and call.loops[1].key is None:
            return f"a loop count that is no config key (`{call.loops[1].head}`)"
        inner.append(call.loops[1].key if len(call.loops) == 2 else "")
    embedded = _embedding_names(owner, forward)
    inputs = []
    for call in cycles.calls:
        terms = []
        for term in call.inputs:
            if term in states:
                terms.append(states[term])
            elif term in embedded:
                terms.append(EMBEDDINGS)
            else:
                return f"self.{call.attr}'s input term `{term}`, neither a stack's state nor the embeddings"
        inputs.append("+".join(terms))
    start = []
    for call in cycles.calls:
        value = cycles.initial.get(call.output)
        if value is None:
            return f"self.{call.attr}'s state read before the forward sets it"
        if value in embedded:
            start.append(EMBEDDINGS)
        elif call.output in cycles.held:
            start.append(cycles.held[call.output][0])
        elif value.split("(", 1)[0].rsplit(".", 1)[-1] == "zeros_like":
            start.append(ZEROS)
        else:
            return f"self.{call.attr}'s first state `{value}`"
    if cycles.result is None:
        return "a forward that returns something else than a stack's state"
    after = {call.after for call in cycles.calls}
    if len(after) != 1:
        return "stacks that end differently"
    norm = after.pop()
    if norm is not None and norm[1] not in weightless_norms(sources):
        return f"{norm[1]} {norm[0]} after the stack's layers, not a norm without parameters"
    stack_cls = classes[first.stack][1]
    stack_forward = _method(stack_cls, "forward")
    if stack_forward is None or not any(isinstance(n, ast.For) and _dotted(n.iter) == f"self.{first.layers}"
                                        for n in subtree(stack_forward)):
        return f"{first.stack}.forward not running self.{first.layers} in order"
    length_line = _list_line(stack_cls, first.layers)
    return Plan(stacks=tuple(c.attr for c in cycles.calls), layers=first.layers, layer_class=first.layer_class,
                length=(first.length_key, classes[first.stack][0], length_line), outer=cycles.loop.key,
                inner=tuple(inner), inputs=tuple(inputs), start=tuple(start), result=states[cycles.result],
                norm=norm[0] if norm else "", evidence=f"{cycles.file}:{cycles.loop.line}")


def _embedding_names(cls: ast.ClassDef, forward: ast.FunctionDef) -> set[str]:
    """The locals the forward assigns the token embedding to (`x = self.embed(ids)`, an nn.Embedding of __init__),
    and those assigned it again scaled or converted (`x = x * self.scale`)."""
    built = {attr for attr, (name, _line) in _built(cls).items() if name == "Embedding"}
    out: set[str] = set()
    for node in subtree(forward):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                and _dotted(value.func.value) == "self" and value.func.attr in built):
            out.add(node.targets[0].id)
    return out


def _list_line(cls: ast.ClassDef, attr: str) -> int:
    init = _method(cls, "__init__")
    for node in subtree(init) if init is not None else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == attr):
            return node.lineno
    return cls.lineno


def found_plan(sources: dict, config: dict) -> Plan | None:
    cycles = read(sources, config) if sources else None
    found = plan(cycles, sources) if cycles is not None else None
    return found if isinstance(found, Plan) else None


# ------------------------------------------------------------------ the detectors' view
def view(ckpt: Checkpoint, spec: Spec) -> Checkpoint:
    """`ckpt` as the detectors read a decoder layer, where the model runs its stacks in cycles as `Plan` says: the
    first stack's layers as the model's one list (`model.L_module.layers.0.x` as `model.layers.0.x`), loaded as
    transformers loads them (its conversion table's renamings and row-block cuts: HRM's attn.gqkv_proj as
    self_attn.gate_proj, q_proj, k_proj, v_proj); the other stacks' tensors, which must match the first's name for
    name and shape, and the stored first states left out. Sets the recurrent_* and cycle_* fields and num_layers'
    key. `ckpt` itself where the model has no such recurrence."""
    sources = modeling_sources(ckpt)
    found = found_plan(sources, ckpt.config)
    if found is None:
        return ckpt
    where, model_type = ckpt.config_file, spec.model_type or ckpt.config.get("model_type")
    first, layers = found.stacks[0], found.layers
    marks = {stack: f".{stack}.{layers}." for stack in found.stacks}
    heads = {name.split(marks[first], 1)[0] for name in ckpt.tensors if marks[first] in name}
    if len(heads) != 1:
        raise unsupported(f"the layers of {first} stored under {len(heads)} prefixes", where, model_type)
    head = heads.pop()
    per_stack: dict[str, dict[str, tuple[int, ...]]] = {stack: {} for stack in found.stacks}
    kept = {}
    for name, info in ckpt.tensors.items():
        stack = next((s for s in found.stacks if name.startswith(f"{head}{marks[s]}")), None)
        if stack is not None:
            per_stack[stack][name[len(head) + len(marks[stack]):]] = info.shape
            continue
        if any(name.startswith(f"{head}.{stack}.") for stack in found.stacks):
            raise unsupported(f"{name}: a tensor of a stack outside its layers (the port's stacks hold their layers "
                              f"and {found.norm or 'nothing'} without parameters)", where, model_type)
        if name in {f"{head}.{start}" for start in found.start}:
            if len(info.shape) != 1:
                raise unsupported(f"{name}: a first state of shape {list(info.shape)}, not one vector", where,
                                  model_type)
            continue
        kept[name] = info
    for stack in found.stacks[1:]:
        if per_stack[stack] != per_stack[first]:
            ours, theirs = set(per_stack[stack].items()), set(per_stack[first].items())
            rest, shape = min(ours - theirs) if ours - theirs else min(theirs - ours)
            has, lacks = (stack, first) if ours - theirs else (first, stack)
            raise unsupported(f"stacks that differ: {head}.{has}.{layers}.{rest} (shape {list(shape)}) has no "
                              f"counterpart of its shape in {lacks}", where, model_type)
    missing = [s for s in found.start if s not in (EMBEDDINGS, ZEROS) and f"{head}.{s}" not in ckpt.tensors]
    if missing:
        raise unsupported(f"a first state {missing[0]} the checkpoint does not store", where, model_type)
    table = renamings.renamings(ckpt)
    chunks = renamings.chunks(ckpt)
    for rest, shape in per_stack[first].items():
        name = f"{head}.{layers}.{rest}"
        cut = next((c for c in chunks if rest.endswith("." + c.source)), None)
        if cut is not None:
            pieces = len(cut.targets)
            if shape[0] % pieces:
                raise unsupported(f"{name}: {shape[0]} rows, not {pieces} equal blocks", where, model_type)
            base = name[: -len(cut.source)]
            stored = ckpt.tensors[_stored(head, first, layers, rest)]
            for target in cut.targets:
                kept[base + target] = TensorInfo(base + target, stored.dtype, (shape[0] // pieces, *shape[1:]),
                                                 stored.file)
            continue
        code = renamings.code_name(table, name)
        kept[code] = replace(ckpt.tensors[_stored(head, first, layers, rest)], name=code)
    evidence = f"{found.evidence}: {found.describe()}"
    spec.set("recurrent_stacks", list(found.stacks), Source("code", evidence))
    spec.set("recurrent_layers", layers, Source("code", evidence))
    spec.set("recurrent_norm", found.norm, Source("code", evidence))
    spec.set("cycle_outer", found.outer, Source("code", evidence, f"config.{found.outer}"))
    spec.set("cycle_inner", list(found.inner), Source("code", evidence))
    spec.set("cycle_inputs", list(found.inputs), Source("code", evidence))
    spec.set("cycle_start", list(found.start), Source("code", evidence))
    spec.set("cycle_result", found.result, Source("code", evidence))
    return replace(ckpt, tensors=kept)


def _stored(head: str, stack: str, layers: str, rest: str) -> str:
    return f"{head}.{stack}.{layers}.{rest}"


def settle(ckpt: Checkpoint, spec: Spec) -> None:
    """After detection over the view: the names the port loads the stored tensors under. A four-block cut of the
    conversion table must give the attention's gate, q, k and v projections as detection named them (spec
    gated_qkv: the stored module); a renaming of the attention module (HRM's attn -> self_attn) names it as
    stored."""
    beside = _beside(spec)
    if beside:
        raise unsupported(f"layer stacks run in cycles ({spec.source('recurrent_stacks').detail}) with "
                          f"{beside[0]}, which the port's stacks do not compute", ckpt.config_file, spec.model_type)
    names = spec.names
    if spec.recurrent_norm:
        _same_norm(modeling_sources(ckpt), spec, ckpt.config_file)
    attn = names.get("self_attn", "")
    stored_attn = attn
    for source, target in renamings.renamings(ckpt):
        plain = source.replace("\\.", ".")
        if target.startswith(f".{attn}.") and plain.startswith(".") and plain.endswith("."):
            old = plain.strip(".").split(".")[0]
            if plain.strip(".").split(".")[1:] != target.strip(".").split(".")[1:]:
                raise unsupported(f"transformers renames {plain} to {target} on load", ckpt.config_file,
                                  spec.model_type)
            stored_attn = old
    updated = dict(names)
    for cut in renamings.chunks(ckpt):
        module, _, kind = cut.source.rpartition(".")
        stored_module, _, leaf = module.rpartition(".")
        mlp = names.get("mlp", "")
        pair = tuple(f"{mlp}.{names.get(r, '?')}.weight" for r in ("gate_proj", "up_proj"))
        if len(cut.targets) == 2 and set(cut.targets) == set(pair) and stored_module == mlp and kind == "weight" \
                and spec.mlp_kind == "gated" and spec.gate_up_layout == "separate":
            # [gate | up] (or [up | gate]) rows in one stored tensor: the port's fused gate_up parameter.
            updated["gate_up_proj"] = leaf
            updated.pop("gate_proj", None)
            updated.pop("up_proj", None)
            why = Source("code", f"transformers' conversion table cuts {cut.source} into {' | '.join(cut.targets)}")
            spec.set("gate_up_layout", "fused", why)
            spec.set("gate_up_order", "gate_first" if cut.targets == pair else "up_first", why)
            continue
        if len(cut.targets) != 4:
            raise unsupported(f"{cut.source} cut on load into {', '.join(cut.targets)}, which the port does not load",
                              ckpt.config_file, spec.model_type)
        roles = tuple(f"{attn}.{names.get(r, '?')}.weight" for r in ("attn_gate", "q_proj", "k_proj", "v_proj"))
        if (cut.targets != roles or kind != "weight" or spec.attn_output_gate != "elementwise"
                or spec.num_kv_heads != spec.num_heads or spec.qkv_layout != "separate" or spec.qkv_bias):
            raise unsupported(f"{cut.source} cut on load into {', '.join(cut.targets)}, which the port loads as "
                              "[gate | q | k | v] only for an elementwise output gate, q, k and v of as many heads, "
                              "without biases", ckpt.config_file, spec.model_type)
        if stored_module != stored_attn:
            raise unsupported(f"{cut.source} stored outside the attention module {stored_attn}", ckpt.config_file,
                              spec.model_type)
        spec.set("gated_qkv", leaf, Source("code", f"transformers' conversion table cuts {cut.source} into "
                                                   f"{' | '.join(cut.targets)} row blocks"))
    updated["self_attn"] = stored_attn
    if spec.recurrent_norm and updated.get("norm") == spec.recurrent_norm:
        updated.pop("norm")  # the stacks' own norm (recurrent_norm), no final norm of the model's
    if updated != names:
        spec.set("names", updated, Source("code", f"{spec.source('names').detail}; as stored (transformers' conversion "
                                                  "table renames and cuts them on load)"))


def layer_count(sources: dict, config: dict) -> tuple[str, str, int] | None:
    """(config key, file, line) of the stacks' layer count, where the model runs its stacks as a Plan."""
    found = found_plan(sources, config)
    return found.length if found is not None else None


def _beside(spec: Spec) -> list[str]:
    """What else the layers compute that the port's stacks do not (their layers run pre-norm with vLLM's fused RMS
    norms, one plain causal attention per step)."""
    out = []
    if spec.norm_kind != "rms" or spec.block != "pre_norm":
        out.append(f"{spec.block} layers of {spec.norm_kind} norms (the stacks add the residual in vLLM's fused RMS "
                   "norms, pre-norm)")
    checks = (
        (spec.is_moe, "a mixture of experts"), (spec.sublayer_count, "sublayers"),
        (spec.kv_share_layers, "layers sharing keys and values"), (spec.diff_lambdas, "differential attention"),
        (spec.key_bias_proj, "a bias per key"), (spec.sliding_window, "a sliding window"),
        (spec.per_layer_input_size, "per-layer inputs"), (spec.layer_scalar, "a layer scalar"),
        (spec.residual_scale_attn or spec.residual_scale_mlp, "residual scales"),
        (spec.unnormed_attn_layers, "layers without an attention norm"),
        (spec.qkv_layout != "separate", f"a {spec.qkv_layout} attention"),
        (spec.value_dim != spec.head_dim, "value heads of their own width"),
        (spec.attention_chunk_size, "chunked attention"), (spec.gated_norms or spec.gated_norms_conditional,
                                                            "gated norms"),
        (spec.attention_sinks, "attention sinks"), (spec.position_scheme not in ("rotary", "none"),
                                                    f"{spec.position_scheme} positions"),
        (spec.embedding_norm, "a norm of the embeddings"), (spec.head_act is not None, "a transform before the head"),
    )
    return out + [what for present, what in checks if present]


def _same_norm(sources: dict, spec: Spec, where) -> None:
    """The stacks' norm must be built as the layers' norms are (the port builds every norm of one kind, eps
    included): the same class and arguments as the attention's norm in the decoder layer."""
    classes = _classes(sources)
    found = found_plan(sources, {})
    if found is None:
        return
    calls = []
    stack = _stack_class(sources)
    for owner, attr in ((found.layer_class, spec.names.get("attn_norm", "")), (stack, spec.recurrent_norm)):
        cls = classes.get(owner)
        init = _method(cls[1], "__init__") if cls else None
        call = next((node.value for node in subtree(init) if isinstance(node, ast.Assign) and len(node.targets) == 1
                     and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == attr
                     and isinstance(node.value, ast.Call)), None) if init is not None else None
        calls.append(ast.unparse(call) if call is not None else None)
    if None in calls or calls[0] != calls[1]:
        raise unsupported(f"the stacks' {spec.recurrent_norm} built as `{calls[1]}`, the layers' norm as "
                          f"`{calls[0]}` (the port builds every norm of one kind)", where, spec.model_type)


def _stack_class(sources: dict) -> str | None:
    cycles = read(sources, {})
    return cycles.calls[0].stack if cycles is not None else None
