"""Which config attribute the modeling code reads for each size, read statically from its source.

A remote-code model names its sizes as it likes (chatglm2's `num_layers` and `padded_vocab_size`, qwen's
`kv_channels` and `intermediate_size // 2`). The code says which: `nn.ModuleList([Block(...) for i in
range(config.num_layers)])`, `nn.Embedding(config.padded_vocab_size, ...)`. This module turns such an
argument back into an expression over `config` (following `self.x = ...` and local assignments in the same
function), so the generated model evaluates the same expression at run time. Nothing here runs the code.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.detect.identity import transformers_module_name
from scaffold.detect.sourcecode import parse, subtree

# Operators an expression over config may use; anything else is not a size the port can re-evaluate.
OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//"}
MAX_DEPTH = 8  # assignments followed from an argument back to config (self.a = b; b = config.x)


@dataclass(frozen=True)
class CodeExpr:
    """An expression over `config` the code computes a size with, and where."""

    expr: str  # e.g. "config.intermediate_size // 2"
    keys: tuple[str, ...]  # the config attributes it reads
    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


def _is_config(node: ast.AST) -> bool:
    """`config` or `self.config`."""
    return (isinstance(node, ast.Name) and node.id == "config") or (
        isinstance(node, ast.Attribute) and node.attr == "config"
        and isinstance(node.value, ast.Name) and node.value.id == "self")


def _assignments(func: ast.FunctionDef) -> dict[str, ast.AST]:
    """`name = value` and `self.name = value` in one function (a name assigned twice is left out: ambiguous)."""
    out: dict[str, ast.AST] = {}
    twice = set()
    for node in subtree(func):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            # `self.q_heads, self.kv_heads = config.q_heads, config.kv_heads`: one pair per element.
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))
            else:
                pairs = [(target, value)]
            for target, value in pairs:
                if isinstance(target, ast.Name):
                    key = target.id
                elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                      and target.value.id == "self"):
                    key = "self." + target.attr
                else:
                    continue
                if key in out:
                    twice.add(key)
                out[key] = value
    return {k: v for k, v in out.items() if k not in twice}


def config_expr(node: ast.AST, func: ast.FunctionDef | None, _depth: int = 0) -> tuple[str, tuple[str, ...]] | None:
    """`node` as an expression over config (integer constants, + - * //), with the keys it reads; None when it
    depends on anything else."""
    if _depth > MAX_DEPTH:
        return None
    local = _assignments(func) if func is not None else {}
    if isinstance(node, ast.Attribute) and _is_config(node.value):
        return f"config.{node.attr}", (node.attr,)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return str(node.value), ()
    if isinstance(node, ast.Name) and node.id in local:
        return config_expr(local[node.id], func, _depth + 1)
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and f"self.{node.attr}" in local):
        return config_expr(local[f"self.{node.attr}"], func, _depth + 1)
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int"
            and len(node.args) == 1 and not node.keywords):
        # int(config.hidden_size * config.intermediate_multiple_size): GPT-NeoX-Japanese's MLP width.
        inner = config_expr(node.args[0], func, _depth + 1)
        return (f"int({inner[0]})", inner[1]) if inner is not None else None
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = config_expr(node.left, func, _depth + 1), config_expr(node.right, func, _depth + 1)
        if left is None or right is None:
            return None
        wrap = (lambda s: f"({s})" if " " in s else s)
        return f"{wrap(left[0])} {OPERATORS[type(node.op)]} {wrap(right[0])}", left[1] + right[1]
    return None


def evaluate(expr: str, config: dict, aliases: dict[str, str] | None = None) -> int | None:
    """The value of an expression config_expr made, over config.json's values (through the config class's
    attribute_map); None when a key is missing or not an integer."""
    aliases = aliases or {}

    def value(node: ast.AST):
        if isinstance(node, ast.Attribute):
            key = node.attr if node.attr in config else aliases.get(node.attr, node.attr)
            got = config.get(key)
            return got if type(got) is int else None
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "int" and node.args:
            return value(node.args[0])  # of integers: the same integer
        if isinstance(node, ast.BinOp):
            left, right = value(node.left), value(node.right)
            if left is None or right is None or (isinstance(node.op, ast.FloorDiv) and right == 0):
                return None
            return {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}.get(
                type(node.op), left // right if isinstance(node.op, ast.FloorDiv) else None)
        return None

    return value(ast.parse(expr, mode="eval").body)


def methods(sources: dict[str, str]):
    """(file, class, function) for every method of every class in the sources."""
    for name, text in sources.items():
        tree = parse(text)
        if tree is None:
            continue
        for cls in subtree(tree):
            if isinstance(cls, ast.ClassDef):
                for func in cls.body:
                    if isinstance(func, ast.FunctionDef):
                        yield name, cls, func


def callee(node: ast.AST) -> str:
    """The last component of a call's function (nn.Embedding(...) -> Embedding), or of a dotted name."""
    func = node.func if isinstance(node, ast.Call) else node
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _arg(call: ast.Call, index: int, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    return call.args[index] if len(call.args) > index else None


def self_assignments(sources: dict[str, str]):
    """(file, class, function, attribute, value) for every `self.attribute = value`."""
    for file, cls, func in methods(sources):
        for node in subtree(func):
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            target, value = node.targets[0], node.value
            # `self.a, self.b = x, y` assigns one pair per element.
            if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple) and len(target.elts) == len(value.elts):
                pairs = list(zip(target.elts, value.elts))
            else:
                pairs = [(target, value)]
            for target, value in pairs:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                        and target.value.id == "self"):
                    yield file, cls, func, target.attr, value


@dataclass(frozen=True)
class LayerList:
    """`self.<attribute> = nn.ModuleList([<block>(...) for i in range(<count>)])` in class <owner>."""

    attribute: str
    owner: str
    block: str
    count: CodeExpr | None


def layer_lists(sources: dict[str, str]) -> list[LayerList]:
    """Every list of repeated blocks the code builds, with the expression that counts them."""
    out = []
    for file, cls, func, attr, value in self_assignments(sources):
        if not (isinstance(value, ast.Call) and callee(value) == "ModuleList" and value.args):
            continue
        comp = value.args[0]
        if not isinstance(comp, (ast.ListComp, ast.GeneratorExp)) or len(comp.generators) != 1:
            continue
        loop = comp.generators[0].iter
        block = callee(comp.elt) if isinstance(comp.elt, ast.Call) else ""
        count = None
        if isinstance(loop, ast.Call) and callee(loop) == "range" and len(loop.args) == 1:
            found = config_expr(loop.args[0], func)
            if found is not None:
                count = CodeExpr(found[0], found[1], file, loop.lineno)
        out.append(LayerList(attr, cls.name, block, count))
    return out


def constructed(sources: dict[str, str], classes: tuple[str, ...], attribute: str | None = None):
    """(file, function, attribute, call) for `self.<attribute> = <one of classes>(...)`."""
    for file, _cls, func, attr, value in self_assignments(sources):
        if isinstance(value, ast.Call) and callee(value) in classes and attribute in (None, attr):
            yield file, func, attr, value


def call_arg(sources: dict[str, str], classes: tuple[str, ...], attribute: str | None, index: int,
             keyword: str) -> list[tuple[str, CodeExpr]]:
    """(attribute, expression) for an argument of `self.<attribute> = Class(...)`, where it is one over config."""
    out = []
    for file, func, attr, call in constructed(sources, classes, attribute):
        node = _arg(call, index, keyword)
        found = config_expr(node, func) if node is not None else None
        if found is not None:
            out.append((attr, CodeExpr(found[0], found[1], file, call.lineno)))
    return out


# Positional parameters of the torch modules a lab's code builds with a config value in a position.
TORCH_SIGNATURES = {"LayerNorm": ("normalized_shape", "eps"), "RMSNorm": ("normalized_shape", "eps")}


def signatures(sources: dict[str, str]) -> dict[str, tuple[str, ...]]:
    """Positional parameter names of each class (its __init__, self dropped) and function the sources define,
    over TORCH_SIGNATURES: what a positional argument of a call to it is called."""
    out = dict(TORCH_SIGNATURES)
    for text in sources.values():
        tree = parse(text)
        if tree is None:
            continue
        for node in tree.body:  # module-level functions
            if isinstance(node, ast.FunctionDef):
                out.setdefault(node.name, tuple(a.arg for a in node.args.posonlyargs + node.args.args))
        for node in subtree(tree):
            if isinstance(node, ast.ClassDef):
                init = next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                if init is not None:
                    out.setdefault(node.name, tuple(a.arg for a in (init.args.posonlyargs + init.args.args)[1:]))
    return out


def keyword_reads(sources: dict[str, str], keyword: str) -> list[CodeExpr]:
    """Every `Anything(..., <keyword>=<expression over config>)`, e.g. eps=config.layernorm_epsilon, and every
    positional argument in that parameter's place (`Rotary(dim, config.rope_theta_base)` with
    `def __init__(self, dim, base)`)."""
    out = []
    params = signatures(sources)
    for file, _cls, func in methods(sources):
        for node in subtree(func):
            if isinstance(node, ast.Call):
                named = params.get(callee(node), ())
                values = [kw.value for kw in node.keywords if kw.arg == keyword]
                values += [arg for arg, param in zip(node.args, named) if param == keyword]
                for value in values:
                    found = config_expr(value, func)
                    if found is not None and found[1]:
                        out.append(CodeExpr(found[0], found[1], file, node.lineno))
    return out


def config_reads(sources: dict[str, str]) -> set[str]:
    """Every attribute the code reads off `config` / `self.config`."""
    return {node.attr for name, text in sources.items() if (tree := parse(text)) is not None
            for node in subtree(tree) if isinstance(node, ast.Attribute) and _is_config(node.value)}


def attribute_map(ckpt: Checkpoint) -> dict[str, str]:
    """The config class's `attribute_map` (standard name -> the key it is stored under, e.g. GPT-2's
    hidden_size -> n_embd): from the checkpoint's own configuration source, else transformers' file. A config class
    may say the same with properties (OLMo v1's `def num_hidden_layers(self): return self.n_layers`): those count
    too, where attribute_map does not name the standard name."""
    sources = configuration_sources(ckpt)
    for text in sources.values():
        tree = parse(text)
        for node in subtree(tree) if tree is not None else ():
            if (isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None
                    and any(isinstance(t, ast.Name) and t.id == "attribute_map"
                            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))):
                try:
                    table = ast.literal_eval(node.value)
                except ValueError:
                    continue
                if isinstance(table, dict):
                    return {**_property_aliases(sources),
                            **{k: v for k, v in table.items() if isinstance(k, str) and isinstance(v, str)}}
    return _property_aliases(sources)


def _property_aliases(sources: dict[str, str]) -> dict[str, str]:
    """A config class's properties that return one of its attributes under another name (`@property def
    num_hidden_layers(self): return self.n_layers`): property name -> the attribute, as attribute_map would say it."""
    aliases: dict[str, str] = {}
    for text in sources.values():
        tree = parse(text)
        for cls in tree.body if tree is not None else ():
            if not (isinstance(cls, ast.ClassDef) and any(
                    (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "")
                    .endswith("Config") for b in cls.bases)):
                continue
            for fn in cls.body:
                body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))] \
                    if isinstance(fn, ast.FunctionDef) else []
                if (len(body) == 1 and isinstance(body[0], ast.Return)
                        and any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
                        and isinstance(value := body[0].value, ast.Attribute)
                        and isinstance(value.value, ast.Name) and value.value.id == "self" and value.attr != fn.name):
                    aliases.setdefault(fn.name, value.attr)
    return aliases


def configuration_sources(ckpt: Checkpoint) -> dict[str, str]:
    """The code that defines the config class: the checkpoint's own files, else transformers' configuration
    file for its model type."""
    return dict(ckpt.sources) or _transformers_configuration(ckpt.config.get("model_type"))


def _transformers_configuration(model_type) -> dict[str, str]:
    found = importlib.util.find_spec("transformers")
    if not isinstance(model_type, str) or found is None or not found.submodule_search_locations:
        return {}
    folder = transformers_module_name(model_type)
    path = Path(next(iter(found.submodule_search_locations))) / "models" / folder / f"configuration_{folder}.py"
    try:
        return {f"transformers/models/{folder}/{path.name}": path.read_text(encoding="utf-8")}
    except OSError:
        return {}


def code_sources(ckpt: Checkpoint) -> dict[str, str]:
    """The modeling code to read sizes from: the checkpoint's own files only. transformers' modeling files
    read their sizes under the standard names, which config.json (with attribute_map) already gives."""
    return dict(ckpt.sources) if ckpt.sources else {}



def buffer_owners(sources: dict[str, str]) -> dict[str, set[str]]:
    """buffer name -> the classes that hold it: those whose methods call `self.register_buffer("<name>", ...)`, and
    their subclasses in the sources (a rotary subclass inherits its parent's inv_freq)."""
    owners: dict[str, set[str]] = {}
    for _file, cls, func in methods(sources):
        for node in subtree(func):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "register_buffer" and node.args
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                owners.setdefault(node.args[0].value, set()).add(cls.name)
    bases: dict[str, set[str]] = {}
    for text in sources.values():
        tree = parse(text)
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)) if tree is not None else ():
            bases.setdefault(cls.name, set()).update(callee(b) for b in cls.bases)
    for held in owners.values():
        grown = True
        while grown:
            more = {name for name, parents in bases.items() if parents & held} - held
            held |= more
            grown = bool(more)
    return owners


def stored_buffers(sources: dict[str, str], tensors) -> list[str]:
    """The tensors among `tensors` that are buffers the code registers, not parameters: the last component names a
    registered buffer and the module holding it is built from a class that holds that buffer. Where the code does
    not say which class builds that module, the name alone decides. CodeShell's base model registers its causal
    mask as `bias`; its final norm `ln_f` is an nn.LayerNorm, whose `ln_f.bias` is a parameter."""
    owners, kinds = buffer_owners(sources), module_kinds(sources)
    out = []
    for name in tensors:
        parts = name.split(".")
        if parts[-1] not in owners:
            continue
        built = kinds.get(parts[-2], set()) if len(parts) > 1 else set()
        if not built or built & owners[parts[-1]]:
            out.append(name)
    return out


def module_kinds(sources: dict[str, str]) -> dict[str, set[str]]:
    """attribute -> the classes the code assigns to `self.<attribute>` (nn.Embedding -> "Embedding"). A helper
    call around the constructor (chatglm's `init_method(nn.Linear, ...)`) counts its first argument."""
    out: dict[str, set[str]] = {}
    for _file, _cls, _func, attr, value in self_assignments(sources):
        if isinstance(value, ast.Call):
            kind = callee(value)
            if value.args and isinstance(value.args[0], (ast.Attribute, ast.Name)) and callee(value.args[0]) in (
                    "Linear", "Embedding"):
                kind = callee(value.args[0])
            out.setdefault(attr, set()).add(kind)
    return out
