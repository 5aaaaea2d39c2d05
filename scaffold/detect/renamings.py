"""The names transformers gives a checkpoint's tensors when it loads them, read from its conversion table.

Some checkpoints keep modules under other names than their modeling code: HY-V3's keep `mlp.router.gate.weight`,
`mlp.expert_bias` and `mlp.shared_mlp.*` where the code builds `mlp.gate`, `mlp.e_score_correction_bias` and
`mlp.shared_experts`; transformers renames them on load (conversion_mapping.py, its `WeightRenaming` entries for
the model type). The port keeps the checkpoint's names; what the code says about a module (the attribute the
routing reads, the width it builds the shared expert with) is looked up under the code's name.

The table is read as text and parsed, like the modeling file, never imported. Only plain renamings are taken: a
source regex and a target name, both string literals without capturing groups. The function that builds the
table is followed statement by statement: the table literal, `mapping[T] = mapping[B].copy()`, `mapping[T] =
[...]`, `mapping[T] += [...]`, then the model types that share another's table (_MODEL_TO_CONVERSION_PATTERN).

`chunks` reads the table's other plain entry: a `WeightConverter` whose one operation is `Chunk(dim=0)` (no config
attribute counting the pieces), a checkpoint tensor cut into equal row blocks, one per target, in order: HRM-Text's
`attn.gqkv_proj.weight` -> self_attn.gate_proj, q_proj, k_proj, v_proj, i.e. the stored rows are [gate | q | k | v].
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.detect.sourcecode import _dotted

BUILDER = "_build_checkpoint_conversion_mapping"
ALIASES = "_MODEL_TO_CONVERSION_PATTERN"


def renamings(ckpt: Checkpoint) -> tuple[tuple[str, str], ...]:
    """(source regex, target) for the checkpoint's model type, in the order transformers applies them; empty
    for a checkpoint that brings its own code (transformers' table is for its own modeling files)."""
    model_type = ckpt.config.get("model_type")
    if ckpt.sources or not isinstance(model_type, str):
        return ()
    return _table().get(model_type, ())


@dataclass(frozen=True)
class Chunked:
    source: str  # the stored tensor's pattern (`attn.gqkv_proj.weight`)
    targets: tuple[str, ...]  # the code's tensors its equal row blocks become, in order


def chunks(ckpt: Checkpoint) -> tuple[Chunked, ...]:
    """The tensors transformers cuts into equal row blocks on load, for the checkpoint's model type (empty for a
    checkpoint that brings its own code)."""
    model_type = ckpt.config.get("model_type")
    if ckpt.sources or not isinstance(model_type, str):
        return ()
    return _chunk_table().get(model_type, ())


def code_name(table: tuple[tuple[str, str], ...], name: str) -> str:
    """`name` as the modeling code calls it: each renaming whose source matches replaces the first match."""
    for source, target in table:
        found = re.search(source.replace("*.", r".*\."), name)
        if found:
            name = name.replace(found.group(0), target, 1)
    return name


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, tuple[tuple[str, str], ...]]:
    return parse_table(_text())


@functools.lru_cache(maxsize=1)
def _chunk_table() -> dict[str, tuple[Chunked, ...]]:
    return parse_chunks(_text())


def _text() -> str:
    found = importlib.util.find_spec("transformers")
    if found is None or not found.submodule_search_locations:
        return ""
    path = Path(next(iter(found.submodule_search_locations))) / "conversion_mapping.py"
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""


def parse_table(text: str) -> dict[str, tuple[tuple[str, str], ...]]:
    """model type -> its plain renamings, from conversion_mapping.py's text."""
    return {model_type: tuple(r for r in map(_renaming, entries) if r is not None)
            for model_type, entries in _entries(text).items()}


def parse_chunks(text: str) -> dict[str, tuple[Chunked, ...]]:
    """model type -> the tensors it cuts into equal row blocks (`Chunk(dim=0)`), from conversion_mapping.py's text;
    only the model types that have one."""
    out = {model_type: tuple(c for c in map(_chunked, entries) if c is not None)
           for model_type, entries in _entries(text).items()}
    return {model_type: found for model_type, found in out.items() if found}


def _entries(text: str) -> dict[str, list[ast.expr]]:
    """model type -> the entries of its table (aliases resolved), as syntax."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return {}
    aliases: dict[str, str] = {}
    builder = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [_dotted(t) for t in node.targets] == [ALIASES] \
                and isinstance(node.value, ast.Dict):
            aliases = {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                       if _string(k) and _string(v)}
        if isinstance(node, ast.FunctionDef) and node.name == BUILDER:
            builder = node
    if builder is None:
        return {}
    table: dict[str, list[ast.expr]] = {}
    for node in builder.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Dict):
                table.update({k.value: list(v.elts) for k, v in zip(value.keys, value.values)
                              if _string(k) and isinstance(v, ast.List)})
            elif (key := _entry(target)) is not None:
                if isinstance(value, ast.List):
                    table[key] = list(value.elts)
                elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) \
                        and value.func.attr == "copy" and (base := _entry(value.func.value)) is not None:
                    table[key] = list(table.get(base, []))
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add) \
                and (key := _entry(node.target)) is not None and isinstance(node.value, ast.List):
            table.setdefault(key, []).extend(node.value.elts)
    for model_type, base in aliases.items():
        if model_type not in table and base in table:
            table[model_type] = list(table[base])
    return table


def _string(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _entry(node) -> str | None:
    """T for `mapping[T]`."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and _string(node.slice):
        return node.slice.value
    return None


def _renaming(node) -> tuple[str, str] | None:
    """(source regex, target name) of `WeightRenaming(source, target)` with plain string literals."""
    if not isinstance(node, ast.Call) or _dotted(node.func).rsplit(".", 1)[-1] != "WeightRenaming":
        return None
    given = dict(zip(("source_patterns", "target_patterns"), node.args))
    given.update({k.arg: k.value for k in node.keywords if k.arg in ("source_patterns", "target_patterns")})
    source, target = given.get("source_patterns"), given.get("target_patterns")
    if not (_string(source) and _string(target)) or "(" in source.value + target.value:
        return None
    # The target is a name: transformers drops its anchors and the escapes of its dots.
    name = target.value.removeprefix("^").removesuffix("$").replace(r"\.", ".")
    return source.value, name


def _chunked(node) -> Chunked | None:
    """`WeightConverter(source, [targets], operations=[Chunk(dim=0)])` with string literals and no pattern groups."""
    if not isinstance(node, ast.Call) or _dotted(node.func).rsplit(".", 1)[-1] != "WeightConverter":
        return None
    names = ("source_patterns", "target_patterns", "operations")
    given = dict(zip(names, node.args))
    given.update({k.arg: k.value for k in node.keywords if k.arg in names})
    source, targets, operations = (given.get(n) for n in names)
    if not (_string(source) and isinstance(targets, ast.List) and len(targets.elts) > 1
            and all(_string(t) for t in targets.elts) and isinstance(operations, ast.List)
            and len(operations.elts) == 1):
        return None
    op = operations.elts[0]
    if not (isinstance(op, ast.Call) and _dotted(op.func).rsplit(".", 1)[-1] == "Chunk" and not op.args[1:]):
        return None
    dims = [a for a in op.args[:1]] + [k.value for k in op.keywords if k.arg == "dim"]
    if [k.arg for k in op.keywords if k.arg != "dim"] or len(dims) > 1:
        return None  # num_shards_attribute: the count is the config's, not the targets'
    if dims and not (isinstance(dims[0], ast.Constant) and dims[0].value == 0):
        return None
    texts = [source.value] + [t.value for t in targets.elts]
    if any(c in t for t in texts for c in "()^$*\\"):
        return None
    return Chunked(source.value, tuple(t.value for t in targets.elts))
