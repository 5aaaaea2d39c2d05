"""The frequencies a rotary embedding module computes, read by running its code over numbers.

Most rotary modules compute inv_freq[k] = base ** (-2k / d) and rotate q and k by cos/sin(p * inv_freq[k]),
the table concatenated with itself (NeoX, rotate_half). Some compute the same frequencies in another order:
Cohere Compass "pre-rotates" them for its multimodal rotary sections (rope_parameters.mrope_section = [h, w, t]),
`inv_freq_3d[:h + w] = cat(inv_freq[:h + w][0::2], inv_freq[:h + w][1::2])`, and its forward splits the table
into the sections, takes each from one row of 3-D positions (h from the second row, w from the third, t from the
first) and concatenates them back. For a text-only model the rows are the same positions, so the rotation is
plain NeoX rotary whose column j turns at the standard frequency order[j]. A lab may write the reordering
otherwise (its own names, a permutation index, sections concatenated in another order). So the code is not
matched as text: the module's __init__ and forward are interpreted over numbers (a small Python and array
language: assignments, ifs, for loops, comprehensions, f-strings, getattr/setattr, dict reads, arange, pow, cat,
split, expand, slices, cos, sin, the module's own methods and helpers), on config.json's values and positions
0..P-1 given identically in every row, and the cos/sin table it returns is compared, column by column, with
cos/sin(p * base ** (-2k / d)). A table that is not such a reordering (scaled, another base, frequencies that
are not the standard ones, not NeoX-halved) is named, not guessed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import numpy as np

from scaffold.detect.evaluate import Interpreter, Obj
from scaffold.detect.sourcecode import _classes, _dotted, _parsed, subtree

POSITIONS = 40  # positions 0..P-1 the forward is run at
TOLERANCE = 1e-9


@dataclass(frozen=True)
class FrequencyOrder:
    """What a rotary module computes for one layer type: NeoX rotary at the standard frequencies of `base`,
    column j at frequency index order[j]."""

    order: tuple[int, ...]
    base: float
    cls: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def permuted(self) -> bool:
        return list(self.order) != list(range(len(self.order)))


# ---------------------------------------------------------------------- the module and its reading
def _functions(sources: dict[str, str]) -> dict[str, ast.FunctionDef]:
    out: dict[str, ast.FunctionDef] = {}
    for _file, tree in _parsed(sources):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, node)
    return out


def rotary_class(sources: dict[str, str]) -> tuple[str, ast.ClassDef, str, ast.ClassDef] | None:
    """(file, rotary class, attribute, decoder stack class) of the rotary module the decoder stack builds as
    self.<attribute> = Cls(...) (a class of the sources whose code computes a cosine and a sine), where the
    stack is the class that also builds the token embedding (nn.Embedding): not a vision tower's."""
    classes = _classes(sources)
    found = []
    for _file, tree in _parsed(sources):
        for owner in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            init = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
            if init is None:
                continue
            embeds = any(isinstance(n, ast.Call) and _dotted(n.func).rsplit(".", 1)[-1] == "Embedding"
                         for n in subtree(init))
            for node in subtree(init):
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and _dotted(node.targets[0]).startswith("self.") and isinstance(node.value, ast.Call)):
                    name = _dotted(node.value.func).rsplit(".", 1)[-1]
                    if name in classes and name != owner.name and _computes_cos_sin(classes[name][1]):
                        found.append((not embeds, *classes[name], _dotted(node.targets[0])[5:], owner))
    if not found:
        return None
    found.sort(key=lambda f: f[0])
    return found[0][1:]


def _computes_cos_sin(cls: ast.ClassDef) -> bool:
    names = {_dotted(n.func).rsplit(".", 1)[-1] for n in subtree(cls) if isinstance(n, ast.Call)}
    return {"cos", "sin"} <= names


def read_order(sources: dict[str, str], config: dict, layer_type: str | None, head_dim: int,
               base: float) -> FrequencyOrder | str | None:
    """The order of the frequencies the rotary module (the one the decoder stack builds) computes for
    `layer_type`, run on config.json's values with the same positions in every row; a reason where its table
    is not a reordering of NeoX rotary at base `base` over `head_dim`; None where no such module is found."""
    found = rotary_class(sources)
    if found is None:
        return None
    file, cls = found[:2]
    where = f"{file}:{cls.lineno}"
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    if "__init__" not in methods or "forward" not in methods:
        return f"{where}: {cls.name} has no __init__ and forward to read"
    interp = Interpreter(_functions(sources), methods)  # evaluate.Limits: 20000 steps, arrays of 2 ** 20 numbers
    config_obj = Obj(dict(config), "config")  # its dicts stay dicts: config.rope_parameters[...] reads them
    module = Obj(name="self")
    table = None
    positions = np.arange(POSITIONS, dtype=np.float64)
    errors = []
    try:
        interp.call_function(methods["__init__"], module, [config_obj])
    except Exception as exc:  # noqa: BLE001 - code the reader cannot run is a reason, never a crash
        return f"{where}: {cls.name}.__init__ computes what the reader does not follow ({exc})"
    forward = methods["forward"]
    params = [a.arg for a in forward.args.args][1:]
    extra = {p: layer_type for p in params[2:] if "type" in p}
    x = np.zeros((1, POSITIONS, head_dim))
    # The positions as the decoder stack hands them: one row (batch, seq), or the same row repeated for each
    # section of a multimodal rotary (rows, batch, seq).
    sections = _sections(config, layer_type)
    for rows in ([positions[None, :]] + ([np.broadcast_to(positions, (len(sections), 1, POSITIONS)).copy()]
                                        if sections else [])):
        try:
            out = interp.call_function(forward, module, [x, rows], extra)
        except Exception as exc:  # noqa: BLE001 - code the reader cannot run is a reason, never a crash
            errors.append(str(exc))
            continue
        if isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, np.ndarray) for o in out):
            table = out
            break
        errors.append("its forward does not return (cos, sin)")
    if table is None:
        return f"{where}: {cls.name}.forward computes what the reader does not follow ({'; '.join(errors)})"
    return _compare(table, head_dim, base, cls.name, file, forward.lineno)


def _sections(config: dict, layer_type: str | None) -> list | None:
    params = config.get("rope_parameters")
    if isinstance(params, dict) and layer_type in params and isinstance(params[layer_type], dict):
        params = params[layer_type]
    found = params.get("mrope_section") if isinstance(params, dict) else None
    return found if isinstance(found, list) else None


def _compare(table, head_dim: int, base: float, cls: str, file: str, line: int) -> FrequencyOrder | str:
    where = f"{file}:{line}"
    cos, sin = (np.asarray(t, dtype=np.float64) for t in table)
    if cos.shape != sin.shape or cos.shape[-1] != head_dim or cos.size != POSITIONS * head_dim:
        return f"{where}: {cls} returns tables of shape {cos.shape}, not one row of {head_dim} per position"
    cos, sin = cos.reshape(POSITIONS, head_dim), sin.reshape(POSITIONS, head_dim)
    half = head_dim // 2
    if not (np.allclose(cos[:, :half], cos[:, half:], atol=TOLERANCE, rtol=0)
            and np.allclose(sin[:, :half], sin[:, half:], atol=TOLERANCE, rtol=0)):
        return (f"{where}: {cls} computes a cos/sin table whose two halves differ: not NeoX rotary "
                "(rotate_half) over the whole head")
    if not np.allclose(cos ** 2 + sin ** 2, 1.0, atol=1e-7, rtol=0):
        return f"{where}: {cls} scales its cos/sin table (cos² + sin² ≠ 1)"
    standard = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arctan2(sin[1, :half], cos[1, :half])  # position 1: each column's frequency, all below pi
    order = []
    for j in range(half):
        k = int(np.argmin(np.abs(standard - angles[j])))
        expected = np.arange(POSITIONS)[:, None] * standard[k]
        if not (np.allclose(cos[:, j], np.cos(expected[:, 0]), atol=1e-7, rtol=0)
                and np.allclose(sin[:, j], np.sin(expected[:, 0]), atol=1e-7, rtol=0)):
            return (f"{where}: {cls} rotates column {j} at a frequency ({angles[j]:.6g}) that is none of "
                    f"{base:g} ** (-2k / {head_dim})")
        order.append(k)
    if sorted(order) != list(range(half)):
        return (f"{where}: {cls} rotates its columns at the frequencies {order} of {base:g} ** (-2k / {head_dim}): "
                "not each once, so not a reordering")
    return FrequencyOrder(tuple(order), base, cls, file, line)


ROW_CALLS = frozenset({"arange", "view", "expand", "reshape", "unsqueeze", "get_seq_length", "repeat", "to", "long",
                       "float", "int", "clone", "contiguous", "size", "broadcast_to", "expand_as"})


def differing_rows(sources: dict[str, str]) -> str | None:
    """Where the decoder stack that builds the rotary module computes the positions it hands it
    from anything but the token positions themselves (a row per section built by another function: a multimodal
    rope index from the image grid), file:line and the call; None where every assignment to the positions only
    counts, reshapes and repeats them, so that every row holds the same positions."""
    found = rotary_class(sources)
    if found is None:
        return None
    file, _rotary, attribute, cls = found
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if forward is None:
        return None
    rotary_args = set()
    for call in (c for c in subtree(forward) if isinstance(c, ast.Call) and _dotted(c.func) == f"self.{attribute}"):
        given = [a.id for a in call.args if isinstance(a, ast.Name)] + [
            k.value.id for k in call.keywords if isinstance(k.value, ast.Name)]
        named = [a for a in given if "pos" in a]
        # The positions (position_ids), beside the hidden states the module reads for its dtype.
        rotary_args.update(named or given[1:2])
    for stmt in subtree(forward):
        if not (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id in rotary_args
                                                     for t in stmt.targets)):
            continue
        for call in (c for c in subtree(stmt.value) if isinstance(c, ast.Call)):
            name = _dotted(call.func).rsplit(".", 1)[-1] or getattr(call.func, "attr", "")
            if name not in ROW_CALLS:
                return f"{file}:{stmt.lineno}: {ast.unparse(stmt)[:80]}"
    return None


# ---------------------------------------------------------------------- a base the code computes
MOVING = "computes another rotary table at each length"  # how read_computed_base names a base that moves
@dataclass(frozen=True)
class ComputedBase:
    """What a rotary module whose base is not a config value computes (TeleChat's: base 10000 * alpha ** (d /
    (d - 2)), alpha from max(length, config.training_seqlen)), run at each of `lengths`: one NeoX table at
    `base` for all of them, its cos/sin rounded to float16 where `float16` (the code's `.half()`)."""

    base: float
    float16: bool
    lengths: tuple[int, ...]
    cls: str
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def read_computed_base(sources: dict[str, str], config: dict, head_dim: int,
                       lengths: tuple[int, ...]) -> ComputedBase | str | None:
    """The base of the NeoX rotary the rotary module computes, where its class is built by the attention or the
    stack as `self.<attr> = Cls(...)` with the head size and the config among its arguments and called as
    `self.<attr>(x)` on the attention's [seq, ...] tensor: the constructor run on the arguments the call site
    gives (the owner's own attributes read by running its __init__'s plain assignments), the forward on a tensor of
    each of `lengths` positions. The base is read from the table's frequencies and the whole table then checked
    against cos/sin(p * base ** (-2k / d)), exactly or as rounded to float16; a reason where the table is not
    that (another form, a base that depends on the length among `lengths`); None where no module is found."""
    found = rotary_class(sources)
    if found is None:
        return None
    file, cls, attr, owner = found
    where = f"{file}:{cls.lineno}"
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    owner_init = next((f for f in owner.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if "__init__" not in methods or "forward" not in methods or owner_init is None:
        return None
    built = next((n.value for n in subtree(owner_init) if isinstance(n, ast.Assign) and len(n.targets) == 1
                  and _dotted(n.targets[0]) == f"self.{attr}" and isinstance(n.value, ast.Call)), None)
    calls = [n for n in subtree(owner) if isinstance(n, ast.Call) and _dotted(n.func) == f"self.{attr}"]
    if built is None or len(calls) != 1 or len(calls[0].args) != 1 or calls[0].keywords:
        return None
    interp = Interpreter(_functions(sources), methods)
    config_obj = Obj(dict(config), "config")
    owner_self = Obj(name="self")
    env = {"config": config_obj, "self": owner_self}
    for statement in owner_init.body:  # the owner's sizes: its plain `self.x = expression` assignments
        if (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Attribute) and _dotted(statement.targets[0].value) == "self"):
            try:
                owner_self.attrs[statement.targets[0].attr] = interp.evaluate(statement.value, env)
            except Exception:  # noqa: BLE001, S112 - an attribute the reader cannot compute is left unset
                continue
    try:
        args = [interp.evaluate(a, env) for a in built.args]
        kwargs = {k.arg: interp.evaluate(k.value, env) for k in built.keywords if k.arg}
    except Exception as exc:  # noqa: BLE001 - code the reader cannot run is a reason, never a crash
        return f"{where}: the arguments of {cls.name}(...) are not computed from the config ({exc})"
    if head_dim not in args + list(kwargs.values()):
        return None
    tables = {}
    for length in lengths:
        for rounding in (False, True):  # the table as computed in float64, then as the code rounds it
            interp.rounding = rounding
            module = Obj(name="self")
            try:
                interp.call_function(methods["__init__"], module, args, kwargs)
                out = interp.call_function(methods["forward"], module, [np.zeros((length, 1, 1, head_dim))])
            except Exception as exc:  # noqa: BLE001 - code the reader cannot run is a reason, never a crash
                return f"{where}: {cls.name} computes what the reader does not follow ({exc})"
            if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(o, np.ndarray) for o in out)):
                return f"{where}: {cls.name}.forward does not return (cos, sin)"
            cos, sin = (np.asarray(o, dtype=np.float64) for o in out)
            if cos.shape != sin.shape or cos.shape[-1] != head_dim or cos.size < length * head_dim:
                return (f"{where}: {cls.name} returns tables of shape {cos.shape}, not a row of {head_dim} per "
                        "position")
            tables[length, rounding] = (cos.reshape(-1, head_dim)[:length], sin.reshape(-1, head_dim)[:length])
    bases, rounded = {}, set()
    for length in lengths:
        cos, sin = tables[length, False]
        # Column 1's turn per position gives the base: base ** (-2 / d).
        step = float(np.arctan2(sin[1, 1], cos[1, 1]))
        if not 0 < step < 1:
            return f"{where}: {cls.name}'s table does not turn its second column by a frequency below 1"
        base = step ** (-head_dim / 2)
        angles = np.arange(length)[:, None] * base ** (-np.arange(0, head_dim, 2) / head_dim)
        angles = np.concatenate([angles, angles], axis=-1)
        exact = np.cos(angles), np.sin(angles)
        if not all(np.allclose(t, e, atol=1e-7, rtol=0) for t, e in zip((cos, sin), exact)):
            return (f"{where}: {cls.name} computes a table at {length} positions that is not NeoX rotary at one "
                    f"base (read {base:.6g} from its second column)")
        final = tables[length, True]
        if not all(np.array_equal(t, e) for t, e in zip(final, (cos, sin))):
            if not all(np.array_equal(t, e.astype(np.float16).astype(np.float64)) for t, e in zip(final, (cos, sin))):
                return f"{where}: {cls.name} rounds its table otherwise than to float16"
            rounded.add(length)
        bases[length] = base
    # The base as a float32 computation would give it: the same to about 1e-6 at every length.
    first = bases[lengths[0]]
    if any(abs(b - first) > 1e-5 * first for b in bases.values()) or len(rounded) not in (0, len(lengths)):
        return (f"{where}: {cls.name} {MOVING} "
                f"({', '.join(f'{n} positions: base {b:.6g}' for n, b in bases.items())})")
    return ComputedBase(first, bool(rounded), tuple(lengths), cls.name, file, methods["forward"].lineno)
