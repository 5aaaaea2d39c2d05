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
from dataclasses import dataclass, field

from scaffold.detect.blocks import _method
from scaffold.detect.formcode import _built, _classes, _layer_lists, _line
from scaffold.detect.sourcecode import _dotted, config_aliases, subtree

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
