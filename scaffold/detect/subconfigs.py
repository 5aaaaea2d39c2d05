"""Sizes and settings the modeling code reads from sub-configs, and experts stored flattened: two forms the port has
no field for, named where a refusal needs them (read as text, never run).

- Sub-configs (DBRX's `config.attn_config.kv_n_heads`, `DbrxRouter(config.ffn_config)`): a config key whose value in
  config.json is itself a dict, read by attribute (`config.K.Y`, or through a local or attribute holding `config.K`),
  or handed to a class as that class's config (whose `config.Y` then reads `K.Y`). The port's size fields read keys
  of the top-level config.
- Flattened experts (DBRX's `w1`, `v1`, `w2`): one 2-D parameter per projection holding every expert's rows,
  declared `nn.Parameter(torch.empty(E * F, H))` and viewed per expert in forward (`.view(-1, F, H)[expert]`). The
  port's experts load one [out, in] matrix per expert, or a 3-D tensor [experts, ...] (scaffold.detect.stacked).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from scaffold.detect.sourcecode import _classes, _dotted, subtree

MAX_HOPS = 4
TENSOR_BUILDERS = ("empty", "zeros", "ones", "randn", "rand", "full")


@dataclass(frozen=True)
class SubconfigReads:
    reads: tuple[str, ...]  # "K.Y", sorted, each once
    handed: tuple[tuple[str, str, str], ...]  # (K, class, FILE:LINE) for `Cls(config.K)`
    first: str  # FILE:LINE of the first read
    at: tuple[tuple[str, str], ...] = ()  # ("K.Y", FILE:LINE of its first read)

    def sizes(self, config: dict) -> tuple[str, ...]:
        """The reads config.json holds an integer for (the sizes among them)."""
        out = []
        for read in self.reads:
            key, _, leaf = read.partition(".")
            value = config.get(key, {}).get(leaf) if isinstance(config.get(key), dict) else None
            if isinstance(value, int) and not isinstance(value, bool):
                out.append(read)
        return tuple(out)

    def describe(self, config: dict, at_most: int = 5) -> str:
        """The sizes read (else every read), at most `at_most`, and the first line that reads one."""
        shown = (self.sizes(config) or self.reads)[:at_most]
        where = dict(self.at)
        first = min((where[r] for r in shown if r in where), key=_line, default=self.first)
        total = len(self.sizes(config) or self.reads)
        return ", ".join(shown) + (", ..." if total > at_most else "") + f" ({first})"


def _sub_keys(config: dict) -> set[str]:
    return {k for k, v in config.items() if isinstance(v, dict) and not k.startswith("_")
            and k not in ("rope_parameters", "rope_scaling", "quantization_config")}


def subconfig_reads(sources: dict[str, str], config: dict) -> SubconfigReads | None:
    """What the code reads from the sub-configs config.json holds (see the module's docstring); None where it reads
    none."""
    subs = _sub_keys(config)
    if not subs:
        return None
    classes = _classes(sources)
    reads: dict[str, str] = {}
    handed: list[tuple[str, str, str]] = []
    # Classes that receive a sub-config as their own `config`: class name -> key.
    receivers: dict[str, str] = {}
    for _ in range(MAX_HOPS):
        before = len(receivers)
        for name, (file, cls) in classes.items():
            own = receivers.get(name)
            for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
                aliases: dict[str, str] = {}  # local or self.attr -> key
                for node in sorted((n for n in subtree(func) if hasattr(n, "lineno")),
                                   key=lambda n: (n.lineno, n.col_offset)):
                    if isinstance(node, ast.Assign) and len(node.targets) == 1:
                        key = _sub_of(node.value, aliases, own, subs)
                        target = _dotted(node.targets[0])
                        if key is not None and target and "." not in target.removeprefix("self."):
                            aliases[target] = key
                    if isinstance(node, ast.Attribute) and (key := _sub_of(node.value, aliases, own, subs)):
                        reads.setdefault(f"{key}.{node.attr}", f"{file}:{node.lineno}")
                    if isinstance(node, ast.Call) and (callee := _dotted(node.func).rsplit(".", 1)[-1]) in classes:
                        for arg in [*node.args, *(k.value for k in node.keywords if k.arg == "config")][:1]:
                            key = _sub_of(arg, aliases, own, subs)
                            if key is not None:
                                receivers.setdefault(callee, key)
                                handed.append((key, callee, f"{file}:{node.lineno}"))
                    elif own is not None and isinstance(node, ast.Attribute) and _plain_config(node.value):
                        reads.setdefault(f"{own}.{node.attr}", f"{file}:{node.lineno}")
        if len(receivers) == before:
            break
    reads = {r: at for r, at in reads.items() if r.split(".", 1)[0] in subs and r.split(".")[-1] not in subs}
    if not reads and not handed:
        return None
    first = min(reads.values(), key=_line) if reads else handed[0][2]
    return SubconfigReads(tuple(sorted(reads)), tuple(dict.fromkeys(handed)), first, tuple(sorted(reads.items())))


def _line(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def _plain_config(node: ast.AST) -> bool:
    return _dotted(node) in ("config", "self.config")


def _sub_of(node: ast.AST, aliases: dict[str, str], own: str | None, subs: set[str]) -> str | None:
    """The sub-config key an expression holds: `config.K` (K a dict in config.json), a local or attribute assigned
    one; None otherwise. In a class that received a sub-config as its config, `config.K` is not looked up (its
    config is the sub-config)."""
    dotted = _dotted(node)
    if not dotted:
        return None
    if dotted in aliases:
        return aliases[dotted]
    for root in ("config.", "self.config."):
        if dotted.startswith(root) and own is None and (key := dotted[len(root):]) in subs:
            return key
    return None


@dataclass(frozen=True)
class FlattenedExperts:
    cls: str
    params: tuple[str, ...]  # the 2-D parameters, as declared
    declared: str  # FILE:LINE: the first declaration as written
    viewed: str  # FILE:LINE: a view of one of them per expert, as written ("" where none was found)

    def describe(self) -> str:
        declared_at = self.declared.split(": ", 1)[0]
        viewed_at = self.viewed.split(": ", 1)[0]
        return (f"{', '.join(self.params)} of {self.cls}: one 2-D parameter each for all experts ({declared_at}), "
                f"viewed per expert ({viewed_at})")


def flattened_experts(sources: dict[str, str], layer0: dict) -> FlattenedExperts | None:
    """A class declaring 2-D parameters whose first size is a product (`nn.Parameter(torch.empty(E * F, H))`), which
    layer 0 stores as 2-D tensors ending in those names, and which the code views with three or more sizes
    (`self.mlp.w1.view(split_expert_shape)[expert_idx]`, split_expert_shape = (-1, F, H)); None otherwise."""
    stored = {name.rsplit(".", 1)[-1]: info for name, info in layer0.items() if len(getattr(info, "shape", ())) == 2}
    for file, cls in _classes(sources).values():
        init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
        found: dict[str, ast.Assign] = {}
        for node in subtree(init) if init is not None else ():
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Attribute) and _dotted(node.targets[0].value) == "self"
                    and isinstance(node.value, ast.Call) and _dotted(node.value.func).endswith("Parameter")
                    and node.value.args and isinstance(built := node.value.args[0], ast.Call)
                    and _dotted(built.func).rsplit(".", 1)[-1] in TENSOR_BUILDERS):
                continue
            sizes = built.args[0].elts if len(built.args) == 1 and isinstance(built.args[0], (ast.Tuple, ast.List)) \
                else built.args
            if len(sizes) == 2 and isinstance(sizes[0], ast.BinOp) and isinstance(sizes[0].op, ast.Mult) \
                    and node.targets[0].attr in stored:
                found[node.targets[0].attr] = node
        if not found:
            continue
        viewed = _per_expert_view(sources, set(found))
        if not viewed:
            continue
        first = min(found.values(), key=lambda n: n.lineno)
        return FlattenedExperts(cls.name, tuple(found), f"{file}:{first.lineno}: {ast.unparse(first.value)}", viewed)
    return None


def _per_expert_view(sources: dict[str, str], params: set[str]) -> str:
    """FILE:LINE: `<...>.P.view(shape)` with three or more sizes (a local tuple followed), for P among `params`."""
    for file, cls in _classes(sources).values():
        for func in (f for f in cls.body if isinstance(f, ast.FunctionDef)):
            locals_ = {n.targets[0].id: n.value for n in subtree(func) if isinstance(n, ast.Assign)
                       and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
            for node in subtree(func):
                if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("view", "reshape", "unflatten")
                        and isinstance(node.func.value, ast.Attribute) and node.func.value.attr in params):
                    continue
                args = [locals_.get(a.id, a) if isinstance(a, ast.Name) else a for a in node.args]
                sizes = args[0].elts if len(args) == 1 and isinstance(args[0], (ast.Tuple, ast.List)) else args
                if len(sizes) >= 3 or node.func.attr == "unflatten":
                    shape = ", ".join(ast.unparse(s) for s in sizes)
                    return f"{file}:{node.lineno}: {node.func.value.attr} viewed as ({shape})"
    return ""
