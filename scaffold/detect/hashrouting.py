"""Hash routing, read from the code: experts chosen by a fixed table of token ids, weighted by the router's scores.

DeepSeek-V4's first `hash_moe` layers route each token to the experts `tid2eid[input_ids]` names (an integer table
the checkpoint stores, I64), and weight them by the router's scores at those experts: sqrt(softplus(logits)) gathered
there, renormalized to sum to one and times routed_scaling_factor. A lab may call the table and the ids otherwise,
score with a softmax or a sigmoid, renormalize under a config flag or not at all.

So the form is not matched as text. The router is the class whose forward indexes an attribute of its own by one of
its parameters named like token ids (`self.T[ids ...]`); the statements of that forward after the router logits (a
linear of the input, as routingmath finds them) are interpreted over numbers (routingmath's interpreter: gather,
tables compared element by element; `self.A = config.KEY` read from config.json, floats among them probed at values
of their own; `ACT2FN[config.KEY]` as the activation config.json names) on sample logits, token ids and a sample
table, and what it returns is compared with score(logits).gather(table[ids]), renormalized or not, times a factor:
softmax, sigmoid or sqrt-softplus scores, the factor 1 or one number the code reads. The port computes that
(`hash_*` spec fields) from its own router's logits, the table loaded as an integer buffer, and the token ids the
model hands the block; anything else is refused naming the line.

The token ids must be the model's: followed from the router's parameter through the MoE block's forward and the
decoder layer's forward to the `input_ids` of the model's forward that calls the layers.
"""

from __future__ import annotations

import ast
import random
from dataclasses import dataclass

import numpy as np

from scaffold.detect import conditions, window
from scaffold.detect.codekeys import _is_config
from scaffold.detect.denselayers import negated
from scaffold.detect.evaluate import CannotEvaluate
from scaffold.detect.formcode import _line, _statements, _value_reads
from scaffold.detect.gatednorm import _choices
from scaffold.detect.routingmath import _logits_assignment, _Routing
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

SCORINGS = ("softmax", "sigmoid", "sqrtsoftplus")
PROBE = 1.37  # a float the code reads from the config, replaced by a value of its own to tell a factor


@dataclass(frozen=True)
class Lookup:
    file: str
    cls: ast.ClassDef
    forward: ast.FunctionDef
    table: str  # the attribute indexed (tid2eid, a lab's expert_table)
    ids: str  # the forward's parameter it is indexed by
    stmt: ast.stmt

    @property
    def where(self) -> str:
        return f"{self.file}:{self.stmt.lineno}"

    def describe(self) -> str:
        return f"{self.cls.name}.forward indexes {self.table} by {self.ids} ({self.where}: {_line(self.stmt, 70)})"


@dataclass(frozen=True)
class HashRouting:
    router: str  # the hash router's class
    table: str  # its table attribute: the checkpoint's tensor is <router module>.<table>
    ids: str
    scoring: str  # softmax | sigmoid | sqrtsoftplus
    renormalize: bool
    renormalize_key: str | None  # the config key of `if self.R:` around the division, where it decides
    scale: float  # the factor the weights are multiplied by, with this config.json
    scale_key: str | None  # its config key (None: no factor, 1)
    evidence: str


def lookups(sources: dict[str, str]) -> list[Lookup]:
    """Every `self.T[... ids ...]` in a method of a class, with `ids` a parameter of that method named like token ids
    (input_ids, token_ids)."""
    found = []
    for file, tree in _parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            for func in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                params = {a.arg for a in func.args.args if a.arg.endswith("ids") and "position" not in a.arg}
                if not params:
                    continue
                for stmt in _statements(func.body):
                    for n in subtree(stmt):
                        if not (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute)
                                and _dotted(n.value.value) == "self"):
                            continue
                        # The ids' values, not their shape (Whisper's weight[past : past + input_ids.shape[1]]).
                        read = sorted({m.id for m in _value_reads(n.slice) if isinstance(m, ast.Name)} & params)
                        if read:
                            found.append(Lookup(file, cls, func, n.value.attr, read[0], stmt))
                            break
    return found


class _Score:
    """An activation module config.json names (ACT2FN[config.KEY]), over numbers."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.name == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if self.name == "sqrtsoftplus":
            return np.sqrt(np.logaddexp(0.0, x))
        raise CannotEvaluate(f"the activation {self.name!r}")


class _Hash(_Routing):
    """routingmath's interpreter, with integer tables kept integers (`.long()` of indices) and the activation
    modules the router builds from config.json called."""

    def method(self, owner, name: str, args: list, kwargs: dict, node: ast.Call):
        if isinstance(owner, np.ndarray) and owner.dtype.kind in "iu" and name in ("long", "int", "to", "contiguous"):
            return owner.astype(np.int64)
        return super().method(owner, name, args, kwargs, node)

    def apply(self, func, args: list, kwargs: dict, node: ast.Call):
        if isinstance(func, _Score):
            if len(args) != 1 or not isinstance(args[0], np.ndarray):
                raise CannotEvaluate(f"line {node.lineno}: {ast.unparse(node)[:60]}")
            return func(args[0])
        return super().apply(func, args, kwargs, node)


def _score(name: str, x: np.ndarray) -> np.ndarray:
    if name == "softmax":
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    return _Score(name)(x)


def _attributes(cls: ast.ClassDef, config: dict) -> tuple[dict, dict[str, str], list[str]]:
    """self's attributes the router's __init__ sets from config.json (numbers, flags, ACT2FN[config.KEY]) or
    constants; {attr: KEY}; and the attributes that hold an activation config.json names that the reader does not
    compute (named in the refusal)."""
    attrs: dict = {}
    keys: dict[str, str] = {}
    unknown: list[str] = []
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    for stmt in subtree(init) if init else ():
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self"):
            continue
        attr, value = stmt.targets[0].attr, stmt.value
        if isinstance(value, ast.Attribute) and _is_config(value.value) and value.attr in config:
            v = config[value.attr]
            if isinstance(v, (bool, int, float)) or v is None:
                attrs[attr] = PROBE if isinstance(v, float) and not isinstance(v, bool) else v
                keys[attr] = value.attr
        elif isinstance(value, ast.Constant) and isinstance(value.value, (bool, int, float)):
            attrs[attr] = value.value
        elif (isinstance(value, ast.Subscript) and _dotted(value.value).rsplit(".", 1)[-1] == "ACT2FN"
              and isinstance(value.slice, ast.Attribute) and _is_config(value.slice.value)):
            name = config.get(value.slice.attr)
            if name in ("sigmoid", "sqrtsoftplus"):
                attrs[attr] = _Score(name)
                keys[attr] = value.slice.attr
            else:
                unknown.append(f"{attr} = ACT2FN[config.{value.slice.attr}] ({name!r})")
    return attrs, keys, unknown


def samples(experts: int, top_k: int, vocab: int = 16, tokens: int = 12) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Router logits, token ids and a table of distinct experts per token id, random under a fixed seed."""
    rng = random.Random(4321)
    logits = np.array([[rng.uniform(-3, 3) for _ in range(experts)] for _ in range(tokens)])
    ids = np.array([rng.randrange(vocab) for _ in range(tokens)], dtype=np.int64)
    table = np.array([rng.sample(range(experts), top_k) for _ in range(vocab)], dtype=np.int64)
    return logits, ids, table


def read(sources: dict[str, str], config: dict, lookup: Lookup, experts: int, top_k: int) -> HashRouting | str:
    """The routing `lookup`'s forward computes, when it is a score of the router logits gathered at table[ids],
    renormalized or not, times a factor; else why not (a str naming the line or the difference)."""
    forward = lookup.forward
    found = _logits_assignment(forward.body, "")
    if found is None:
        return f"{lookup.describe()}: no router logits (a linear of the input) in that forward"
    start, logits_name = found
    attrs, keys, unknown = _attributes(lookup.cls, config)
    functions = {node.name: node for _file, tree in _parsed(sources) for node in tree.body
                 if isinstance(node, ast.FunctionDef)}
    where = f"{lookup.file}:{forward.body[start].lineno}"
    logits, ids, table = samples(max(experts, 4), min(top_k, max(experts, 4)))

    def run(values: dict):
        interp = _Hash(functions, {**values, lookup.table: table})
        env = {logits_name: logits.copy(), lookup.ids: ids.copy(), "self": interp.self_obj}
        with np.errstate(all="ignore"):
            out = interp.call_block(forward.body[start + 1:], env)
        value = out[0] if out is not None else None
        parts = value if isinstance(value, tuple) else (value,)
        tables = [p for p in parts if isinstance(p, np.ndarray) and p.ndim == 2 and p.shape[0] == len(ids)]
        weights = [p for p in tables if p.dtype.kind == "f" and p.shape[1] == table.shape[1]]
        indices = [p for p in tables if p.dtype.kind in "iu"]
        if len(weights) != 1 or len(indices) != 1:
            raise CannotEvaluate("a routing that returns no one table of weights and one of expert indices")
        return weights[0], indices[0], interp.used

    try:
        weights, indices, used = run(attrs)
    except CannotEvaluate as exc:
        why = f"; the router builds {', '.join(unknown)}" if unknown else ""
        return f"{where}: the hash routing computes {str(exc)[:90]}, which the routing reader does not follow{why}"
    if not np.array_equal(indices, table[ids]):
        return f"{where}: the experts the hash routing returns are not the table's row of each token ({lookup.table})"
    factors = [(1.0, None)] + [(PROBE, a) for a, v in used.items() if isinstance(v, float) and v == PROBE and a in keys]
    match = None
    for scoring in SCORINGS:
        scored = np.take_along_axis(_score(scoring, logits), table[ids], axis=1)
        for renorm in (False, True):
            base = scored / scored.sum(-1, keepdims=True) if renorm else scored
            for factor, attr in factors:
                if np.allclose(weights, base * factor, rtol=1e-9, atol=1e-12):
                    match = (scoring, renorm, factor, attr)
    if match is None:
        return (f"{where}: the weights the hash routing computes from {logits_name} are not a softmax, sigmoid or "
                "sqrt-softplus of it gathered at the table's experts, renormalized or not, times a factor the code "
                "reads")
    scoring, renorm, factor, attr = match
    # A flag the code reads from the config deciding the renormalization: the result flips with it.
    renorm_key = None
    for a, v in used.items():
        if isinstance(v, bool) and a in keys:
            try:
                flipped, _, _ = run({**attrs, a: not v})
            except CannotEvaluate:
                continue
            scored = np.take_along_axis(_score(scoring, logits), table[ids], axis=1)
            other = scored / scored.sum(-1, keepdims=True) if not renorm else scored
            if np.allclose(flipped, other * factor, rtol=1e-9, atol=1e-12):
                renorm_key = keys[a]
    scale_key = keys[attr] if attr else None
    scale = float(config[scale_key]) if scale_key else 1.0
    score_key = next((keys[a] for a, v in attrs.items() if isinstance(v, _Score) and v.name == scoring), None)
    said = f"{scoring}{f' (config.{score_key})' if score_key else ''} of {logits_name} gathered at {lookup.table}[{lookup.ids}]"
    said += ", renormalized" if renorm else ", not renormalized"
    if renorm_key:
        said += f" where config.{renorm_key}"
    if scale_key:
        said += f", times config.{scale_key}"
    return HashRouting(lookup.cls.name, lookup.table, lookup.ids, scoring, renorm, renorm_key, scale, scale_key,
                       f"{where}: {said}")


def _params(func: ast.FunctionDef) -> list[str]:
    return [a.arg for a in func.args.posonlyargs + func.args.args][1:]


def _handed(call: ast.Call, param: str, func: ast.FunctionDef) -> str | None:
    """The caller's name for `func`'s parameter `param` in `call` (a positional or a keyword argument that is a
    plain name)."""
    params = _params(func)
    for k in call.keywords:
        if k.arg == param and isinstance(k.value, ast.Name):
            return k.value.id
    if param in params and params.index(param) < len(call.args):
        arg = call.args[params.index(param)]
        return arg.id if isinstance(arg, ast.Name) else None
    return None


def ids_from_model(sources: dict[str, str], lookup: Lookup) -> str | None:
    """Why the ids the table is indexed by are not followed to the model's input_ids, or None where they are: the
    router's parameter is handed a parameter of the forward that calls it (the MoE block's), that one a parameter of
    the forward calling the block (the decoder layer's), and that one the `input_ids` of a forward (the model's)."""
    classes = _classes(sources)
    forwards = [(name, next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None))
                for name, (_f, cls) in classes.items()]
    forwards = [(name, f) for name, f in forwards if f is not None]

    def callers(func: ast.FunctionDef, param: str, cls_name: str) -> list[tuple[str, ast.FunctionDef, str]]:
        """(class, forward, name) of forwards that call a module of their own built from `cls_name` (or any module
        of theirs, for a class built under another name) handing `param` a parameter of theirs."""
        out = []
        for name, f in forwards:
            built = _built_classes(classes[name][1])
            for call in (n for n in subtree(f) if isinstance(n, ast.Call)):
                target = _dotted(call.func)
                if target.startswith("self.") and target.count(".") == 1:
                    if built.get(target[5:]) and cls_name not in built[target[5:]]:
                        continue
                elif not (isinstance(call.func, ast.Name) and cls_name in _looped(f, built).get(call.func.id, ())):
                    continue  # a call of the loop's variable over a list of cls_name (`for layer in self.layers`)
                handed = _handed(call, param, func)
                if handed and handed in _params(f):
                    out.append((name, f, handed))
        return out

    steps = [lookup.cls.name]
    level = [(lookup.cls.name, lookup.forward, lookup.ids)]
    for _ in range(4):
        following = []
        for cls_name, func, param in level:
            for caller in callers(func, param, cls_name):
                if caller[2] == "input_ids" and _calls_layer_list(caller[1]):
                    return None
                following.append(caller)
        if not following:
            break
        steps.append(following[0][0])
        level = following
    return (f"the ids {lookup.cls.name} indexes {lookup.table} by ({lookup.ids}) are followed through "
            f"{' <- '.join(steps)} and no further to the input_ids of the model's forward")


def _built_classes(cls: ast.ClassDef) -> dict[str, set[str]]:
    """{attr: classes} of `self.attr = C(...)` (either branch of a conditional) in the class's __init__."""
    out: dict[str, set[str]] = {}
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    for stmt in subtree(init) if init else ():
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self"):
            for call in (n for n in subtree(stmt.value) if isinstance(n, ast.Call)):
                out.setdefault(stmt.targets[0].attr, set()).add(_dotted(call.func).rsplit(".", 1)[-1])
    return out


def _looped(func: ast.FunctionDef, built: dict[str, set[str]]) -> dict[str, set[str]]:
    """{variable: classes} of `for variable in self.X` (or self.X[...]) in `func`, X built in __init__."""
    out: dict[str, set[str]] = {}
    for loop in (n for n in subtree(func) if isinstance(n, ast.For) and isinstance(n.target, ast.Name)):
        it = loop.iter.value if isinstance(loop.iter, ast.Subscript) else loop.iter
        if isinstance(it, ast.Attribute) and _dotted(it.value) == "self" and it.attr in built:
            out[loop.target.id] = built[it.attr]
    return out


def _calls_layer_list(func: ast.FunctionDef) -> bool:
    """The forward loops over a list of layers (the model's: `for layer in self.layers[...]`)."""
    return any(isinstance(n, ast.For) and "self." in ast.unparse(n.iter) for n in subtree(func))



def layer_condition(sources: dict[str, str], config: dict, layers_attr: str | None, router: str,
                    num_layers: int) -> tuple[str, list[int]] | str:
    """(condition, layers): the condition, over the config and the layer's index, under which the MoE block builds
    the hash router class `router` (DeepSeek-V4's `config.mlp_layer_types[layer_idx] == "hash_moe"`, a lab's
    `layer_idx < config.hashed_layers`), followed up through the decoder layer's constructor call and the layer
    list, and the layers where config.json makes it true; else why not."""
    classes = _classes(sources)
    for name, (file, cls) in classes.items():
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            continue
        made = [(attr, m) for attr, ms in _choices(init).items() for m in ms if m[0] == router]
        if not made:
            continue
        attr, (_cls, cond, truth, line) = made[0]
        if cond is None:
            return f"{name}.__init__ ({file}:{line}) builds self.{attr} as {router} in every layer, unconditioned"
        # The block's own names (self.is_hash = ...; its layer_idx parameter) -> what the decoder layer hands it.
        expr = window._lift(cond, init, {})
        layer = _layer_building(sources, name)
        if layer is None:
            return f"{name} ({file}:{cls.lineno}) is built by no decoder layer the reader finds"
        call = layer
        expr = window._lift(expr, None, window._bind(init, call))
        lifted = window.lift_from_layer(sources, layers_attr, expr)
        if lifted is None or {n.id for n in ast.walk(lifted) if isinstance(n, ast.Name)} - window.READS:
            return (f"{name}.__init__ ({file}:{line}) builds self.{attr} as {router} under `{ast.unparse(cond)}`, "
                    "which does not follow from the config and the layer's index")
        if not truth:
            lifted = negated(lifted)
        truths = [conditions.evaluate(lifted, config, {"layer_idx": i}) for i in range(num_layers)]
        if None in truths:
            return f"{name}.__init__ ({file}:{line}): config.json does not decide `{ast.unparse(cond)}` for every layer"
        return ast.unparse(lifted), [i for i, t in enumerate(truths) if t]
    return f"no class of the modeling code builds {router}"


def _layer_building(sources: dict[str, str], block: str) -> ast.Call | None:
    """The call that builds `block` in a class's __init__ (the decoder layer's)."""
    for _file, cls in _classes(sources).values():
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        for call in (n for n in subtree(init) if isinstance(n, ast.Call)) if init else ():
            if _dotted(call.func).rsplit(".", 1)[-1] == block:
                return call
    return None
