"""Mixture of experts: which layers route to experts, the module names, the sizes and the router.

A layer is sparse when it holds `MLP.experts.N.PROJ.weight` tensors. The expert
projections are recognised by name: (gate_proj, up_proj, down_proj) as in Qwen-MoE
or (w1, w3, w2) as in Mixtral; any other naming is refused rather than guessed,
because which projection goes through the activation cannot be read off the shapes.
"""

from __future__ import annotations

import ast
import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect import codekeys, routing, sourcecode
from scaffold.detect.common import config_value, set_from_config, unsupported
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec

EXPERT_TENSOR = re.compile(r"^(\w+)\.experts\.(\d+)\.(\w+)\.weight$")
STACKED_EXPERTS = re.compile(r"^\w+\.experts\.[A-Za-z_]\w*$")
# Known expert projection names: (gate, up, down). The gate goes through the activation.
EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
ROUTER_NAMES = ("gate", "router")
SHARED_EXPERT = "shared_expert"
SHARED_EXPERT_GATE = "shared_expert_gate"
# Activations vLLM's FusedMoE computes for gated experts.
MOE_ACTIVATIONS = ("silu",)


def find_layout(ckpt: Checkpoint, spec: Spec, names: dict, prefix: str,
                per_layer: dict[int, dict]) -> set[str] | None:
    """Set the MoE names and layers; return the module paths (inside a sparse layer) the experts claim.

    None when no layer has experts.
    """
    where = ckpt.config_file
    for layer, tensors in per_layer.items():
        stacked = sorted(rest for rest, info in tensors.items()
                         if ".experts." in rest and STACKED_EXPERTS.match(rest) and len(info.shape) == 3)
        if stacked:
            raise unsupported(f"mixture-of-experts blocks whose experts are stored as one 3-D tensor per projection "
                              f"({prefix}.layers.{layer}.{stacked[0]}); the generator expresses experts stored one "
                              "tensor per expert (MLP.experts.N.PROJ.weight)", where, spec.model_type)
    sparse: dict[int, dict] = {}
    groups: dict[str, tuple | None] = {}  # each name inside a layer matched once, not once per layer
    for layer, tensors in per_layer.items():
        found = set()
        for rest in tensors:
            if ".experts." in rest:
                if rest not in groups:
                    m = EXPERT_TENSOR.match(rest)
                    groups[rest] = m.groups() if m else None
                if groups[rest] is not None:
                    found.add(groups[rest])
        if found:
            sparse[layer] = found
    if not sparse:
        return None
    containers = {c for found in sparse.values() for c, _, _ in found}
    if len(containers) != 1:
        raise UnsupportedArchitecture(f"experts sit under several modules in one model ({sorted(containers)}).", where)
    mlp = containers.pop()
    first = min(sparse)
    projections = {p for c, _, p in sparse[first]}
    roles = next((n for n in EXPERT_NAMES if set(n) == projections), None)
    if roles is None:
        raise UnsupportedArchitecture(
            f"the experts of layer {first} have the projections {sorted(projections)}; the generator knows gated "
            f"experts named {' or '.join(str(list(n)) for n in EXPERT_NAMES)} and does not guess which projection "
            "is the gate.", where)
    tensors = per_layer[first]
    router = next((r for r in ROUTER_NAMES if f"{mlp}.{r}.weight" in tensors), None)
    if router is None:
        raise UnsupportedArchitecture(f"layer {first}'s {mlp} has experts but no router "
                                      f"(looked for {', '.join(f'{mlp}.{r}.weight' for r in ROUTER_NAMES)}).", where)
    names.update(mlp=mlp, router=router, experts="experts", expert_gate_proj=roles[0], expert_up_proj=roles[1],
                 expert_down_proj=roles[2])
    claimed = {f"{mlp}.{router}"}
    experts = sorted({int(e) for _, e, _ in sparse[first]})
    claimed |= {f"{mlp}.experts.{e}.{p}" for e in experts for p in roles}
    if any(rest.startswith(f"{mlp}.{SHARED_EXPERT}.") for rest in tensors):
        names.update(shared_expert=SHARED_EXPERT)
        claimed |= {f"{mlp}.{SHARED_EXPERT}.{p}" for p in ("gate_proj", "up_proj", "down_proj")}
        if f"{mlp}.{SHARED_EXPERT_GATE}.weight" not in tensors:
            raise UnsupportedArchitecture(f"layer {first}'s {mlp} has a shared expert without the sigmoid gate "
                                          f"{mlp}.{SHARED_EXPERT_GATE} the generator knows.", where)
        names.update(shared_expert_gate=SHARED_EXPERT_GATE)
        claimed.add(f"{mlp}.{SHARED_EXPERT_GATE}")
    dense = sorted(set(per_layer) - set(sparse))
    spec.set("dense_layers", dense, Source("tensor", f"layers without {prefix}.layers.N.{mlp}.experts tensors"
                                           if dense else f"every layer has {mlp}.experts tensors"))
    return claimed


def shared_expert_tensors(tensors: dict, names: dict) -> dict:
    """A sparse layer's shared-expert tensors, named as if they were a dense MLP's (MLP.gate_proj.weight...)."""
    mlp, shared = names["mlp"], names["shared_expert"]
    head = f"{mlp}.{shared}."
    return {f"{mlp}.{rest[len(head):]}": info for rest, info in tensors.items() if rest.startswith(head)}


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    """Sizes, routing and shapes of the experts (after layout found the names)."""
    if "experts" not in spec.names:
        return
    where = ckpt.config_file
    n = spec.names
    set_from_config(spec, ckpt, "num_experts", ("num_local_experts", "num_experts", "n_routed_experts"), int)
    set_from_config(spec, ckpt, "num_experts_per_tok", ("num_experts_per_tok", "moe_top_k", "top_k"), int)
    sources = sourcecode.modeling_sources(ckpt)
    key = expert_width_key(sources, n["experts"], ckpt.config)
    if key is None:
        key, _ = config_value(ckpt, "moe_intermediate_size")
    set_from_config(spec, ckpt, "moe_intermediate_size", (key or "intermediate_size",), int)
    key, _ = config_value(ckpt, "norm_topk_prob")
    if key is not None:
        set_from_config(spec, ckpt, "moe_renormalize", (key,), bool)
    else:
        spec.set("moe_renormalize", True, Source("default", "no norm_topk_prob in config.json: the top-k routing "
                                                            "weights are renormalized (Mixtral)"))
    if "shared_expert" in n:
        set_from_config(spec, ckpt, "shared_expert_intermediate_size", ("shared_expert_intermediate_size",), int)
    if not 0 < spec.num_experts_per_tok <= spec.num_experts:
        raise CheckpointError(f"config.json routes each token to {spec.num_experts_per_tok} of "
                              f"{spec.num_experts} experts.", where)
    if spec.hidden_act not in MOE_ACTIVATIONS:
        raise unsupported(f"gated experts with activation {spec.hidden_act!r} (the port's FusedMoE computes "
                          f"{', '.join(MOE_ACTIVATIONS)})", where, spec.model_type)
    path = routing.routing(sources, n["experts"])
    if path is not None and (problem := path.problem()):
        raise unsupported(problem, where, spec.model_type)
    hidden, inter, experts = spec.hidden_size, spec.moe_intermediate_size, spec.num_experts
    base = f"{n['model']}.{n['layers']}"
    mlp = n["mlp"]
    shapes = {f"{mlp}.{n['router']}.weight": (experts, hidden)}
    for e in range(experts):
        for role, shape in (("expert_gate_proj", (inter, hidden)), ("expert_up_proj", (inter, hidden)),
                            ("expert_down_proj", (hidden, inter))):
            shapes[f"{mlp}.{n['experts']}.{e}.{n[role]}.weight"] = shape
    if "shared_expert" in n:
        shared = spec.shared_expert_intermediate_size
        for proj, shape in (("gate_proj", (shared, hidden)), ("up_proj", (shared, hidden)),
                            ("down_proj", (hidden, shared))):
            shapes[f"{mlp}.{n['shared_expert']}.{proj}.weight"] = shape
        shapes[f"{mlp}.{n['shared_expert_gate']}.weight"] = (1, hidden)
    expert_tensors: dict[int, list[str]] = {}
    inside_experts = re.compile(rf"^{re.escape(base)}\.(\d+)\.{re.escape(mlp)}\.{re.escape(n['experts'])}\.")
    for name in ckpt.tensors:
        if ".experts." in name and (match := inside_experts.match(name)):
            expert_tensors.setdefault(int(match.group(1)), []).append(name)
    for layer in spec.sparse_layers:
        for rest, shape in shapes.items():
            name = f"{base}.{layer}.{rest}"
            info = ckpt.tensors.get(name)
            if info is None:
                raise CheckpointError(f"tensor {name} is missing ({experts} experts, config.json).", where)
            if info.shape != shape:
                raise CheckpointError(f"tensor {name} has shape {list(info.shape)}, but hidden size {hidden}, "
                                      f"{experts} experts of intermediate size {inter} need {list(shape)}.", where)
        inside = f"{base}.{layer}."
        extra = sorted(name for name in expert_tensors.get(layer, ()) if name[len(inside):] not in shapes)
        if extra:
            raise CheckpointError(f"tensor {extra[0]} is an expert past the {experts} that config.json declares, "
                                  "or a part of one the generator does not know.", where)


def expert_width_key(sources: dict[str, str], experts: str, config: dict) -> str | None:
    """The config key the code sizes each expert's intermediate rows with, where it says so unambiguously:
    the class built as `self.<experts>` reads one `config.*intermediate*` key (Cohere2-MoE's experts read
    `intermediate_size` although its config also has `moe_intermediate_size`), or the expert MLPs of a
    ModuleList are built with `intermediate_size=config.KEY`. None when the code does not say."""
    classes = sourcecode._classes(sources)
    keys: set[str] = set()
    for _file, _cls, func, attr, value in codekeys.self_assignments(sources):
        if attr != experts or func.name != "__init__":
            continue
        for call in (n for n in ast.walk(value) if isinstance(n, ast.Call)):
            name = codekeys.callee(call)
            given = [kw.value for kw in call.keywords if kw.arg == "intermediate_size"]
            found = codekeys.config_expr(given[0], func) if given else None
            if found is not None:
                keys.update(found[1])
            elif name in classes:
                init = next((f for f in classes[name][1].body
                             if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                for node in ast.walk(init) if init else ():
                    if (isinstance(node, ast.Attribute) and "intermediate" in node.attr
                            and codekeys._is_config(node.value)):
                        keys.add(node.attr)
    keys = {k for k in keys if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)}
    return keys.pop() if len(keys) == 1 else None
