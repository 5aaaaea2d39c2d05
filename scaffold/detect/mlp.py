"""MLP: activation and sizes."""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect import branches, codekeys, dataflow
from scaffold.detect.activations import (
    _package_file,
    gated_forms,
    tensor_activation,
    transformers_activation_classes,
    transformers_activations,
    vllm_registry,
)
from scaffold.detect.common import BACKEND_HINT, config_value, set_from_config, stored_shape, unsupported
from scaffold.detect.sourcecode import _parsed, declared_linears, modeling_sources, subtree, walk
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec

ACT_KEYS = ("hidden_act", "hidden_activation", "activation_function")


def activation_keys(ckpt: Checkpoint) -> tuple[str, ...]:
    """The config keys to read the activation from: the one the code looks up in transformers' activation table
    (`ACT2FN[config.K]`, `get_activation(config.K)`, whatever K is called: Falcon's `activation`), first."""
    for _, node in walk(modeling_sources(ckpt)):
        read = None
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "ACT2FN":
            read = node.slice
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_activation"
              and len(node.args) == 1):
            read = node.args[0]
        if (isinstance(read, ast.Attribute) and ast.unparse(read.value) in ("config", "self.config")
                and (read.attr in ACT_KEYS or isinstance(ckpt.config.get(read.attr), str))):
            return (read.attr,) + tuple(k for k in ACT_KEYS if k != read.attr)
    return ACT_KEYS


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    keys = activation_keys(ckpt)
    # The checkpoint's own code, else transformers' file (MPT builds nn.GELU with no config key naming it).
    found = code_activation(modeling_sources(ckpt), spec.names.get("mlp", "mlp"), ckpt.config)
    unread = None
    if config_value(ckpt, *keys)[0] is None and found is not None:
        # No activation in config.json: the one the MLP's code calls.
        act, where_found = found
        spec.set("hidden_act", act, Source("code", f"{where_found}: the MLP's forward applies {act}"))
    elif config_value(ckpt, *keys)[0] is None and (unread := _unread_activation(
            modeling_sources(ckpt), spec.names.get("mlp", "mlp"), set(spec.names.values()))) is not None:
        # The code applies an activation module the reader does not know: not silu by default, but unknown.
        spec.unknown("hidden_act", f"{unread}: the MLP applies a module whose activation the generator does not "
                                   "read, and config.json names none; set hidden_act (vLLM's name) in a spec file")
        act = None
    else:
        act = set_from_config(spec, ckpt, "hidden_act", keys, str, default="silu", runtime=False)
    if act is not None:
        _check_activation(act, spec, where)
        _check_activation_tensors(act, spec, where)
    n = spec.names
    _activation_sparsity(ckpt, spec, where)
    if not spec.mlp_on_layer and (altered := altered_projection(
            modeling_sources(ckpt), n.get("mlp", "mlp"),
            {n[r] for r in ("gate_proj", "up_proj", "gate_up_proj") if r in n})) is not None:
        raise unsupported(f"the MLP changes its projections' outputs before their product ({altered}), which the "
                          "port's act(gate) * up does not compute", where, spec.model_type)
    base = f"{n['model']}.{n['layers']}"
    widths = spec.layer_intermediate_sizes
    if widths and spec.is_moe:
        raise unsupported(f"MLP widths of each layer's own ({spec.source('layer_intermediate_sizes').detail}) in "
                          "a MoE model, where the port builds those from one width", where, spec.model_type)
    inter, hidden = spec.intermediate_size, spec.hidden_size

    def shapes_of(inter: int) -> dict:
        if spec.mlp_kind == "gated" and spec.gate_up_layout == "fused":
            shapes = {"gate_up_proj": (2 * inter, hidden)}
        elif spec.mlp_kind == "gated":
            shapes = {"gate_proj": (inter, hidden), "up_proj": (inter, hidden)}
        else:
            shapes = {"up_proj": (inter, hidden)}
        shapes["down_proj"] = (hidden, inter)
        return shapes

    shapes = shapes_of(inter)
    _check_declared(ckpt, spec, shapes)
    sparse = set(spec.sparse_layers)  # their experts are checked by detect.moe
    for layer in range(spec.num_layers):
        if layer in sparse:
            continue
        if widths:  # this layer's own width
            inter = widths[layer]
            shapes = shapes_of(inter)
        for role, shape in shapes.items():
            # OPT's fc1, fc2 are the layer's own (spec.mlp_on_layer): no MLP module in the checkpoint's name.
            name = f"{base}.{layer}.{n[role] if spec.mlp_on_layer else n['mlp'] + '.' + n[role]}.weight"
            info = ckpt.tensors.get(name)
            if info is None:
                raise CheckpointError(f"tensor {name} is missing.", where)
            shape = stored_shape(spec, role, shape)
            if info.shape != shape:
                raise CheckpointError(
                    f"tensor {name} has shape {list(info.shape)}, but hidden size {hidden} and "
                    f"intermediate size {inter} need {list(shape)}.",
                    where,
                )
        if spec.gate_extra_bias:
            name = f"{base}.{layer}.{n['mlp']}.{spec.gate_extra_bias}"
            info = ckpt.tensors.get(name)
            if info is None or info.shape != (inter,):
                raise CheckpointError(f"tensor {name} must exist with shape [{inter}].", where)


# torch calls and modules, by the name of vLLM's (and transformers') registry entry computing the same.
TORCH_ACTIVATIONS = {"silu": "silu", "SiLU": "silu", "gelu": "gelu", "GELU": "gelu", "relu": "relu", "ReLU": "relu",
                     "sigmoid": "sigmoid", "Sigmoid": "sigmoid", "tanh": "tanh", "Tanh": "tanh"}


def _activation_of(node: ast.Call) -> str | None:
    name = TORCH_ACTIVATIONS.get(node.func.attr if isinstance(node.func, ast.Attribute) else
                                 node.func.id if isinstance(node.func, ast.Name) else "")
    if name == "gelu" and any(k.arg == "approximate" and isinstance(k.value, ast.Constant) and k.value.value == "tanh"
                              for k in node.keywords):
        return "gelu_pytorch_tanh"
    return name


def _formula(func: ast.FunctionDef) -> str | None:
    """The registry name of the activation a hand-written function computes, read from its constants: GPT-2's
    tanh approximation 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x ** 3))) is gelu_new; x * sigmoid(1.702
    * x) is quick_gelu; 0.5 * x * (1 + erf(x / sqrt(2))) is gelu."""
    constants = {n.value for n in subtree(func) if isinstance(n, ast.Constant) and isinstance(n.value, float)}
    calls = {codekeys.callee(n) for n in subtree(func) if isinstance(n, ast.Call)}
    if 0.044715 in constants and "tanh" in calls:
        return "gelu_new"
    if 1.702 in constants and "sigmoid" in calls:
        return "quick_gelu"
    if "erf" in calls and 0.5 in constants:
        return "gelu"
    return None


def _activation_functions(sources: dict[str, str]) -> dict[str, str]:
    """Module-level functions of the code that compute a known activation (a lab's `new_gelu`), by name."""
    out = {}
    for _file, tree in _parsed(sources):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and (name := _formula(node)):
                out[node.name] = name
    return out


def _activation_classes(sources: dict[str, str], formulas: dict[str, str]) -> dict[str, str]:
    """Module classes of the code whose forward computes a known activation, itself or through a function of
    `formulas` (BLOOM's BloomGelu calls bloom_gelu_forward), by class name."""
    out: dict[str, str] = {}
    forwards = [(cls.name, func) for _file, cls, func in codekeys.methods(sources) if func.name == "forward"]
    for _ in range(3):  # a class may reach the formula through another (BloomGelu -> GeLUFunction.apply)
        for name, func in forwards:
            called = {formulas[n.func.id] for n in subtree(func) if isinstance(n, ast.Call)
                      and isinstance(n.func, ast.Name) and n.func.id in formulas}
            called |= {out[n.func.value.id] for n in subtree(func) if isinstance(n, ast.Call)
                       and isinstance(n.func, ast.Attribute) and n.func.attr == "apply"
                       and isinstance(n.func.value, ast.Name) and n.func.value.id in out}
            if (formula := _formula(func)) is not None:
                called.add(formula)
            if len(called) == 1:
                out[name] = called.pop()
    return out


NOT_ACTIVATIONS = ("Linear", "Dropout", "Norm", "Conv1D", "Identity", "Embedding")
ACTIVATION_WORDS = re.compile(r"act|gelu|silu|swish|relu|glu|sigmoid|tanh", re.IGNORECASE)


def _unread_activation(sources: dict[str, str], mlp_attr: str, projections: set[str]) -> str | None:
    """"FILE:LINE: self.X" for a module the MLP's class builds and its forward applies that is neither one of
    its projections nor a linear, dropout or norm layer: an activation the reader did not recognise."""
    classes = {codekeys.callee(value) for _f, _c, _fn, attr, value in codekeys.self_assignments(sources)
               if attr == mlp_attr and isinstance(value, ast.Call)}
    holding = {cls.name for _f, cls, _fn, _attr, value in codekeys.self_assignments(sources)
               if isinstance(value, ast.Call)}  # classes that build modules or parameters of their own
    defined = {cls.name for _f, cls, _fn in codekeys.methods(sources)}
    # A module class the code defines without modules of its own, or one whose name says it is an activation
    # (an import the code does not define).
    built = {attr: value for _f, cls, _fn, attr, value in codekeys.self_assignments(sources)
             if cls.name in classes and isinstance(value, ast.Call) and attr not in projections
             and not any(word in codekeys.callee(value) for word in NOT_ACTIVATIONS)
             and ((codekeys.callee(value) in defined and codekeys.callee(value) not in holding)
                  or ACTIVATION_WORDS.search(codekeys.callee(value)))}
    for file, cls, func in codekeys.methods(sources):
        if cls.name in classes and func.name == "forward":
            for node in subtree(func):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "self"
                        and node.func.attr in built):
                    return f"{file}:{node.lineno}: self.{node.func.attr}"
    return None


CLAMPS = frozenset({"clamp", "clip", "clamp_", "clip_", "clamp_min", "clamp_max", "clamp_min_", "clamp_max_"})


def _activation_sparsity(ckpt: Checkpoint, spec: Spec, where) -> None:
    """A statistical cutoff on the gate projection's output before the activation (Gemma-3n's activation sparsity,
    scaffold.detect.branches.read_cutoff): each layer's fraction, read by the port per layer with the code's
    expression; refused by name where the code computes another cutoff."""
    sources = modeling_sources(ckpt)
    try:
        found = branches.read_cutoff(sources, ckpt.config, spec.num_layers, spec.names.get("gate_proj")) \
            if sources and spec.num_layers else None
    except branches.Refused as exc:
        raise unsupported(str(exc), where, spec.model_type) from None
    if found is None or not found.layers:
        spec.set("activation_sparsity", [], Source("default", "no cutoff on the gate projection's output")
                 if found is None else Source("config", f"config.json gives every layer the fraction 0 ({found.evidence})"))
        return
    if found.module != spec.names.get("mlp") or spec.is_moe or spec.mlp_kind != "gated":
        raise unsupported(f"activation sparsity ({found.evidence}) on a module other than a dense gated MLP", where,
                          spec.model_type)
    expr = found.fraction if re.fullmatch(r"config\.[A-Za-z]\w*\[layer_idx\]", found.fraction) else None
    spec.set("activation_sparsity", found.fractions, Source("code", found.evidence, expr))


def altered_projection(sources: dict[str, str], mlp_attr: str, projections: set[str]) -> str | None:
    """"FILE:LINE: code" where the MLP module's forward changes a projection's output before the product the port
    computes (act(gate) * up, or act(up)): a clamp (GPT-OSS-style `gate.clamp(max=limit)`), or a number added to
    or taken from a projection's output (`up + 1`). None where it does neither."""
    classes = {codekeys.callee(value) for _f, _c, _fn, attr, value in codekeys.self_assignments(sources)
               if attr == mlp_attr and isinstance(value, ast.Call)}
    for file, cls, func in codekeys.methods(sources):
        if cls.name not in classes or func.name != "forward":
            continue

        def projected(node: ast.AST) -> bool:
            return isinstance(node, ast.Call) and ast.unparse(node.func) in {f"self.{p}" for p in projections}

        derived: set[str] = set()
        for node in subtree(func):  # names holding a projection's output (or a piece of it)
            if isinstance(node, ast.Assign) and any(projected(n) or (isinstance(n, ast.Name) and n.id in derived)
                                                    for n in subtree(node.value)):
                derived.update(n.id for t in node.targets for n in subtree(t) if isinstance(n, ast.Name))
        for node in subtree(func):
            if isinstance(node, ast.Call) and _call_name(node) in CLAMPS:
                return f"{file}:{node.lineno}: {ast.unparse(node)}"
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
                sides = (node.left, node.right)
                if any(isinstance(x, ast.Constant) and isinstance(x.value, (int, float)) for x in sides) and any(
                        projected(x) or (isinstance(x, ast.Name) and x.id in derived) for x in sides):
                    return f"{file}:{node.lineno}: {ast.unparse(node)}"
    return None


def _call_name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


def _transformers_activation_aliases() -> dict[str, str]:
    """transformers/activations.py's module-level `gelu_new = get_activation("gelu_new")`: name -> ACT2FN key."""
    path = _package_file("transformers", "activations.py")
    if path is None:
        return {}
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "get_activation" and len(node.value.args) == 1
                and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, str)):
            out[node.targets[0].id] = node.value.args[0].value
    return out


def _table_activation(sources: dict[str, str], node: ast.Subscript, config: dict, formulas: dict) -> str | None:
    """`TABLE[config.K]` with TABLE a module-level dict literal of the code (GPT-1's `ACT_FNS[config.afn]`): the
    registry name of the entry config.json's K selects, where that entry is a torch activation module or function,
    a formula of the code, or a name imported from transformers' activations (`gelu_new`, its
    get_activation("gelu_new")); None otherwise."""
    if not (isinstance(node.value, ast.Name) and isinstance(node.slice, ast.Attribute)
            and ast.unparse(node.slice.value) in ("config", "self.config")):
        return None
    key = config.get(node.slice.attr)
    if not isinstance(key, str):
        return None
    for _file, tree in _parsed(sources):
        imported = {a.asname or a.name: a.name for n in tree.body if isinstance(n, ast.ImportFrom)
                    and (n.module or "").rsplit(".", 1)[-1] == "activations" for a in n.names}
        for top in tree.body:
            if not (isinstance(top, ast.Assign) and len(top.targets) == 1 and isinstance(top.targets[0], ast.Name)
                    and top.targets[0].id == node.value.id and isinstance(top.value, ast.Dict)):
                continue
            entries = {k.value: v for k, v in zip(top.value.keys, top.value.values)
                       if isinstance(k, ast.Constant) and isinstance(k.value, str)}
            entry = entries.get(key)
            if isinstance(entry, ast.Call):
                return _activation_of(entry)
            if isinstance(entry, ast.Name):
                if entry.id in imported:
                    return _transformers_activation_aliases().get(imported[entry.id])
                return formulas.get(entry.id)
            return None
    return None


def code_activation(sources: dict[str, str], mlp_attr: str, config: dict | None = None) -> tuple[str, str] | None:
    """(registry name, "FILE:LINE") of the one activation the MLP module's class applies (a torch function in
    its forward, or a torch activation module built in its __init__, or the entry of a module-level table the
    config selects: `ACT_FNS[config.afn]`); squared ReLU reads as relu2."""
    classes = {codekeys.callee(value) for _f, _c, _fn, attr, value in codekeys.self_assignments(sources)
               if attr == mlp_attr and isinstance(value, ast.Call)}
    # A MoE block holding its experts as an nn.ModuleList of a class of the code (Grok-1's MoeMLP): the experts
    # apply the activation, the block only routes.
    for _file, cls, func in codekeys.methods(sources):
        if cls.name in classes and func.name == "__init__":
            for node in subtree(func):
                if isinstance(node, ast.Call) and codekeys.callee(node) == "ModuleList" and node.args:
                    elt = node.args[0].elt if isinstance(node.args[0], (ast.ListComp, ast.GeneratorExp)) \
                        else node.args[0]
                    if isinstance(elt, ast.Call):
                        classes.add(codekeys.callee(elt))
    formulas = _activation_functions(sources)
    modules = _activation_classes(sources, formulas)
    table_classes = transformers_activation_classes()
    defined = {cls.name for _f, cls, _fn in codekeys.methods(sources)}
    found: dict[str, str] = {}
    for file, cls, func in codekeys.methods(sources):
        if cls.name not in classes or func.name not in ("__init__", "forward"):
            continue
        for node in subtree(func):
            if isinstance(node, ast.Call) and (name := _activation_of(node)):
                found.setdefault(name, f"{file}:{node.lineno}")
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in formulas:
                found.setdefault(formulas[node.func.id], f"{file}:{node.lineno}")
            elif isinstance(node, ast.Call) and codekeys.callee(node) in modules:
                found.setdefault(modules[codekeys.callee(node)], f"{file}:{node.lineno}")
            elif (isinstance(node, ast.Call) and codekeys.callee(node) in table_classes
                  and codekeys.callee(node) not in defined):
                # One of transformers' activation classes by its name (XIELUActivation(...)): its table's name.
                found.setdefault(table_classes[codekeys.callee(node)], f"{file}:{node.lineno}")
            if (isinstance(node, ast.Subscript) and config is not None
                    and (name := _table_activation(sources, node, config, formulas))):
                found.setdefault(name, f"{file}:{node.lineno}")
            if (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.left, ast.Call)
                    and _activation_of(node.left) == "relu" and isinstance(node.right, ast.Constant)
                    and node.right.value == 2):
                found["relu2"] = f"{file}:{node.lineno}"
    for file, _cls, _fn, attr, value in codekeys.self_assignments(sources):
        # An MLP built as nn.Sequential (CTRL's): its activation module among the children.
        if attr == mlp_attr and (children := dataflow.sequential_children(sources, value)) is not None:
            for child in children[1]:
                if isinstance(child, ast.Call) and (name := _activation_of(child)):
                    found.setdefault(name, f"{children[0] or file}:{child.lineno}")
    if "relu2" in found:
        found.pop("relu", None)  # the relu inside the square
    return next(iter(found.items())) if len(found) == 1 else None


def _check_activation(act: str, spec: Spec, where) -> None:
    """`act` must be a name vLLM's activation registry has (a gated MLP may also use a plain activation on the
    gate half) and one transformers' ACT2FN has, so that both compute the same function."""
    registry, known = vllm_registry(), transformers_activations()
    if registry is None:
        return  # no vLLM here to ask: the port's own load reports an unknown name
    usable = bool(gated_forms(act)) if spec.mlp_kind == "gated" else act.lower() in registry.plain
    if usable and (known is None or act in known):
        return
    names = sorted(registry.plain | registry.and_mul) if spec.mlp_kind == "gated" else sorted(registry.plain)
    if known is not None:
        names = [n for n in names if n in known]
    what = "gated MLP activation" if spec.mlp_kind == "gated" else "MLP activation"
    side = "vLLM's activation registry" if not usable else "transformers' ACT2FN (so its meaning is unknown)"
    raise UnsupportedArchitecture(f"{what} {act!r} is not in {side}; names both know: {', '.join(names)}.", where,
                                  hint=BACKEND_HINT if spec.model_type else "")


def _check_activation_tensors(act: str, spec: Spec, where) -> None:
    """An activation vLLM builds with tensors of its own (xIELU's alpha_p, ...) is right only with the
    checkpoint's values loaded into it: the tensors the MLP's activation module holds (act_tensors) must be
    those, and an activation without tensors must not be given any."""
    if vllm_registry() is None:
        return
    wanted = tensor_activation(act.lower()).vllm_tensors or frozenset()
    if wanted == set(spec.act_tensors):
        return
    held = ", ".join(spec.act_tensors) or "none"
    raise UnsupportedArchitecture(
        f"MLP activation {act!r}: vLLM builds it with the tensors {', '.join(sorted(wanted)) or 'none'}, but the "
        f"MLP's activation module holds {held} in the checkpoint ({spec.source('act_tensors')})", where,
        hint=BACKEND_HINT if spec.model_type else "")


def _check_declared(ckpt: Checkpoint, spec: Spec, shapes: dict) -> None:
    """A projection the modeling code always builds must be in the checkpoint: without it, the tensors alone
    describe another MLP (a gated one missing its gate reads as a plain one)."""
    if spec.is_moe:
        return
    n = spec.names
    found = declared_linears(modeling_sources(ckpt), n["mlp"])
    if found is None:
        return
    cls, declared = found
    roles = {n[role] for role in shapes}
    for attr, where in declared.items():
        if attr not in roles:
            layer = next((i for i in range(spec.num_layers) if i not in set(spec.sparse_layers)), 0)
            name = f"{n['model']}.{n['layers']}.{layer}.{n['mlp']}.{attr}.weight"
            raise CheckpointError(f"tensor {name} is missing: the modeling code's {cls} always builds "
                                  f"`{attr}` ({where}), and the MLP the other tensors describe has no place for it.",
                                  ckpt.config_file)
