"""Which LongRoPE factors a checkpoint's own rotary module applies, and with what scale, read by running its code.

LongRoPE (rope_type "longrope") keeps two sets of per-frequency divisors, short_factor and long_factor, and a
choice between them. transformers' Phi-3 form chooses by each sequence's length at run time (long factors past
original_max_position_embeddings); vLLM's Phi3LongRoPEScaledRotaryEmbedding chooses once, by the engine's
max_model_len, and scales cos/sin by short_mscale / long_mscale (default sqrt(1 + ln(s) / ln(original)),
s = max_position_embeddings / original_max_position_embeddings). Remote code may choose otherwise: MiniCPM4's
MiniCPMLongRoPE builds its cos/sin table once, at construction, for max_position_embeddings positions, and takes the
long factors for every position when max_position_embeddings > original_max_position_embeddings (a choice by
config values), its table scaled by that square root. vLLM then computes something else wherever max_model_len is
at most the original length (short factors).

So the module is not matched as text: the class constructed with short_factor= and long_factor= (wherever it is
built: a decoder stack's __init__, an attention's _init_rope) is run over numbers (scaffold.detect.evaluate), its
constructor's arguments evaluated on config.json's values and on what the building module's __init__ assigns to
self; base classes of the sources run through super(). Its forward is run at positions 0..P-1 and at every
position of max_position_embeddings (a longer range: one position past the original length), and each table is compared with cos/sin(p * base ** (-2k / d) / f[k]) * m for
f the short and the long factors: the factors the code applies at every position and the scale m are what the port
hands vLLM (both factor sets, both mscales), so vLLM computes the same whatever max_model_len it serves. A table
that changes factors with the sequence length is the run-time choice vLLM's own form makes (None: the config's
parameters as they are); a table that is neither set, or code the reader cannot run, is a reason.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from scaffold.detect.evaluate import CannotEvaluate, Interpreter, Limits, Obj, params_of
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

POSITIONS = 40
KEYWORDS = ("short_factor", "long_factor")
# The whole served range (max_position_embeddings positions) is compared where its table is at most this many
# numbers (MiniCPM4's 32768 positions of 128 dims: 2 ** 22); a longer one at one position past the original length.
WHOLE_RANGE = 1 << 22
LIMITS = Limits(elements=1 << 24)  # a table built at construction: 131072 positions of 128 dims
TOLERANCE = 1e-6


@dataclass(frozen=True)
class LongRopeTable:
    """The factors a LongRoPE module applies at every position it serves, and the scale of its cos/sin."""

    which: str  # "short_factor" or "long_factor": the config's set the code applies
    factors: tuple[float, ...]
    mscale: float
    cls: str
    site: str  # file:line where the module is constructed
    positions: int  # how many positions the comparison covered

    def describe(self) -> str:
        return (f"{self.site}: {self.cls} applies rope_scaling.{self.which} at every position 0..{self.positions - 1}"
                f", its cos/sin scaled by {self.mscale:.9g}")


class _Chain(Interpreter):
    """The interpreter over one class and its bases of the sources: self's methods the most derived ones,
    super().name(...) the next base's that defines it (a base outside the sources, nn.Module: nothing)."""

    def __init__(self, functions, levels: list[dict[str, ast.FunctionDef]]):
        merged: dict[str, ast.FunctionDef] = {}
        for level in reversed(levels):
            merged.update(level)
        super().__init__(functions, merged, LIMITS)
        self.levels = levels
        self.running: list[tuple[ast.FunctionDef, object]] = []

    def run(self, func, receiver, args, kwargs):
        self.running.append((func, receiver))
        try:
            return super().run(func, receiver, args, kwargs)
        finally:
            self.running.pop()

    def call(self, node: ast.Call, env: dict):
        func = node.func
        if (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
                and _dotted(func.value.func) == "super" and self.running):
            current, receiver = self.running[-1]
            level = next((i for i, methods in enumerate(self.levels)
                          if any(m is current for m in methods.values())), None)
            if level is not None and receiver is not None:
                for above in self.levels[level + 1:]:
                    if func.attr in above:
                        args, kwargs = self.call_args(node, env)
                        return self.run(above[func.attr], receiver, args, kwargs)
            return Obj(name="super")
        return super().call(node, env)


def _functions(sources: dict[str, str]) -> dict[str, ast.FunctionDef]:
    out: dict[str, ast.FunctionDef] = {}
    for _file, tree in _parsed(sources):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, node)
    return out


def _site(sources: dict[str, str]):
    """(file, building class, the method that builds, the call, the rotary class name) of the one construction of a
    class of the sources with short_factor= and long_factor= keywords; None where there is none."""
    classes = _classes(sources)
    for file, tree in _parsed(sources):
        for owner in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            for method in (f for f in owner.body if isinstance(f, ast.FunctionDef)):
                for call in (c for c in subtree(method) if isinstance(c, ast.Call)):
                    name = _dotted(call.func).rsplit(".", 1)[-1]
                    if name in classes and set(KEYWORDS) <= {k.arg for k in call.keywords}:
                        return file, owner, method, call, name
    return None


def _chain(sources: dict[str, str], name: str) -> list[ast.ClassDef]:
    """The class and its bases of the sources, most derived first (first base of each)."""
    classes = _classes(sources)
    out = []
    while name in classes and len(out) < 8 and all(c.name != name for c in out):
        cls = classes[name][1]
        out.append(cls)
        name = next((_dotted(b).rsplit(".", 1)[-1] for b in cls.bases if _dotted(b).rsplit(".", 1)[-1] in classes),
                    "")
    return out


def _builder_self(interp: Interpreter, owner: ast.ClassDef, config: Obj) -> Obj:
    """The building module's self: what its __init__ assigns to self.X at its top level (each that the reader
    computes from the config; the others left out)."""
    receiver = Obj(name="self")
    init = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None:
        return receiver
    env = {p: (receiver if i == 0 else config if "config" in p else 0 if p == "layer_idx" else None)
           for i, p in enumerate(params_of(init))}
    for stmt in init.body:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(t := stmt.targets[0], ast.Attribute)
                and isinstance(t.value, ast.Name) and t.value.id == params_of(init)[0]):
            try:
                receiver.attrs[t.attr] = interp.evaluate(stmt.value, env)
            except CannotEvaluate:
                continue
    return receiver


def read(sources: dict[str, str], config: dict, head_dim: int, params: dict) -> LongRopeTable | str | None:
    """What the code's LongRoPE module applies (module docstring); None where no class is built with short and long
    factors, or where its choice follows the sequence length at run time; a reason where the reader cannot run it
    or its table is neither set of factors."""
    found = _site(sources)
    if found is None:
        return None
    file, owner, method, call, name = found
    site = f"{file}:{call.lineno}"
    chain = _chain(sources, name)
    levels = [{n.name: n for n in c.body if isinstance(n, ast.FunctionDef)} for c in chain]
    interp = _Chain(_functions(sources), levels)
    merged = interp.methods
    if "__init__" not in merged or "forward" not in merged:
        return f"{site}: {name} has no __init__ and forward to read"
    config_obj = Obj(dict(config), "config")
    builder = _builder_self(interp, owner, config_obj)
    env = {p: (builder if i == 0 else config_obj if "config" in p else None)
           for i, p in enumerate(params_of(method))}
    for stmt in method.body:
        # What the building method computes before it builds (head_dim = ...): each assignment the reader follows.
        if any(node is call for node in subtree(stmt)):
            break
        if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
            try:
                interp.call_block([stmt], env)
            except CannotEvaluate:
                continue
    try:
        args = [interp.evaluate(a, env) for a in call.args]
        kwargs = {k.arg: interp.evaluate(k.value, env) for k in call.keywords if k.arg is not None}
    except CannotEvaluate as exc:
        return f"{site}: the arguments of {name}(...) are computed in a way the reader does not follow ({exc})"
    theta = params.get("rope_theta")
    sets = {k: params.get(k) for k in KEYWORDS}
    if not isinstance(theta, (int, float)) or isinstance(theta, bool) or theta <= 0:
        return f"{site}: no rotary base to compare its table with"
    if not all(isinstance(v, list) and len(v) == head_dim // 2 for v in sets.values()):
        return f"{site}: rope_scaling's short_factor and long_factor are not {head_dim // 2} numbers each"
    longest = config.get("max_position_embeddings")
    original = params.get("original_max_position_embeddings")
    lengths = [POSITIONS]
    if isinstance(longest, int) and not isinstance(longest, bool) and POSITIONS < longest:
        if longest * head_dim <= WHOLE_RANGE:
            lengths.append(longest)
        elif isinstance(original, int) and POSITIONS <= original < longest:
            lengths.append(original + 1)  # just past the original length: where a choice by length would turn
    matched = []
    for length in lengths:
        table = _table(interp, merged, args, kwargs, head_dim, length)
        if isinstance(table, str):
            return f"{site}: {name} {table}"
        match = _match(table, head_dim, float(theta), sets)
        if isinstance(match, str):
            return f"{site}: {name} {match} at positions 0..{length - 1}"
        matched.append(match)
    if len({m[0] for m in matched}) > 1:
        return None  # short factors for short sequences, long for long ones: vLLM's own (run-time) form
    which, mscale = matched[-1]
    return LongRopeTable(which, tuple(float(f) for f in sets[which]), mscale, name, site, lengths[-1])


def _table(interp: _Chain, methods: dict, args: list, kwargs: dict, head_dim: int, length: int):
    """(cos, sin) of the module built with `args`, `kwargs`, run at positions 0..length-1, as (length, head_dim)."""
    module = Obj(name="self")
    try:
        interp.call_function(methods["__init__"], module, args, kwargs)
    except CannotEvaluate as exc:
        return f"builds its table in a way the reader does not follow ({exc})"
    forward = methods["forward"]
    names = params_of(forward)[1:]
    given: dict = {}
    for i, p in enumerate(names):
        if i == 0:
            given[p] = np.zeros((1, 1, length, head_dim))
        elif "seq_len" in p:
            given[p] = length
        elif "position" in p:
            given[p] = np.arange(length, dtype=np.float64)[None, :]
    try:
        out = interp.call_function(forward, module, [], given)
    except CannotEvaluate as exc:
        return f"computes its cos/sin in a way the reader does not follow ({exc})"
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, np.ndarray) for o in out)):
        return "does not return (cos, sin) from its forward"
    cos, sin = (np.asarray(o, dtype=np.float64) for o in out)
    if cos.shape != sin.shape or cos.size != length * head_dim:
        return f"returns tables of shape {cos.shape}, not {length} rows of {head_dim}"
    return cos.reshape(length, head_dim), sin.reshape(length, head_dim)


def _match(table, head_dim: int, theta: float, sets: dict) -> tuple[str, float] | str:
    """(the factor set, the scale) the table computes, or what it computes instead."""
    cos, sin = table
    half = head_dim // 2
    if not (np.allclose(cos[:, :half], cos[:, half:], atol=1e-12, rtol=0)
            and np.allclose(sin[:, :half], sin[:, half:], atol=1e-12, rtol=0)):
        return "computes a cos/sin table whose halves differ (not NeoX rotary over the whole head)"
    magnitude = np.sqrt(cos ** 2 + sin ** 2)
    mscale = float(magnitude.mean())
    if not np.allclose(magnitude, mscale, atol=TOLERANCE * mscale, rtol=0):
        return "scales its cos/sin table by different amounts at different positions or frequencies"
    positions = np.arange(cos.shape[0], dtype=np.float64)[:, None]
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    for which, factors in sets.items():
        angles = positions * (inv_freq / np.asarray(factors, dtype=np.float64))[None, :]
        if (np.allclose(cos[:, :half], np.cos(angles) * mscale, atol=TOLERANCE * mscale, rtol=0)
                and np.allclose(sin[:, :half], np.sin(angles) * mscale, atol=TOLERANCE * mscale, rtol=0)):
            return which, mscale
    return "rotates at frequencies that are neither the short nor the long factors' (base ** (-2k / d) / f[k])"
