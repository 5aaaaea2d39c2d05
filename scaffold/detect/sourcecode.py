"""Static reading of the checkpoint's own modeling source (never imported or run)."""

from __future__ import annotations

import ast
import copy
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.detect import conditions
from scaffold.detect.identity import transformers_module_name


@dataclass(frozen=True)
class Found:
    value: object
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@lru_cache(maxsize=64)
def parse(text: str) -> ast.Module | None:
    """A module's syntax tree, parsed once per text (detectors read the same files many times); None if
    it does not parse. The trees are shared: read them, never change them."""
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def subtree(node: ast.AST) -> tuple[ast.AST, ...]:
    """ast.walk(node), listed once and kept on the (shared) tree: the detectors walk the same modules,
    classes and methods many times, and a dense file made that quadratic in practice."""
    nodes = node.__dict__.get("_scaffold_nodes")
    if nodes is None:
        nodes = node._scaffold_nodes = tuple(ast.walk(node))  # the one real walk
    return nodes


def _nodes(text: str) -> tuple[ast.AST, ...]:
    tree = parse(text)
    return subtree(tree) if tree is not None else ()


def walk(sources: dict[str, str]):
    """(file name, node) for every node of every source, in ast.walk order."""
    for name, text in sources.items():
        for node in _nodes(text):
            yield name, node


def _trees(ckpt: Checkpoint):
    for name, text in ckpt.sources.items():
        tree = parse(text)
        if tree is not None:
            yield name, tree


def _module_constants(tree: ast.Module) -> dict[str, object]:
    """Module-level NAME = <literal> assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if node.value is None:
                continue
            for target in targets:
                if isinstance(target, ast.Name):
                    try:
                        out[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    return out


def config_default(ckpt: Checkpoint, key: str) -> Found | None:
    """A literal default the code uses for a config key: getattr(config, "key", VALUE).

    VALUE may be a literal or a module-level constant holding one.
    """
    for name, tree in _trees(ckpt):
        constants = _module_constants(tree)
        for node in subtree(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and isinstance(node.args[1], ast.Constant)
                and node.args[1].value == key
            ):
                default = node.args[2]
                if isinstance(default, ast.Name) and default.id in constants:
                    return Found(constants[default.id], name, node.lineno)
                try:
                    return Found(ast.literal_eval(default), name, node.lineno)
                except ValueError:
                    continue
    return None


def added_to_call(ckpt: Checkpoint, callee: str, attribute: str) -> Found | None:
    """Where the code adds `self.<attribute>` to the result of `self.<callee>(...)`."""
    for name, tree in _trees(ckpt):
        for node in subtree(tree):
            if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
                continue
            sides = (node.left, node.right)
            calls = [s for s in sides if isinstance(s, ast.Call) and isinstance(s.func, ast.Attribute)
                     and s.func.attr == callee]
            attrs = [s for s in sides if isinstance(s, ast.Attribute) and s.attr == attribute]
            if calls and attrs:
                return Found(attribute, name, node.lineno)
    return None


# ------------------------------------------------- the modeling code, as text
def modeling_sources(ckpt: Checkpoint) -> dict[str, str]:
    """The code that defines the model: the checkpoint's own files, else transformers' modeling file.

    Both are read as text and parsed, never imported.
    """
    if ckpt.sources:
        return dict(ckpt.sources)
    model_type = ckpt.config.get("model_type")
    found = importlib.util.find_spec("transformers")
    if not isinstance(model_type, str) or found is None or not found.submodule_search_locations:
        return {}
    root = Path(next(iter(found.submodule_search_locations))) / "models"
    for folder in dict.fromkeys((model_type, model_type.replace("-", "_"), transformers_module_name(model_type))):
        path = root / folder / f"modeling_{folder}.py"
        if path.is_file():
            return {f"transformers/models/{folder}/{path.name}": path.read_text(encoding="utf-8")}
    return {}


def _parsed(sources: dict[str, str]):
    for name, text in sources.items():
        tree = parse(text)
        if tree is not None:
            yield name, tree


def _classes(sources: dict[str, str]) -> dict[str, tuple[str, ast.ClassDef]]:
    return {node.name: (name, node) for name, tree in _parsed(sources) for node in subtree(tree)
            if isinstance(node, ast.ClassDef)}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def module_class(sources: dict[str, str], attribute: str,
                 config: dict | None = None) -> tuple[str, Found] | None:
    """The class assigned to `self.<attribute> = Class(...)` somewhere in the code; with `config`, also the
    branch config.json selects of `Class(...) if COND else Other(...)`."""
    for name, tree in _parsed(sources):
        for node in subtree(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == attribute
                    and _dotted(node.targets[0].value) == "self"):
                value = conditions.selected(node.value, config)
                if value is None and isinstance(node.value, ast.IfExp):
                    # `Norm(...) if layer_idx != 0 else nn.Identity()`: the module where there is one.
                    branches = [b for b in (node.value.body, node.value.orelse) if not (
                        isinstance(b, ast.Call) and _dotted(b.func).rsplit(".", 1)[-1] == "Identity")]
                    value = branches[0] if len(branches) == 1 else None
                if isinstance(value, ast.Call) and _dotted(value.func).rsplit(".", 1)[-1] == "Identity":
                    continue  # `if i == 0: self.norm = nn.Identity() else: self.norm = Norm(...)`: the module
                if isinstance(value, ast.Call):
                    return _dotted(value.func), Found(attribute, name, value.lineno)
    return None


LINEAR_CLASSES = {"Linear", "Conv1D"}  # the last component of the callee: nn.Linear, torch.nn.Linear, Conv1D


def declared_linears(sources: dict[str, str], attribute: str) -> tuple[str, dict[str, Found]] | None:
    """The projections the module at `self.<attribute>` always has: `self.X = nn.Linear(...)` statements of its
    class's __init__ that no `if` guards, as {X: where}. None when the code assigns that attribute more than one
    class, or a class it does not define."""
    assigned = set()
    for name, tree in _parsed(sources):
        for node in subtree(tree):
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute) and node.targets[0].attr == attribute
                    and _dotted(node.targets[0].value) == "self"):
                if not isinstance(node.value, ast.Call):
                    return None
                assigned.add(_dotted(node.value.func).rsplit(".", 1)[-1])
    classes = _classes(sources)
    if len(assigned) != 1 or next(iter(assigned)) not in classes:
        return None
    cls = next(iter(assigned))
    file, node = classes[cls]
    init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    out: dict[str, Found] = {}
    for stmt in init.body if init else ():
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Attribute)
                and _dotted(stmt.targets[0].value) == "self" and isinstance(stmt.value, ast.Call)
                and _dotted(stmt.value.func).rsplit(".", 1)[-1] in LINEAR_CLASSES):
            out[stmt.targets[0].attr] = Found(stmt.targets[0].attr, file, stmt.lineno)
    return cls, out


@dataclass(frozen=True)
class NormCode:
    """What a norm class computes, read from its forward."""

    cls: str
    where: Found
    centered: bool  # subtracts the mean: LayerNorm, not RMSNorm
    weight_offset: float  # 1.0 when it scales by (1 + weight)


def _init_values(cls: ast.ClassDef) -> list[ast.AST]:
    """The values `self.<name> = value` takes in the class's __init__."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    return [n.value for n in subtree(init) if isinstance(n, ast.Assign)] if init is not None else []


def weightless_norms(sources: dict[str, str]) -> set[str]:
    """The classes of the code that compute a norm and hold no parameter (OLMo's OlmoLayerNorm:
    F.layer_norm(x, shape, None, None, eps=1e-5); NanoChat's F.rms_norm(x, shape, eps=...))."""
    out = set()
    for name, (_file, node) in _classes(sources).items():
        forward = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
        if forward is None:
            continue
        calls = [n for n in subtree(node) if isinstance(n, ast.Call)]
        norms = [c for c in calls if not _dotted(c.func).startswith("self.")
                 and _dotted(c.func).rsplit(".", 1)[-1] in ("layer_norm", "rms_norm", "rsqrt")]
        # No parameter and no submodule (a class built in __init__: `self.x = Something(...)`).
        params = [c for c in calls if _dotted(c.func).rsplit(".", 1)[-1] == "Parameter"]
        params += [v for v in _init_values(node)
                   if isinstance(v, ast.Call) and _dotted(v.func).rsplit(".", 1)[-1][:1].isupper()]
        weights = [n for n in subtree(node) if isinstance(n, ast.Attribute) and n.attr in ("weight", "bias")
                   and isinstance(n.value, ast.Name) and n.value.id == "self"]
        if norms and not params and not weights:
            out.add(name)
    return out


def norm_code(sources: dict[str, str], attribute: str, config: dict | None = None,
              cls_name: str | None = None) -> NormCode | None:
    """How the norm at `self.<attribute>` computes, from its class's forward (or torch's nn.LayerNorm); with
    `cls_name`, how that class computes (the norm inside a gated norm, scaffold.detect.gatednorm)."""
    found = module_class(sources, attribute, config) if cls_name is None else (cls_name, None)
    if found is None:
        return None
    cls, where = found
    short = cls.rsplit(".", 1)[-1]
    if cls in ("nn.LayerNorm", "torch.nn.LayerNorm", "LayerNorm") and short not in _classes(sources):
        return NormCode(cls, where, True, 0.0)
    classes = _classes(sources)
    seen = set()
    while short in classes and short not in seen:
        seen.add(short)
        file, node = classes[short]
        centered = offset = False
        for sub in subtree(node):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Add):
                sides = (sub.left, sub.right)
                if any(isinstance(s, ast.Constant) and s.value in (1, 1.0) for s in sides) and any(
                        "self.weight" in ast.unparse(s) for s in sides):
                    offset = True
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub) and "mean" in ast.unparse(sub.right):
                centered = True
            if isinstance(sub, ast.Call) and _dotted(sub.func).endswith("layer_norm"):
                centered = True
        has_forward = any(isinstance(n, ast.FunctionDef) and n.name == "forward" for n in node.body)
        if has_forward:
            return NormCode(cls, Found(short, file, node.lineno), centered, 1.0 if offset else 0.0)
        bases = [_dotted(b) for b in node.bases]
        if any(b in ("nn.LayerNorm", "torch.nn.LayerNorm") for b in bases):
            return NormCode(cls, Found(short, file, node.lineno), True, 0.0)
        short = bases[0].rsplit(".", 1)[-1] if bases else ""
    return None


def rotate_half_style(sources: dict[str, str]) -> Found | None:
    """Where rotate_half pairs even and odd channels (GPT-J style), if it does."""
    for name, tree in _parsed(sources):
        for node in subtree(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "rotate_half":
                for sub in subtree(node):
                    if isinstance(sub, ast.Slice) and isinstance(sub.step, ast.Constant) and sub.step.value == 2:
                        return Found("gptj", name, sub.lineno)
    return None


def interleaved_qkv(sources: dict[str, str], attribute: str, config: dict | None = None) -> Found | None:
    """Where the output of `self.<attribute>(...)` is viewed per head: as [..., heads, 3 * head_size] or
    [..., heads, 3, head_size] (value "interleaved": q, k, v per head), in the function that calls it or in a
    method of the same class (BLOOM's forward hands it to self._reshape); or as [..., groups, heads // kv + 2,
    head_size] (value "grouped": per KV head its query heads, a key and a value; Falcon's new decoder). A view in
    a branch that config.json rules out does not count (Falcon keeps all three layouts behind its flags)."""
    for name, tree in _parsed(sources):
        for func in subtree(tree):
            if not isinstance(func, ast.FunctionDef):
                continue
            calls = [n for n in subtree(func) if isinstance(n, ast.Call) and _dotted(n.func) == f"self.{attribute}"]
            if not calls:
                continue
            for sub in subtree(func):
                if (isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Mult)
                        and any(isinstance(s, ast.Constant) and s.value == 3 for s in (sub.left, sub.right))
                        and any("head" in ast.unparse(s) for s in (sub.left, sub.right))):
                    return Found("interleaved", name, sub.lineno)
        for cls in subtree(tree):
            if not isinstance(cls, ast.ClassDef) or not any(
                    isinstance(n, ast.Call) and _dotted(n.func) == f"self.{attribute}" for n in subtree(cls)):
                continue
            off = ruled_out(cls, config)
            for sub in subtree(cls):
                if (id(sub) in off or not isinstance(sub, ast.Call) or not isinstance(sub.func, ast.Attribute)
                        or sub.func.attr not in ("view", "reshape")):
                    continue
                if _heads_three_dim(sub.args):
                    return Found("interleaved", name, sub.lineno)
                if _groups_dim(sub.args):
                    return Found("grouped", name, sub.lineno)
    return None


def _heads_three_dim(args: list[ast.expr]) -> bool:
    """Whether a view's trailing sizes are (heads, 3, head_dim): per-head q, k, v stacked."""
    if len(args) < 3:
        return False
    heads, three, dim = args[-3:]
    return (isinstance(three, ast.Constant) and three.value == 3 and "head" in ast.unparse(heads)
            and "dim" in ast.unparse(dim))


def _groups_dim(args: list[ast.expr]) -> bool:
    """Whether a view's trailing sizes are (heads // kv_heads + 2, head_dim): per KV group its query heads, a key
    and a value."""
    if len(args) < 2:
        return False
    group, dim = args[-2:]
    return (isinstance(group, ast.BinOp) and isinstance(group.op, ast.Add)
            and isinstance(group.right, ast.Constant) and group.right.value == 2
            and isinstance(group.left, ast.BinOp) and isinstance(group.left.op, ast.FloorDiv)
            and "head" in ast.unparse(group.left) and "dim" in ast.unparse(dim))


def config_aliases(cls: ast.ClassDef) -> dict[str, str]:
    """The attributes a class copies from the config (`self.multi_query = config.multi_query`): attribute -> key.
    An attribute assigned anything else anywhere in the class is left out."""
    found: dict[str, set[str | None]] = {}
    for node in subtree(cls):
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and ast.unparse(node.targets[0].value) == "self"):
            value = node.value
            key = (value.attr if isinstance(value, ast.Attribute)
                   and ast.unparse(value.value) in ("config", "self.config") else None)
            found.setdefault(node.targets[0].attr, set()).add(key)
    return {attr: next(iter(keys)) for attr, keys in found.items() if len(keys) == 1 and None not in keys}


class _ConfigReads(ast.NodeTransformer):
    def __init__(self, aliases: dict[str, str]):
        self.aliases = aliases

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        if isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.aliases:
            return ast.Attribute(value=ast.Name("config", ast.Load()), attr=self.aliases[node.attr], ctx=ast.Load())
        return self.generic_visit(node)


def config_reads(test: ast.expr, aliases: dict[str, str]) -> ast.expr:
    """`test` with each `self.A` the class copies from config key K (see config_aliases) read as `config.K`."""
    return _ConfigReads(aliases).visit(copy.deepcopy(test))


def configured(sources: dict[str, str], config: dict) -> dict:
    """config.json as the modeling code leaves it: a constant the code's constructors assign to a config key
    (`config.K = 2`), at their top level or under a test config.json decides true, is applied in order (Falcon's
    decoder layer sets num_ln_in_parallel_attn = 2 where it is None and new_decoder_architecture holds)."""
    out = dict(config)

    def apply(statements: list[ast.stmt]) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.If):
                truth = conditions.evaluate(stmt.test, out)
                if truth is not None:
                    apply(stmt.body if truth else stmt.orelse)
            elif (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1
                  and isinstance(target := stmt.targets[0], ast.Attribute) and not target.attr.startswith("_")
                  and ast.unparse(target.value) in ("config", "self.config") and isinstance(stmt.value, ast.Constant)):
                out[target.attr] = stmt.value.value

    for _name, tree in _parsed(sources):
        for node in subtree(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                apply(node.body)
    return out


def ruled_out(cls: ast.ClassDef, config: dict | None) -> set[int]:
    """ids of the nodes in the branches of the class's `if` statements that config.json rules out: tests over
    config values and the attributes the class copies from them. A test over anything else rules nothing out."""
    if config is None:
        return set()
    aliases = config_aliases(cls)
    off: set[int] = set()
    for node in subtree(cls):
        if isinstance(node, ast.If):
            truth = conditions.evaluate(config_reads(node.test, aliases), config)
            if truth is not None:
                for stmt in node.orelse if truth else node.body:
                    off.update(id(n) for n in subtree(stmt))
    return off


def sqrt_hidden_scale(sources: dict[str, str]) -> Found | None:
    """Where the code scales by hidden_size ** 0.5 (embeddings multiplied by a normalizer)."""
    for name, tree in _parsed(sources):
        for node in subtree(tree):
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow)
                    and isinstance(node.right, ast.Constant) and node.right.value == 0.5
                    and ast.unparse(node.left).endswith("hidden_size")):
                return Found("hidden_size ** 0.5", name, node.lineno)
    return None
