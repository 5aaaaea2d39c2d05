"""Mixture of experts: which layers route to experts, the module names, the sizes and the router.

A layer is sparse when it holds `MLP.experts.N.PROJ.weight` tensors. The expert
projections are recognised by name: (gate_proj, up_proj, down_proj) as in Qwen-MoE
or (w1, w3, w2) as in Mixtral; any other naming is refused rather than guessed,
because which projection goes through the activation cannot be read off the shapes.
The router is the block's `gate` or `router` linear, or the one linear directly inside a module so named
(HunYuan-MoE's gate.wg, AfMoE's router.gate); the port keeps it one module up and maps the name on load.

A shared expert is the block's one other module holding gate_proj/up_proj/down_proj (Qwen2-MoE's
shared_expert, DeepSeek-V3's shared_experts), scaled by a sigmoid gate where the checkpoint has
`<name>_gate`, else added as it is. A shared expert computing a clamped SwiGLU (MiniMax-M3's) is ported where
the formula is vLLM's SwigluOAIAndMul (scaffold.detect.gluformula), else refused naming it. How the block routes (softmax or sigmoid scores, a correction
bias, expert groups, a scaling factor) is read from its code (scaffold.detect.routing).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable

from scaffold.checkpoint import INTEGER_DTYPES, Checkpoint
from scaffold.detect import (
    codekeys,
    dataflow,
    denselayers,
    expertbanks,
    gluformula,
    hashrouting,
    renamings,
    routing,
    routingmath,
    sourcecode,
    stacked,
    subconfigs,
    sublayers,
    submodules,
)
from scaffold.detect import mlp as mlp_detector
from scaffold.detect.linears import linear_classes
from scaffold.detect.common import MISSING, config_value, set_from_config, unsupported
from scaffold.detect.sourcecode import subtree
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec, identity_expert_tensor, shared_projection_roles, stacked_shapes

EXPERT_TENSOR = re.compile(r"^(\w+)\.experts\.(\d+)\.(\w+)\.weight$")
# Known expert projection names: (gate, up, down). The gate goes through the activation.
EXPERT_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
ROUTER_NAMES = ("gate", "router")
SHARED_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
# Activations vLLM's FusedMoE computes for gated experts.
MOE_ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new")


def find_layout(ckpt: Checkpoint, spec: Spec, names: dict, prefix: str,
                per_layer: dict[int, dict]) -> set[str] | None:
    """Set the MoE names and layers; return the module paths (inside a sparse layer) the experts claim.

    None when no layer has experts.
    """
    where = ckpt.config_file
    stacked = _stacked_layout(ckpt, spec, names, prefix, per_layer)
    if stacked is not None:
        return stacked
    flat = _flattened_layout(ckpt, spec, names, prefix, per_layer)
    if flat is not None:
        return flat
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
        read = expert_roles(sourcecode.modeling_sources(ckpt), projections, ckpt.config)
        if isinstance(read, str):
            raise UnsupportedArchitecture(
                f"the experts of layer {first} have the projections {sorted(projections)}; the generator knows gated "
                f"experts named {' or '.join(str(list(n)) for n in EXPERT_NAMES)} and does not guess which "
                f"projection is the gate ({read}).", where)
        roles, _evidence = read
    tensors = per_layer[first]
    router = next((r for r in ROUTER_NAMES if f"{mlp}.{r}.weight" in tensors), None)
    if router is None:
        router = _deeper_router(tensors, mlp, len({e for _, e, _ in sparse[first]}), first, where)
    names.update(mlp=mlp, router=router, experts="experts", expert_gate_proj=roles[0], expert_up_proj=roles[1],
                 expert_down_proj=roles[2])
    claimed = {f"{mlp}.{router}"}
    experts = sorted({int(e) for _, e, _ in sparse[first]})
    claimed |= {f"{mlp}.experts.{e}.{p}" for e in experts for p in roles}
    dense = sorted(set(per_layer) - set(sparse))
    return _block_extras(ckpt, spec, names, prefix, tensors, mlp, router, first, claimed, dense,
                         f"layers without {prefix}.layers.N.{mlp}.experts tensors" if dense
                         else f"every layer has {mlp}.experts tensors")


def expert_roles(sources: dict[str, str], projections: set[str], config: dict) -> tuple[tuple[str, str, str], str] | str:
    """(gate, up, down) of experts whose projections no known naming fits (Grok-1's linear, linear_v, linear_1), read
    from what the expert's class computes: the class whose linears are exactly `projections` and whose forward is
    down(act(gate(x)) * up(x)) (dataflow.analyze_mlp). With the evidence; else why not, as a string."""
    found = {}
    for file, tree in sourcecode._parsed(sources):
        for cls in (n for n in subtree(tree) if isinstance(n, ast.ClassDef)):
            if set(dataflow.linears(file, cls, set(linear_classes(sources)))) != projections:
                continue
            try:
                mlp = dataflow.analyze_mlp(sources, file, cls, config)
            except dataflow.Undecided as exc:
                found[cls.name] = str(exc)
                continue
            if mlp.kind != "gated" or mlp.fused:
                found[cls.name] = f"{cls.name} is not down(act(gate(x)) * up(x)) over three projections"
                continue
            found[cls.name] = ((mlp.gate, mlp.up, mlp.down), f"{mlp.evidence} ({cls.name})")
    read = {v for v in found.values() if isinstance(v, tuple)}
    if len({roles for roles, _ in read}) == 1:
        return next(iter(read))
    if len(read) > 1:
        return "classes holding them compute different products: " + "; ".join(e for _, e in sorted(read))
    return "; ".join(found.values()) or "no class in the code declares exactly these projections"


def _block_extras(ckpt: Checkpoint, spec: Spec, names: dict, prefix: str, tensors: dict, mlp: str, router: str,
                  first: int, claimed: set[str], dense: list[int], dense_why: str) -> set[str]:
    """What a MoE block holds besides its router and experts, whatever their layout: the shared expert (and its
    gate), the routing correction bias, and the layers that keep a dense MLP. Returns `claimed` with them."""
    code = code_names(ckpt, f"{prefix}.layers.{first}.")
    shared = _shared_expert(tensors, mlp, router, code)
    if shared is not None:
        names.update(shared_expert=shared)
        claimed |= {f"{mlp}.{shared}.{stored_projection(tensors, f'{mlp}.{shared}', p, code)}"
                    for p in SHARED_PROJECTIONS}
        # Qwen2-MoE scales its shared expert by a sigmoid gate of its own; DeepSeek-V3's form adds it as it is.
        if f"{mlp}.{shared}_gate.weight" in tensors:
            names.update(shared_expert_gate=f"{shared}_gate")
            claimed.add(f"{mlp}.{shared}_gate")
    elif (clamped := _clamped_block_module(ckpt, tensors, mlp, router)) is not None:
        # MiniMax-M3's shared experts compute the experts' clamped SwiGLU: the port's dense MLP computes it with
        # vLLM's SwigluOAIAndMul where the formula is that one, from one fused gate-and-up projection.
        shared = _clamped_shared_expert(ckpt, spec, tensors, mlp, clamped, dense)
        names.update(shared_expert=shared)
        claimed |= {f"{mlp}.{shared}.{p}" for p in ("gate_up_proj", "down_proj")}
    elif (beside := layer_shared_mlp(ckpt, spec, names, tensors, mlp)) is not None:
        # GraniteMoE-Shared's shared_mlp: on the decoder layer, its output added to the block's.
        attr, projections, evidence = beside
        if dense:
            raise unsupported(f"a shared MLP on the decoder layer ({attr}, {evidence}) in a model with dense "
                              f"layers ({', '.join(map(str, dense))})", ckpt.config_file, spec.model_type)
        names.update(shared_expert=attr)
        spec.set("shared_expert_on_layer", True, Source("code", evidence))
        claimed |= {f"{attr}.{p}" for p in projections}
    bias = correction_bias(sourcecode.modeling_sources(ckpt), tensors, mlp, claimed,
                           code_names(ckpt, f"{prefix}.layers.{first}."))
    if bias is not None:
        spec.set("moe_correction_bias", bias[0], Source("code", bias[1]))
        claimed.add(f"{mlp}.{bias[0]}")
    output_norm = block_output_norm(ckpt, spec, tensors, mlp, claimed, code_names(ckpt, f"{prefix}.layers.{first}."),
                                    names.get("layers", "layers").rsplit(".", 1)[-1])
    if output_norm is not None:
        module, attr, evidence = output_norm
        spec.set("moe_output_norm", attr, Source("code", evidence))
        on_layer = module != f"{mlp}.{attr}"
        spec.set("moe_output_norm_on_layer", on_layer,
                 Source("code", f"the checkpoint keeps it as {module}, renamed into {mlp}.{attr} on load")
                 if on_layer else Source("tensor", f"{mlp}.{attr}: in the block"))
        claimed.add(module)
    else:
        spec.set("moe_output_norm", None, Source("default", "the MoE block's output is not normed"))
        spec.set("moe_output_norm_on_layer", False, Source("default", "no MoE output norm"))
    condition = (denselayers.code_dense_layers(sourcecode.modeling_sources(ckpt), ckpt.config,
                                               names.get("layers", "layers").rsplit(".", 1)[-1], mlp,
                                               spec.num_layers, dense) if dense else None)
    spec.set("dense_layers", dense, Source("tensor", dense_why) if condition is None else
             Source("code", f"{condition.evidence}; {dense_why}: the layers where {condition.expr}", condition.expr))
    return claimed


def block_output_norm(ckpt: Checkpoint, spec: Spec, tensors: dict, mlp: str, claimed: set[str],
                      code: Callable[[str], str] = str, layers_attr: str | None = None) -> tuple[str, str, str] | None:
    """A norm the MoE block applies to what it returns (A.X-K1's `return self.post_mlp_layernorm(hidden_states)`
    after adding the shared experts' output to the routed experts'): (the checkpoint's module inside a sparse layer,
    the block's attribute, why), or None. The checkpoint may keep it on the decoder layer (`post_mlp_layernorm`),
    renamed into the block by transformers on load (`code`). Refused where the block's code returns such a module
    built otherwise than the layer's norms, or whose tensors the checkpoint does not hold at the model's width."""
    sources = sourcecode.modeling_sources(ckpt)
    block = next(((file, cls) for file, tree in sourcecode._parsed(sources) for cls in subtree(tree)
                  if isinstance(cls, ast.ClassDef)
                  and "experts" in routing._assigned_classes(routing._method(cls, "__init__"))), None)
    if block is None or routing._method(block[1], "forward") is None:
        return None
    file, cls = block
    returns = [n for n in subtree(routing._method(cls, "forward")) if isinstance(n, ast.Return)]
    attrs = {sourcecode._dotted(r.value.func)[len("self."):] if isinstance(r.value, ast.Call)
             and sourcecode._dotted(r.value.func).startswith("self.") and len(r.value.args) == 1
             and not r.value.keywords else None for r in returns}
    if len(attrs) != 1 or None in attrs:
        return None
    (attr,) = attrs
    if "." in attr:
        return None
    built = submodules.constructor(cls, attr)
    layer = dataflow.layer_class(sources, layers_attr) or dataflow.layer_class(sources)
    flow = dataflow.analyze_layer(sources, ckpt.config, layers_attr) or dataflow.analyze_layer(sources, ckpt.config)
    if built is None or layer is None:
        return None
    # The layer's norms: those the dataflow placed before its sublayers; where it read no MLP (a block it does not
    # follow), the layer's modules built from a class named as a norm.
    attrs = flow.norms.values() if flow is not None and flow.norms else \
        [a for a, c in routing._assigned_classes(routing._method(layer[1], "__init__")).items()
         if c.endswith("Norm")]
    norm_builds = {submodules.constructor(layer[1], a) for a in attrs} - {None}
    if not norm_builds:
        return None
    said = f"{file}:{returns[0].lineno}: {cls.name} returns self.{attr}(...) of its output"
    if built not in norm_builds:
        if built[0].endswith("Norm"):
            raise unsupported(f"a norm on the MoE block's output ({said}) built as {built[0]}(..., "
                              f"{', '.join(built[1])}), not as the layer's norms are", ckpt.config_file,
                              spec.model_type)
        return None
    held = sorted({rest.rsplit(".", 1)[0] for rest in tensors if rest not in claimed
                   and code(rest).rsplit(".", 1)[0] == f"{mlp}.{attr}"})
    if len(held) != 1 or held[0] not in (f"{mlp}.{attr}", attr):
        raise unsupported(f"a norm on the MoE block's output ({said}) whose tensors the checkpoint holds as "
                          f"{held or 'none'}", ckpt.config_file, spec.model_type)
    module = held[0]
    weight = tensors.get(f"{module}.weight")
    if weight is None or tuple(weight.shape) != (spec.hidden_size,):
        raise unsupported(f"a norm on the MoE block's output ({said}) whose weight {module}.weight is not of the "
                          f"model's width {spec.hidden_size}", ckpt.config_file, spec.model_type)
    return module, attr, f"{said}, built as the layer's norms ({built[0]})" + (
        f"; the checkpoint keeps it as {module}, renamed on load" if module != f"{mlp}.{attr}" else "")


CODE_STACKED = re.compile(r"^(\w+)\.experts\.([A-Za-z_]\w*)$")


def _stacked_layout(ckpt: Checkpoint, spec: Spec, names: dict, prefix: str,
                    per_layer: dict[int, dict]) -> set[str] | None:
    """find_layout for experts stored as one 3-D tensor per projection: the tensors the code calls
    MLP.experts.ATTR (GraniteMoE's checkpoints keep them as MLP.input_linear.weight, renamed on load), which half
    of the gate-and-up tensor is the gate (scaffold.detect.stacked). None when no layer has such tensors."""
    where = ckpt.config_file
    sparse: dict[int, dict[str, str]] = {}  # layer -> the code's attribute -> the tensor's name in the layer
    containers = set()
    for layer, tensors in per_layer.items():
        code = code_names(ckpt, f"{prefix}.layers.{layer}.")
        for rest, info in tensors.items():
            if len(info.shape) == 3 and (m := CODE_STACKED.match(code(rest))):
                containers.add(m.group(1))
                sparse.setdefault(layer, {})[m.group(2)] = rest
    banks = None
    if not sparse:  # JetMoE's banks: modules holding one projection of every expert (scaffold.detect.expertbanks)
        banks = _expert_banks(ckpt, names, per_layer, sparse, containers)
        if banks is None:
            return None
    if len(containers) != 1:
        raise UnsupportedArchitecture(f"experts sit under several modules in one model ({sorted(containers)}).", where)
    mlp = containers.pop()
    first = min(sparse)
    found = sparse[first]
    if len(found) != 2:
        raise unsupported(f"stacked experts with the 3-D tensors {sorted(found.values())} (a gate-and-up tensor and "
                          "a down tensor expected)", where, spec.model_type)
    tensors = per_layer[first]
    # A bias per expert and projection: P_bias beside P (GPT-OSS's gate_up_proj_bias), or P.bias beside P.weight.
    biases = {t: rest for t in found.values() for rest in tensors
              if rest == f"{t}_bias" or t.endswith(".weight") and rest == f"{t.removesuffix('.weight')}.bias"}
    if biases and t_weight_only(found):
        raise unsupported(f"biased experts stored as {', '.join(sorted(found.values()))} (a bias the port "
                          "does not cut)", where, spec.model_type)
    try:
        read = banks.code if banks is not None else \
            stacked.experts_code(sourcecode.modeling_sources(ckpt), tuple(sorted(found)), ckpt.config)
    except ValueError as exc:
        raise unsupported(f"stacked experts whose gate half the code does not tell: {exc}", where,
                          spec.model_type) from None
    if read is None:
        raise unsupported(f"stacked experts ({', '.join(sorted(found.values()))}) without a modeling class holding "
                          f"{' and '.join(sorted(found))} as parameters", where, spec.model_type)
    if read.problem:
        raise unsupported(f"{read.problem}, in {read.cls}", where, spec.model_type)
    # Each bias must be one the experts' code adds, as self.<attribute>_bias (GPT-OSS's gate_up_proj_bias).
    code_name = {t: a for a, t in found.items()}  # the checkpoint's 3-D tensor -> the code's attribute
    unread = sorted((b, f"{code_name[t]}_bias") for t, b in biases.items() if f"{code_name[t]}_bias" not in read.added)
    if unread:
        raise unsupported(f"biased experts ({prefix}.layers.{first}.{unread[0][0]}) whose bias {read.cls} does not "
                          f"add (no self.{unread[0][1]} in a sum)", where, spec.model_type)
    if biases and len(biases) != 2:
        raise unsupported(f"biased experts with a bias for {', '.join(sorted(biases))} only (one for each of "
                          f"{' and '.join(sorted(found.values()))} expected)", where, spec.model_type)
    gate_up, down = found[read.gate_up][len(mlp) + 1:], found[read.down][len(mlp) + 1:]
    count = tensors[found[read.gate_up]].shape[0]
    router = next((r for r in ROUTER_NAMES if f"{mlp}.{r}.weight" in tensors), None)
    if router is None:
        router = _deeper_router(tensors, mlp, count, first, where)
    names.update(mlp=mlp, router=router, experts="experts", expert_gate_proj="gate_proj", expert_up_proj="up_proj",
                 expert_down_proj="down_proj", stacked_gate_up=gate_up, stacked_down=down)
    layer_name = f"{prefix}.layers.{first}.{mlp}"
    spec.set("experts_layout", "stacked", Source("tensor", f"{layer_name}.{gate_up} is "
                                                           f"{list(tensors[found[read.gate_up]].shape)}: every "
                                                           "expert's gate and up in one tensor"))
    order = "interleaved" if read.interleaved else "up_first" if read.up_first else "gate_first"
    spec.set("expert_gate_up_order", order, Source("code", read.evidence))
    spec.set("expert_storage", "in_out" if read.in_out else "out_in", Source("code", read.storage_evidence))
    if read.swigluoai is not None:
        spec.set("expert_activation", "swigluoai", Source("code", read.swigluoai.evidence))
        for field, (value, origin) in (("expert_swiglu_alpha", read.swigluoai.alpha),
                                       ("expert_swiglu_limit", read.swigluoai.limit)):
            spec.set(field, value, Source("config", f"config.json {origin[7:]}", origin) if origin.startswith(
                "config.") else Source("code", f"{read.swigluoai.evidence}: {origin}"))
    if read.clamped_silu is not None:
        spec.set("expert_activation", "silu_clamp", Source("code", read.clamped_silu.evidence))
        value, origin = read.clamped_silu.limit
        spec.set("expert_clamp_limit", value, Source("config", f"config.json {origin[7:]}", origin)
                 if origin.startswith("config.") else Source("code", f"{read.clamped_silu.evidence}: {origin}"))
    if biases:
        names.update(stacked_gate_up_bias=biases[found[read.gate_up]][len(mlp) + 1:],
                     stacked_down_bias=biases[found[read.down]][len(mlp) + 1:])
        spec.set("expert_bias", True, Source("tensor", f"{layer_name}.{names['stacked_gate_up_bias']} beside "
                                                       f"{layer_name}.{gate_up}"))
    claimed = {f"{mlp}.{router}", f"{mlp}.{gate_up}", f"{mlp}.{down}"}
    if banks is not None and banks.output_bias:
        if list(tensors.get(f"{mlp}.{banks.output_bias}", _Shapeless).shape) != [spec.hidden_size]:
            raise unsupported(f"a bias the MoE block adds to its output ({banks.bias_evidence}) that the checkpoint "
                              f"does not hold as {prefix}.layers.{first}.{mlp}.{banks.output_bias} of "
                              f"{spec.hidden_size}", where, spec.model_type)
        spec.set("moa_moe_bias", banks.output_bias, Source("code", banks.bias_evidence))
        claimed.add(f"{mlp}.{banks.output_bias}")
    claimed |= {f"{mlp}.{names[r]}" for r in ("stacked_gate_up_bias", "stacked_down_bias") if r in names}
    if f"{mlp}.{router}.bias" in tensors:  # GPT-OSS's router linear has a bias
        spec.set("router_bias", True, Source("tensor", f"{layer_name}.{router}.bias"))
    # A 3-D tensor without a .weight suffix is claimed as itself (its `module` is the whole name).
    claimed |= {f"{mlp}.{t}".removesuffix(".weight") for t in (gate_up, down)}
    dense = sorted(set(per_layer) - set(sparse))
    return _block_extras(ckpt, spec, names, prefix, tensors, mlp, router, first, claimed, dense,
                         f"layers without the 3-D expert tensors of {mlp}" if dense
                         else f"every layer has {mlp}'s 3-D expert tensors")


def _flattened_layout(ckpt: Checkpoint, spec: Spec, names: dict, prefix: str,
                      per_layer: dict[int, dict]) -> set[str] | None:
    """find_layout for experts stored flattened (DBRX's w1, v1, w2: one 2-D parameter per projection, [experts x
    width, hidden], viewed per expert; scaffold.detect.subconfigs): which tensor is the gate, the up and the down
    projection and how each expert's slice is multiplied, read from the code; the expert count and width from
    the config keys the declaration multiplies. None where no layer has such tensors; refused where the code's
    product is not down(act(gate(x)) * up(x))."""
    sources = sourcecode.modeling_sources(ckpt)
    if not sources:
        return None
    where = ckpt.config_file
    sparse = {}
    for layer, tensors in per_layer.items():
        flat = subconfigs.flattened_experts(sources, tensors)
        if flat is not None:
            sparse[layer] = flat
    if not sparse:
        return None
    first = min(sparse)
    flat, tensors = sparse[first], per_layer[first]
    read = subconfigs.flattened_roles(sources, flat, ckpt.config)
    if isinstance(read, str):
        raise unsupported(f"experts stored flattened ({flat.describe()}): {read}", where, spec.model_type)
    held = {rest.rsplit(".", 1)[-1]: rest for rest, info in tensors.items()
            if rest.rsplit(".", 1)[-1] in flat.params and len(info.shape) == 2}
    parts = {held[p].split(".")[0] for p in flat.params if p in held}
    if set(held) != set(flat.params) or len(parts) != 1 or any(held[p].count(".") < 2 for p in flat.params):
        raise unsupported(f"experts stored flattened ({flat.describe()}) under the tensors "
                          f"{', '.join(sorted(held.values()))}, not one block's", where, spec.model_type)
    mlp = parts.pop()
    experts = held[read.gate].split(".")[1]
    if not (read.width and read.count):
        raise unsupported(f"experts stored flattened ({flat.describe()}) whose count and width no config key gives "
                          f"({flat.declared})", where, spec.model_type)
    count = config_value(ckpt, read.count)[1]
    router = next((r for r in ROUTER_NAMES if f"{mlp}.{r}.weight" in tensors), None)
    if router is None:
        router = _deeper_router(tensors, mlp, count, first, where)
    roles = {"flat_gate": read.gate, "flat_up": read.up, "flat_down": read.down}
    names.update(mlp=mlp, router=router, experts=experts, expert_gate_proj="gate_proj", expert_up_proj="up_proj",
                 expert_down_proj="down_proj", **{r: held[p][len(mlp) + 1:] for r, p in roles.items()})
    spec.set("experts_layout", "flattened",
             Source("code", f"{flat.declared}: one 2-D parameter per projection holding every expert's rows, "
                            f"{flat.viewed}"))
    spec.set("flat_in_out", [r for r, p in roles.items() if p in read.in_out],
             Source("code", f"{read.evidence}: {', '.join(sorted(read.in_out)) or 'none'} multiplied as the "
                            "right-hand matrix (x @ w[e])"))
    spec.set("num_experts", count, Source("config", f"config.json {read.count}", f"config.{read.count}"))
    set_from_config(spec, ckpt, "moe_intermediate_size", (read.width,), int)
    claimed = {f"{mlp}.{router}"} | {f"{mlp}.{names[r]}" for r in roles}
    dense = sorted(set(per_layer) - set(sparse))
    return _block_extras(ckpt, spec, names, prefix, tensors, mlp, router, first, claimed, dense,
                         f"layers without the flattened expert tensors of {mlp}" if dense
                         else f"every layer has {mlp}'s flattened expert tensors")
class _Shapeless:
    shape = ()


def _expert_banks(ckpt: Checkpoint, names: dict, per_layer: dict[int, dict], sparse: dict, containers: set):
    """The experts as banks (scaffold.detect.expertbanks): each layer's modules directly under one block holding a
    3-D weight, where the block's code runs them as experts. Fills `sparse` and `containers` as _stacked_layout's
    loop does; the read (or None where the code does not read so; refused where it computes otherwise)."""
    held: dict[int, dict[str, str]] = {}
    for layer, tensors in per_layer.items():
        for rest, info in tensors.items():
            parts = rest.split(".")
            if len(info.shape) == 3 and len(parts) == 3 and parts[2] == "weight":
                held.setdefault(layer, {})[parts[1]] = rest
                containers.add(parts[0])
    if not held or len(containers) != 1:
        containers.clear()
        return None
    mlp = next(iter(containers))
    sources = sourcecode.modeling_sources(ckpt)
    first = min(held)
    read = expertbanks.read(sources, names.get("layers", "layers").rsplit(".", 1)[-1], mlp,
                            {a: list(per_layer[first][t].shape) for a, t in held[first].items()})
    if read is None:
        containers.clear()
        return None
    if isinstance(read, str):
        raise unsupported(f"experts kept as banks ({', '.join(sorted(held[first].values()))}): {read}",
                          ckpt.config_file, ckpt.config.get("model_type"))
    # The port's experts compute the model's hidden_act (scaffold.detect.mlp reads it from these keys).
    configured = next((ckpt.config[k] for k in mlp_detector.ACT_KEYS if k in ckpt.config), None)
    used = ckpt.config.get(read.activation[len("config."):]) if read.activation.startswith("config.") \
        else read.activation
    if used != configured:
        raise unsupported(f"experts kept as banks whose gate goes through {read.activation} ({used!r}; "
                          f"{read.code.evidence}), not the model's activation {configured!r}", ckpt.config_file,
                          ckpt.config.get("model_type"))
    sparse.update(held)
    return read


def _clamped_shared_expert(ckpt: Checkpoint, spec: Spec, tensors: dict, mlp: str, clamped: tuple[str, str, str],
                           dense: list[int]) -> str:
    """The shared expert computing a clamped SwiGLU, when it is vLLM's SwigluOAIAndMul over the halves of one
    gate_up_proj, in a model whose port has no other dense MLP (the port's one MLP class computes it); sets
    mlp_activation and the alpha and limit. Refused naming the formula or what else differs."""
    attr, cls_name, found_at = clamped
    where = ckpt.config_file
    what = f"a shared expert computing a clamped SwiGLU ({mlp}.{attr}, {cls_name}, {found_at})"
    if dense:
        raise unsupported(f"{what} in a model with dense layers ({', '.join(map(str, dense))}), whose MLP the "
                          "port builds with the same class", where, spec.model_type)
    if not {f"{mlp}.{attr}.gate_up_proj.weight", f"{mlp}.{attr}.down_proj.weight"} <= set(tensors) or any(
            rest.startswith(f"{mlp}.{attr}.") and rest.split(".")[2] not in ("gate_up_proj", "down_proj")
            for rest in tensors):
        raise unsupported(f"{what} whose tensors are not one gate_up_proj and one down_proj", where,
                          spec.model_type)
    file, cls = sourcecode._classes(sourcecode.modeling_sources(ckpt))[cls_name]
    read = gluformula.dense_swigluoai(cls, file, stacked._init_values(cls, ckpt.config), "down_proj")
    if isinstance(read, str):
        raise unsupported(f"{what}: not vLLM's SwigluOAIAndMul: {read}", where, spec.model_type)
    spec.set("mlp_activation", "swigluoai", Source("code", read.evidence))
    for field, (value, origin) in (("mlp_swiglu_alpha", read.alpha), ("mlp_swiglu_limit", read.limit)):
        spec.set(field, value, Source("config", f"config.json {origin[7:]}", origin) if origin.startswith(
            "config.") else Source("code", f"{read.evidence}: {origin}"))
    return attr


def _clamped_block_module(ckpt: Checkpoint, tensors: dict, mlp: str, router: str) -> tuple[str, str, str] | None:
    """(attr, Class, 'file:line: code') of a module of the MoE block (besides its experts and router) that holds
    weights and whose class's forward clamps (torch.clamp, .clamp, .clip): a dense MLP computing a clamped
    SwiGLU."""
    held = {rest.split(".")[1] for rest in tensors if rest.startswith(f"{mlp}.") and rest.endswith(".weight")
            and rest.count(".") == 3} - {"experts", router.split(".")[0]}
    if not held:
        return None
    sources = sourcecode.modeling_sources(ckpt)
    classes = sourcecode._classes(sources)
    for _file, _cls, func, attr, value in codekeys.self_assignments(sources):
        if attr not in held or func.name != "__init__" or not isinstance(value, ast.Call):
            continue
        found = classes.get(codekeys.callee(value))
        if found is None:
            continue
        file, cls = found
        forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
        clamps = [n for n in subtree(forward) if isinstance(n, ast.Call) and codekeys.callee(n) in ("clamp", "clip")
                  ] if forward is not None else []
        if clamps:
            return attr, cls.name, f"{file}:{clamps[0].lineno}: {ast.unparse(clamps[0])[:50]}"
    return None


def layer_shared_mlp(ckpt: Checkpoint, spec: Spec, names: dict, tensors: dict,
                     mlp: str) -> tuple[str, tuple[str, ...], str] | None:
    """(attribute, its projections, evidence) of a gated MLP the decoder layer holds beside its MoE block and
    adds to the block's output, both computed from the same input: `moe_out + self.shared_mlp(x)`
    (GraniteMoE-Shared's). Read from the layer's code: the one MLP module the layer builds besides the block
    (scaffold.detect.dataflow), its input the block's input, and its output a term of a sum with the block's
    output and used nowhere else. None when the layer holds no tensors of such a module; refused by name when
    it does but the code combines the two otherwise."""
    sources = sourcecode.modeling_sources(ckpt)
    flow = dataflow.analyze_layer(sources, ckpt.config, names.get("layers"))
    if flow is None or flow.mlp is None or flow.mlp == mlp or flow.mlp_flow is None:
        return None
    attr, code = flow.mlp, flow.mlp_flow
    projections = tuple(sorted({p for p in (code.gate, code.up, code.down) if p}))
    if not all(f"{attr}.{p}.weight" in tensors for p in projections):
        return None
    where = ckpt.config_file
    if code.kind != "gated":
        raise unsupported(f"an MLP on the decoder layer beside the MoE block ({attr}: {code.evidence}) that is not "
                          "gated", where, spec.model_type)
    found = dataflow.layer_class(sources, names.get("layers"))
    file, cls, _ = found
    forward = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    summed = _summed_with_block(forward, attr, mlp) if forward is not None else None
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    interp = dataflow.Interpreter(sources, file, cls, set(dataflow._init_assignments(init)), ckpt.config)
    interp.run_method("forward", [frozenset({dataflow.Origin("<input>")})])
    inputs = interp.events.inputs
    same = (attr in inputs and mlp in inputs
            and {o for _, got in inputs[attr] for o in got} == {o for _, got in inputs[mlp] for o in got})
    if summed is None or not same:
        why = "takes another input than the block" if summed is not None else (
            "is not added to the block's output as it is (one sum of the two, its output used nowhere else)")
        raise unsupported(f"a shared MLP on the decoder layer beside the MoE block ({attr}, {cls.name}, {file}) "
                          f"that {why}", where, spec.model_type)
    return attr, projections, (f"{file}:{summed}: {cls.name} adds {attr}(x) to {mlp}(x), the same input "
                               f"({code.evidence})")


def _summed_with_block(forward: ast.FunctionDef, shared: str, block: str) -> int | None:
    """The line where the layer's forward adds `self.<shared>(x)` to the MoE block's output (`self.<block>(x)`,
    or a name bound to it), when the shared module is called once and its output goes nowhere else."""
    def call_of(node: ast.AST, attr: str) -> bool:
        return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == attr
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self")

    calls = [n for n in subtree(forward) if call_of(n, shared)]
    if len(calls) != 1:
        return None
    bound: dict[str, set[str]] = {shared: set(), block: set()}  # locals holding each module's whole output
    for node in subtree(forward):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Tuple) and target.elts:  # `out, router_logits = self.block(x)`
                target = target.elts[0]
            for attr, held in bound.items():
                if call_of(node.value, attr) and isinstance(target, ast.Name):
                    held.add(target.id)

    def term(node: ast.AST, attr: str) -> bool:
        return call_of(node, attr) or (isinstance(node, ast.Name) and node.id in bound[attr])

    uses = [n for n in subtree(forward) if isinstance(n, ast.Name) and n.id in bound[shared]
            and isinstance(n.ctx, ast.Load)]
    for node in subtree(forward):
        pair = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            pair = (node.left, node.right)
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add):
            pair = (node.target, node.value)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_"
              and len(node.args) == 1):
            pair = (node.func.value, node.args[0])
        if pair is None:
            continue
        for a, b in (pair, pair[::-1]):
            if term(a, shared) and term(b, block) and (call_of(a, shared) and not uses or len(uses) == 1):
                return node.lineno
    return None


def t_weight_only(found: dict[str, str]) -> bool:
    """Whether the 3-D expert tensors are `.weight`s of modules (whose `.bias` the port would have to cut too):
    the port cuts P and P_bias tensors only."""
    return any(t.endswith(".weight") for t in found.values())


def _deeper_router(tensors: dict, mlp: str, count: int, layer: int, where) -> str:
    """The router of a block that keeps its linear one module deeper, inside a module named gate or router
    (HunYuan-MoE's gate.wg, AfMoE's router.gate): the one 2-D weight MLP.R.X.weight with R in ROUTER_NAMES
    and one row per expert. Refused when there is none, or several."""
    nested = re.compile(rf"^{re.escape(mlp)}\.((?:{'|'.join(ROUTER_NAMES)})\.[A-Za-z_]\w*)\.weight$")
    found = sorted(m.group(1) for rest, info in tensors.items()
                   if (m := nested.match(rest)) and len(info.shape) == 2 and info.shape[0] == count)
    if len(found) == 1:
        return found[0]
    if found:
        raise UnsupportedArchitecture(f"layer {layer}'s {mlp} has several tensors shaped as its router "
                                      f"({', '.join(f'{mlp}.{r}.weight' for r in found)}).", where)
    # Any other tensor with a router's shape: one row per expert, outside the experts.
    deeper = sorted(rest for rest, info in tensors.items() if rest.startswith(f"{mlp}.") and ".experts." not in rest
                    and rest.endswith(".weight") and len(info.shape) == 2 and info.shape[0] == count)
    seen = f"; {deeper[0]} has a router's shape, under a module path the generator does not map" if deeper else ""
    looked = [f"{mlp}.{r}.weight" for r in ROUTER_NAMES] + [f"{mlp}.{r}.NAME.weight" for r in ROUTER_NAMES]
    raise UnsupportedArchitecture(f"layer {layer}'s {mlp} has experts but no router (looked for "
                                  f"{', '.join(looked)}{seen}).", where)


def stored_projection(tensors: dict, module: str, projection: str, code: Callable[[str], str] = str) -> str:
    """The checkpoint's name of `module`'s projection the code calls `projection`: the same, or the stored name
    transformers renames to it on load (HY-V4's checkpoints keep `linear_gate` for its MLPs' gate_proj, renamed by
    `.linear_gate -> .gate_proj` in its conversion table); `projection` where neither is stored."""
    if f"{module}.{projection}.weight" in tensors:
        return projection
    head = f"{module}."
    stored = sorted(rest[len(head):].rsplit(".", 1)[0] for rest in tensors
                    if rest.startswith(head) and rest.endswith(".weight") and rest.count(".") == module.count(".") + 2
                    and code(rest) == f"{module}.{projection}.weight")
    return stored[0] if len(stored) == 1 else projection


def _shared_expert(tensors: dict, mlp: str, router: str, code: Callable[[str], str] = str) -> str | None:
    """The module of the block that holds a dense gated MLP beside the experts (shared_expert, shared_experts);
    its projections read under the code's names (`code`: transformers' renames on load)."""
    inside = re.compile(rf"^{re.escape(mlp)}\.(\w+)\.({'|'.join(SHARED_PROJECTIONS)})\.weight$")
    # Under the checkpoint's own names first (Hunyuan-V3 stores shared_mlp, which transformers renames as a module:
    # its code name is not the stored one); then under the code's projection names (HY-V4's linear_gate).
    found = {m.group(1) for rest in tensors if (m := inside.match(rest))} - {"experts", router.split(".")[0]}
    found = sorted(n for n in found if all(f"{mlp}.{n}.{p}.weight" in tensors for p in SHARED_PROJECTIONS))
    if found:
        return found[0] if len(found) == 1 else None
    found = {m.group(1) for rest in tensors if (m := inside.match(code(rest)))} - {"experts", router.split(".")[0]}
    found = sorted(n for n in found
                   if all(f"{mlp}.{n}.{stored_projection(tensors, f'{mlp}.{n}', p, code)}.weight" in tensors
                          for p in SHARED_PROJECTIONS))
    return found[0] if len(found) == 1 else None


def code_names(ckpt: Checkpoint, base: str) -> Callable[[str], str]:
    """A layer's tensor name (`mlp.expert_bias`) -> the modeling code's name for it (`mlp.e_score_correction_bias`
    for HY-V3), by the renamings transformers applies on load; `base` is the layer's prefix (`model.layers.1.`)."""
    table = renamings.renamings(ckpt)

    def code(rest: str) -> str:
        renamed = renamings.code_name(table, base + rest)
        return renamed[len(base):] if renamed.startswith(base) else rest
    return code


def correction_bias(sources: dict[str, str], tensors: dict, mlp: str, claimed: set[str],
                    code: Callable[[str], str] = str) -> tuple[str, str] | None:
    """The block's tensor the routing code reads beside the router's weight: the DeepSeek-V3 correction bias.

    (its name inside the block, why), or None. A tensor of the block other than a weight or a bias is that
    correction bias when its last name, as the code calls it (`code`), is an attribute the routing path reads
    (`scores + self.e_score_correction_bias`); checkpoints keep it on the router (GLM-4-MoE), on the block
    (EXAONE-MoE) or on a module of its own (Ernie 4.5's moe_statics), and the port builds it where they do.
    """
    path = routing.routing(sources, "experts")
    if path is None:
        return None
    experts = {c for c in claimed if ".experts." in c}
    read = sorted(rest[len(mlp) + 1:] for rest in tensors
                  if rest.startswith(f"{mlp}.") and rest not in claimed and rest.rsplit(".", 1)[0] not in experts
                  and not rest.endswith((".weight", ".bias")) and code(rest).rsplit(".", 1)[-1] in path.attributes)
    if len(read) != 1:
        return None
    attr = code(f"{mlp}.{read[0]}").rsplit(".", 1)[-1]
    return read[0], f"{path.block} ({path.where}) reads {attr} on its routing path" + (
        f" (the checkpoint's {read[0]}, renamed on load by transformers)" if attr != read[0].rsplit(".", 1)[-1]
        else "")


def shared_expert_tensors(tensors: dict, names: dict, on_layer: bool = False) -> dict:
    """A sparse layer's shared-expert tensors, named as if they were a dense MLP's (MLP.gate_proj.weight...);
    `on_layer`: the checkpoint keeps the shared expert on the decoder layer, not in the MoE block."""
    mlp, shared = names["mlp"], names["shared_expert"]
    head = f"{shared}." if on_layer else f"{mlp}.{shared}."
    return {f"{mlp}.{rest[len(head):]}": info for rest, info in tensors.items() if rest.startswith(head)}


def detect(ckpt: Checkpoint, spec: Spec) -> None:
    """Sizes, routing and shapes of the experts (after layout found the names)."""
    if "experts" not in spec.names:
        return
    where = ckpt.config_file
    n = spec.names
    counts = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
    per_token = ("num_experts_per_tok", "moe_top_k", "moe_topk", "top_k", "moe_k")
    _one_for_every_layer(ckpt, spec, counts, "expert count")
    _one_for_every_layer(ckpt, spec, per_token, "top-k")
    sources = sourcecode.modeling_sources(ckpt)
    # The same keys read from a sub-config (DBRX's ffn_config.moe_top_k), where the code reads them there.
    reads = subconfigs.subconfig_reads(sources, ckpt.config) if sources else None
    inside = reads.reads if reads is not None else ()
    counts += tuple(r for r in inside if r.split(".", 1)[1] in counts)
    per_token += tuple(r for r in inside if r.split(".", 1)[1] in per_token)
    flattened = spec.experts_layout == "flattened"  # count and width read from the declaration (find_layout)
    if not flattened:
        set_from_config(spec, ckpt, "num_experts", counts, int)
    set_from_config(spec, ckpt, "num_experts_per_tok", per_token, int)
    key = expert_width_key(sources, n["experts"], ckpt.config)
    if key is None:
        key, _ = config_value(ckpt, "moe_intermediate_size")
    if not flattened:
        _one_for_every_layer(ckpt, spec, (key or "intermediate_size",), "expert width")
        set_from_config(spec, ckpt, "moe_intermediate_size", (key or "intermediate_size",), int)
    key, _ = config_value(ckpt, "norm_topk_prob")
    if key is not None:
        set_from_config(spec, ckpt, "moe_renormalize", (key,), bool)
    else:
        spec.set("moe_renormalize", True, Source("default", "no norm_topk_prob in config.json: the top-k routing "
                                                            "weights are renormalized (Mixtral)"))
    if "shared_expert" in n:
        # Under the code's name for it (HY-V3's checkpoints keep shared_mlp for the code's shared_experts).
        code = code_names(ckpt, f"{n['model']}.{n['layers']}.{spec.sparse_layers[0]}.")
        shared = (n["shared_expert"] if spec.shared_expert_on_layer
                  else code(f"{n['mlp']}.{n['shared_expert']}.{n['down_proj']}.weight").split(".")[1])
        _shared_width(spec, ckpt, sources, shared, n["down_proj"])
    if not 0 < spec.num_experts_per_tok <= spec.num_experts:
        raise CheckpointError(f"config.json routes each token to {spec.num_experts_per_tok} of "
                              f"{spec.num_experts} experts.", where)
    if spec.experts_layout == "flattened":
        # The experts' activation, from their own class (DBRX's ACT2FN[config.ffn_act_fn.get("name", "silu")]).
        layer = f"{n['model']}.{n['layers']}.{spec.sparse_layers[0]}."
        flat = subconfigs.flattened_experts(sources, {k[len(layer):]: v for k, v in ckpt.tensors.items()
                                                      if k.startswith(layer)})
        name, evidence = subconfigs.flat_activation(sources, flat, ckpt.config) if flat else (None, "")
        if name is None:
            raise unsupported(f"experts stored flattened whose activation the code builds otherwise than from a "
                              f"name ({evidence or 'no ACT2FN[...] in their class'})", where, spec.model_type)
        spec.set("hidden_act", name, Source("code", f"{evidence}: {name!r} with config.json's values"))
    if spec.expert_activation == "act_and_mul" and spec.hidden_act not in MOE_ACTIVATIONS:
        raise unsupported(f"gated experts with activation {spec.hidden_act!r} (the port's FusedMoE computes "
                          f"{', '.join(MOE_ACTIVATIONS)})", where, spec.model_type)
    shared_code = frozenset()
    if "shared_expert" in n and not spec.shared_expert_on_layer:
        code = code_names(ckpt, f"{n['model']}.{n['layers']}.{spec.sparse_layers[0]}.")
        shared_code = frozenset({n["shared_expert"], code(f"{n['mlp']}.{n['shared_expert']}.{n['down_proj']}.weight")
                                 .split(".")[1]})
    # A hash router the block builds in some layers (hashrouting reads it): the scoring router is the routing path.
    hashed = frozenset(found.cls.name for found in hashrouting.lookups(sources)) if sources else frozenset()
    path = routing.routing(sources, _routing_attribute(ckpt, spec), shared_code, hashed, ckpt.config)
    if path is not None and (problem := path.problem(spec.num_experts_per_tok)):
        if path.weighted_input or "topk" in path.calls:
            raise unsupported(problem, where, spec.model_type)
        # No top-k: PhiMoE's sparsemixer, where the code computes what vLLM's does (read over numbers).
        mixer = routingmath.read_sparsemixer(sources, path.block, n["experts"], ckpt.config,
                                             spec.num_experts_per_tok)
        if isinstance(mixer, str):
            raise unsupported(f"{problem} ({mixer})", where, spec.model_type)
        _sparsemixer_fields(spec, ckpt, mixer)
        path = None
    if path is not None:
        _routing_fields(spec, ckpt, path)
        if path.norm_division:
            _norm_division(spec, ckpt, path)
    _hash_routing(ckpt, spec, sources)
    hidden, inter, experts = spec.hidden_size, spec.moe_intermediate_size, spec.num_experts
    scored = experts + _zero_experts(spec, ckpt, sources)  # the router scores the identity experts too
    base = f"{n['model']}.{n['layers']}"
    mlp = n["mlp"]
    shapes = {f"{mlp}.{n['router']}.weight": (scored, hidden)}
    if spec.router_bias:
        shapes[f"{mlp}.{n['router']}.bias"] = (scored,)
    if spec.experts_layout in ("stacked", "flattened"):
        shapes.update(stacked_shapes(spec))
    else:
        for e in range(experts):
            for role, shape in (("expert_gate_proj", (inter, hidden)), ("expert_up_proj", (inter, hidden)),
                                ("expert_down_proj", (hidden, inter))):
                shapes[f"{mlp}.{n['experts']}.{e}.{n[role]}.weight"] = shape
    if "shared_expert" in n:
        shared = spec.shared_expert_intermediate_size
        where_shared = n["shared_expert"] if spec.shared_expert_on_layer else f"{mlp}.{n['shared_expert']}"
        for role, shape in (("gate_proj", (shared, hidden)), ("up_proj", (shared, hidden)),
                            ("gate_up_proj", (2 * shared, hidden)), ("down_proj", (hidden, shared))):
            if role in shared_projection_roles(spec):
                shapes[f"{where_shared}.{n[role]}.weight"] = shape
        if "shared_expert_gate" in n:
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
        if spec.moe_correction_bias:
            _check_bias(ckpt, f"{base}.{layer}.{mlp}.{spec.moe_correction_bias}", scored)
        inside = f"{base}.{layer}."
        bias = f"{mlp}.{spec.moe_correction_bias}" if spec.moe_correction_bias else None  # Laguna's, under experts
        extra = sorted(name for name in expert_tensors.get(layer, ())
                       if name[len(inside):] not in shapes and name[len(inside):] != bias
                       and not (identity_expert_tensor(spec, name[len(inside):])
                                and ckpt.tensors[name].shape == (inter, hidden)))
        if extra:
            raise CheckpointError(f"tensor {extra[0]} is an expert past the {experts} that config.json declares, "
                                  "or a part of one the generator does not know.", where)


def _one_for_every_layer(ckpt: Checkpoint, spec: Spec, keys: tuple[str, ...], what: str) -> None:
    """Refuse a config that gives an MoE size per layer (HunYuan-MoE's moe_topk may be a list, one per layer):
    the port reads one value from the config for every sparse layer."""
    key, value = config_value(ckpt, *keys)
    if isinstance(value, list):
        raise unsupported(f"a per-layer MoE {what} (config.json {key} is a list of {len(value)}, one per layer; "
                          "the port reads one value for every layer)", ckpt.config_file, spec.model_type)


def _zero_experts(spec: Spec, ckpt: Checkpoint, sources: dict) -> int:
    """Identity experts (LongCat-Flash's zero experts, `sublayers.identity_experts_read`): their count, read from the
    config key the experts' __init__ adds to the routed count (spec zero_expert_count); 0 where the code has none
    or config.json sets none. The port computes them beside FusedMoE for a top-k taken as it is (not renormalized,
    not grouped); another routing with them is refused by name."""
    block = routing.routing(sources, spec.names["experts"]) if sources else None
    found = sublayers.identity_experts_read(sourcecode._classes(sources), block.block, ckpt.config) \
        if block is not None else None
    if found is None:
        spec.set("zero_expert_count", 0, Source("default", "no identity experts in the code"))
        return 0
    evidence = f"{found.block}.forward hands a token's state on unchanged for expert indices {found.test} ({found.where})"
    value = ckpt.config.get(found.key) if found.key else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise unsupported(f"identity experts ({evidence}) whose count config.json does not give "
                          f"({'config.' + found.key if found.key else 'no config key added to the routed count'})",
                          ckpt.config_file, spec.model_type)
    other = [what for what, on in (("renormalized top-k weights", spec.moe_renormalize),
                                   ("a top-k within expert groups", spec.moe_groups),
                                   ("routing weights on the experts' input", spec.moe_weights_on_input),
                                   ("sparsemixer routing", spec.moe_routing != "topk"),
                                   ("clamped SiLU experts (the port's own experts module, not FusedMoE)",
                                    spec.expert_activation == "silu_clamp")) if on]
    if other:
        raise unsupported(f"identity experts ({evidence}) with {other[0]}: the port computes them for a top-k "
                          "taken as it is", ckpt.config_file, spec.model_type)
    spec.set("zero_expert_count", value, Source("config", f"config.json {found.key}; {evidence}",
                                                f"config.{found.key}"))
    return value


def _check_bias(ckpt: Checkpoint, name: str, experts: int) -> None:
    """A correction bias holds one value per expert: [experts], or [1, experts] (Ernie 4.5's one group)."""
    info = ckpt.tensors.get(name)
    if info is None:
        raise CheckpointError(f"tensor {name} is missing (the routing code adds a correction bias).", ckpt.config_file)
    if tuple(info.shape) not in ((experts,), (1, experts)):
        raise CheckpointError(f"tensor {name} has shape {list(info.shape)}, but the correction bias of {experts} "
                              f"experts needs [{experts}] (or [1, {experts}]).", ckpt.config_file)


def _shared_width(spec: Spec, ckpt: Checkpoint, sources: dict[str, str], shared: str, down: str) -> None:
    """The shared expert's width: the expression over config the code builds it with
    (`intermediate_size=config.moe_intermediate_size * config.n_shared_experts`), else the one width key
    its class reads, else the config's shared_expert_intermediate_size."""
    # Else the width its class builds its gate projection with from the config alone (Aria's shared experts:
    # config.intermediate_size * config.moe_num_shared_experts).
    found = shared_width_expr(sources, shared) or shared_class_width_expr(sources, shared, down)
    if found is None or len(found[1]) == 1:
        # Else the one width key its class reads (HunYuan-MoE's shared_mlp is the dense MLP class).
        key = found[1][0] if found else expert_width_key(sources, shared, ckpt.config)
        set_from_config(spec, ckpt, "shared_expert_intermediate_size", (key or "shared_expert_intermediate_size",),
                        int)
        return
    expr, _keys, where = found
    value = codekeys.evaluate(expr, ckpt.config)
    if value is None or value <= 0:
        raise CheckpointError(f"the shared expert's width {expr} ({where}) is not a positive number with this "
                              "config.", ckpt.config_file)
    spec.set("shared_expert_intermediate_size", value, Source("code", f"{where}: {expr}", expr))


def shared_width_expr(sources: dict[str, str], shared: str) -> tuple[str, tuple[str, ...], str] | None:
    """(expression over config, its keys, file:line) the code gives `self.<shared> = MLP(...)` as its width:
    the keyword intermediate_size, or the one argument besides the config (Ernie 4.5 passes it positionally).
    None when the code does not say."""
    for file, _cls, func, attr, value in codekeys.self_assignments(sources):
        if attr != shared or func.name != "__init__" or not isinstance(value, ast.Call):
            continue
        given = [kw.value for kw in value.keywords if kw.arg == "intermediate_size"]
        if not given:  # the one argument besides the config, under whatever name (a lab's width=)
            given = [a for a in [*value.args, *(kw.value for kw in value.keywords)] if not codekeys._is_config(a)]
        found = codekeys.config_expr(given[0], func) if len(given) == 1 else None
        if found is not None and found[1]:
            return found[0], found[1], f"{file}:{value.lineno}"
    return None


def shared_class_width_expr(sources: dict[str, str], shared: str,
                            down: str = "down_proj") -> tuple[str, tuple[str, ...], str] | None:
    """(expression over config, its keys, file:line) of the inputs of the down projection that the class built
    as `self.<shared> = Class(config)` (or `None if ... else Class(config)`) gives itself:
    `self.down_proj = nn.Linear(WIDTH, hidden)`. None when the class is built with more than the config, or the
    width is not an expression over config."""
    classes = sourcecode._classes(sources)
    built = set()
    for _file, _cls, func, attr, value in codekeys.self_assignments(sources):
        if attr != shared or func.name != "__init__":
            continue
        for call in (n for n in subtree(value) if isinstance(n, ast.Call) and codekeys.callee(n) in classes):
            if len(call.args) + len(call.keywords) == 1:
                built.add(codekeys.callee(call))
    if len(built) != 1:
        return None
    file, cls = classes[built.pop()]
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    for node in subtree(init) if init else ():
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == down and isinstance(node.value, ast.Call)):
            call = node.value
            given = [kw.value for kw in call.keywords if kw.arg == "in_features"] or call.args[0:1]
            found = codekeys.config_expr(given[0], init) if len(given) == 1 else None
            if found is not None and found[1]:
                return found[0], found[1], f"{file}:{call.lineno}"
    return None


def _routing_attribute(ckpt: Checkpoint, spec: Spec) -> str:
    """The attribute the routing reader finds the block by: the experts' (names.experts), or for experts kept as
    banks (scaffold.detect.expertbanks: the code's name for the gate-and-up tensor is the checkpoint's, with no
    `experts` module) the gate-and-up bank's, refused where the first class building it is not the block the
    decoder layer builds (JetMoE's attention builds banks of the same names, JetMoeMoA, after its MoE block)."""
    n = spec.names
    if spec.experts_layout != "stacked" or not n.get("stacked_gate_up", "").endswith(".weight"):
        return n["experts"]
    code = code_names(ckpt, f"{n['model']}.{n['layers']}.{spec.sparse_layers[0]}.")
    if CODE_STACKED.match(code(f"{n['mlp']}.{n['stacked_gate_up']}")):
        return n["experts"]
    bank = n["stacked_gate_up"].removesuffix(".weight")
    sources = sourcecode.modeling_sources(ckpt)
    block = expertbanks.block_class(sources, n["layers"].rsplit(".", 1)[-1], n["mlp"])
    first = next((name for name, (_file, cls) in sourcecode._classes(sources).items()
                  if bank in routing._assigned_classes(routing._method(cls, "__init__"))), None)
    if block is None or first != block[1].name:
        raise unsupported(f"experts kept as banks ({n['mlp']}.{n['stacked_gate_up']}) whose block class the routing "
                          f"reader does not find first ({first} builds self.{bank} before "
                          f"{block[1].name if block else 'the block'})", ckpt.config_file, spec.model_type)
    return bank


def _sparsemixer_fields(spec: Spec, ckpt: Checkpoint, mixer: routingmath.SparseMixer) -> None:
    """PhiMoE's sparsemixer routing: two experts, weights not renormalized, its jitter read from the config at run
    time where the code reads it from the config."""
    spec.set("moe_routing", "sparsemixer", Source("code", mixer.evidence))
    spec.set("moe_renormalize", False, Source("code", f"{mixer.evidence}: each weight is its own masked softmax"))
    if mixer.jitter_key is not None:
        set_from_config(spec, ckpt, "moe_jitter_eps", (mixer.jitter_key,), (int, float))
        spec.set("moe_jitter_eps", float(mixer.jitter), spec.source("moe_jitter_eps"))
    else:
        spec.set("moe_jitter_eps", float(mixer.jitter), Source("code", mixer.evidence))


def _norm_division(spec: Spec, ckpt: Checkpoint, path: routing.Routing) -> None:
    """Top-k weights divided by their p-norm, p an attribute of the block copied from the config (DBRX's
    `router_top_value / torch.norm(router_top_value, p=self.moe_normalize_expert_weights, ...)` under `if
    self.moe_normalize_expert_weights is not None`). The port reads p at run time: p = 1 of softmax scores (they are
    non-negative) is their sum, FusedMoE's renormalize; p null skips the division where the code guards it so; any
    other number is FusedMoE's custom routing function dividing by torch.linalg.vector_norm(ord=p), what
    torch.norm computes for a number p (moe_pnorm). A p the config does not give, one that is not a number, a norm
    of anything else than the top-k's values, or another p beside the DeepSeek-V3 routing parts (sigmoid scores,
    groups, a correction bias, a scaling factor: FusedMoE's grouped top-k takes no routing function) is refused."""
    where = f"{path.block} ({path.where})"
    keys = path.config_keys(frozenset({path.norm_p_attr}))
    refusal = (f"routing weights divided by a norm: {where} divides them by a norm of theirs "
               f"({path.norm_division})")
    if len(keys) != 1:
        raise unsupported(f"{refusal}, of an order p no config key gives; the port's FusedMoE renormalizes them by "
                          "their sum", ckpt.config_file, spec.model_type)
    key = keys[0]
    value = config_value(ckpt, key)[1]
    guarded = path.norm_guard == path.norm_p_attr
    value = None if value is MISSING else value
    if value is None and not guarded:
        raise unsupported(f"{refusal}, p = config.{key} null, which torch.norm reads as its default order 2; the "
                          "port's FusedMoE renormalizes them by their sum", ckpt.config_file, spec.model_type)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value)
                              or path.scoring is None):
        raise unsupported(f"{refusal}, p = config.{key} = {value!r}, where the port divides by a p-norm of softmax "
                          "scores for a number p only", ckpt.config_file, spec.model_type)
    deepseek = [name for name, on in (("sigmoid scores", spec.moe_sigmoid), ("expert groups", spec.moe_groups),
                                      ("a correction bias", spec.moe_correction_bias),
                                      ("a routed scaling factor", spec.moe_routed_scaling_factor is not None)) if on]
    if value not in (None, 1) and (deepseek or path.scoring != "softmax"):
        raise unsupported(f"{refusal}, p = config.{key} = {value!r}, beside {', '.join(deepseek) or path.scoring}: "
                          "the port divides by another norm than the sum in a routing function of softmax scores, "
                          "which FusedMoE's grouped top-k does not take", ckpt.config_file, spec.model_type)
    if not guarded:
        raise unsupported(f"{refusal}, p = config.{key}, divided whatever p is: the port divides only under "
                          "`if p is not None`", ckpt.config_file, spec.model_type)
    detail = (f"{where} divides its top-k {path.scoring} weights by their p-norm ({path.norm_division}) where "
              f"config.{key} is not None")
    spec.set("moe_pnorm", True, Source("code", detail))
    spec.set("moe_norm_p", None if value is None else float(value),
             Source("config", f"config.json {key}", f"config.{key}"))
    spec.set("moe_renormalize", value == 1,
             Source("code", f"{detail}: p = {value!r} " + (
                 "is their sum (non-negative scores)" if value == 1 else "divides by nothing" if value is None
                 else "divides by their p-norm in the port's routing function, not by their sum")))


def _routing_fields(spec: Spec, ckpt: Checkpoint, path: routing.Routing) -> None:
    """The routing beyond softmax top-k, from the block's routing path: the scores, the group-limited top-k,
    the scaling. Each read from the config at run time where the code reads it from the config."""
    where = f"{path.block} ({path.where})"
    spec.set("moe_sigmoid", path.scoring == "sigmoid",
             Source("code", f"{where} scores the experts with {path.scoring} on its routing path"))
    if path.weighted_input:
        # One expert per token (problem() refuses more): its weight scales the input it takes.
        spec.set("moe_weights_on_input", True,
                 Source("code", f"{path.weighted_input}: {path.block} multiplies the experts' input by the "
                                "routing weights"))
    tests = [k for k in path.config_keys(path.test_attrs) if isinstance(ckpt.config.get(k), bool)]
    if not path.divides and not path.softmax_after_topk and (path.scores_then_topk or path.weighted_input):
        # Whatever config.json says (a norm_topk_prob the code never reads) or the default assumes: the code takes
        # the top-k of its scores as they are (Jamba's softmax then top-k; Llama 4's sigmoid of the top-k logits).
        spec.set("moe_renormalize", False,
                 Source("code", f"{where} takes its top-k weights as they are: it neither divides them nor takes a "
                                "softmax of what the top-k chose"))
    elif len(tests) == 1:  # `if self.norm_topk_prob:` renormalizes the top-k weights
        set_from_config(spec, ckpt, "moe_renormalize", (tests[0],), bool)
    # The experts' own top-k reads num_experts_per_tok (transformers' attribute_map name for moe_k, ...).
    per_token = {spec.source("num_experts_per_tok").expr, "config.num_experts_per_tok"}
    groups = path.config_keys(path.divisor_attrs)
    top_groups = [k for k in path.config_keys(path.topk_attrs) if f"config.{k}" not in per_token]
    skipped = [k for k in path.config_keys(path.none_skipped_attrs) if k in groups]
    if groups and skipped and len(groups) == 1 and groups[0] in ckpt.config and ckpt.config[groups[0]] is None:
        # config.json's groups are null and the code limits its top-k to groups only where they are not None.
        attrs = sorted(a for a, k in path.config_attrs if k == groups[0] and a in path.none_skipped_attrs)
        source = Source("code", f"{where} limits its top-k to expert groups only where self.{attrs[0]} is not None, "
                                f"and config.json {groups[0]} is null: no groups")
        spec.set("moe_groups", 0, source)
        spec.set("moe_topk_groups", 0, source)
        groups = []
    if groups:
        if len(groups) != 1 or len(top_groups) != 1:
            raise unsupported(f"{where} limits the top-k to groups of experts, but which config keys hold the "
                              f"groups ({', '.join(groups) or 'none found'}) and the groups chosen "
                              f"({', '.join(top_groups) or 'none found'}) is not plain from its code",
                              ckpt.config_file, spec.model_type)
        set_from_config(spec, ckpt, "moe_groups", tuple(groups), int)
        set_from_config(spec, ckpt, "moe_topk_groups", tuple(top_groups), int)
        if spec.moe_groups is None or spec.moe_topk_groups is None:
            return
        if (spec.moe_groups < 1 or spec.num_experts % spec.moe_groups
                or not 1 <= spec.moe_topk_groups <= spec.moe_groups
                or spec.num_experts // spec.moe_groups < 2 and spec.moe_correction_bias):
            raise CheckpointError(f"config.json splits {spec.num_experts} experts into {spec.moe_groups} groups "
                                  f"and chooses {spec.moe_topk_groups} of them.", ckpt.config_file)
    file = path.where.rsplit(":", 1)[0]
    factors = set(path.factor_attrs)
    for attr, test, op, constant, line, calls in path.guarded_factors:
        # A factor used only under `if self.R <op> constant:`: config.json decides whether that branch runs.
        keys = path.config_keys(frozenset({test}))
        value = ckpt.config.get(keys[0]) if len(keys) == 1 else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise unsupported(f"{where} applies self.{attr} to its routing under `if self.{test} {op} {constant}` "
                              f"({file}:{line}), a condition config.json does not decide", ckpt.config_file,
                              spec.model_type)
        if routing.holds(value, op, constant) and calls:
            raise unsupported(f"{where} transforms its router's scores with self.{attr} ({', '.join(calls)}) under "
                              f"`if self.{test} {op} {constant}` ({file}:{line}), which config.json's {keys[0]} = "
                              f"{value} enables: a routing the port's FusedMoE does not compute", ckpt.config_file,
                              spec.model_type)
        if routing.holds(value, op, constant):
            factors.add(attr)  # a plain scale the branch applies: as if unguarded
    scale = [k for k in path.config_keys(frozenset(factors))
             if isinstance(ckpt.config.get(k), (int, float)) and not isinstance(ckpt.config.get(k), bool)]
    if len(scale) > 1:
        raise unsupported(f"{where} scales its routing weights by several config values ({', '.join(scale)})",
                          ckpt.config_file, spec.model_type)
    if scale:
        value = set_from_config(spec, ckpt, "moe_routed_scaling_factor", tuple(scale), (int, float))
        spec.set("moe_routed_scaling_factor", float(value), spec.source("moe_routed_scaling_factor"))


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
        for call in (n for n in subtree(value) if isinstance(n, ast.Call)):
            name = codekeys.callee(call)
            given = [kw.value for kw in call.keywords if kw.arg == "intermediate_size"]
            found = codekeys.config_expr(given[0], func) if given else None
            if found is not None:
                keys.update(found[1])
            elif name in classes:
                init = next((f for f in classes[name][1].body
                             if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
                for node in subtree(init) if init else ():
                    if (isinstance(node, ast.Attribute) and "intermediate" in node.attr
                            and codekeys._is_config(node.value)):
                        keys.add(node.attr)
                    # `self.intermediate_size = config.K` (LongCat-Flash's expert_ffn_hidden_size)
                    elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                          and isinstance(node.targets[0], ast.Attribute) and "intermediate" in node.targets[0].attr
                          and isinstance(node.value, ast.Attribute) and codekeys._is_config(node.value.value)):
                        keys.add(node.value.attr)
    keys = {k for k in keys if isinstance(config.get(k), int) and not isinstance(config.get(k), bool)}
    return keys.pop() if len(keys) == 1 else None


def _hash_routing(ckpt: Checkpoint, spec: Spec, sources: dict[str, str]) -> None:
    """Hash routing (scaffold.detect.hashrouting): the integer tables the checkpoint holds (the reader reads them
    only where forms.read_checkpoint found the code computing hash routing with them) must sit under the MoE block's
    router, [vocab, top_k], in exactly the layers the code builds its hash router in; the routing's fields."""
    tables = sorted(name for name, info in ckpt.tensors.items() if info.dtype in INTEGER_DTYPES)
    where, n = ckpt.config_file, spec.names
    if not tables:
        # A router of the code routing by a table of token ids in some layer, with no table in the checkpoint (a
        # buffer not saved): the port would route those layers by the scores.
        for lookup in hashrouting.lookups(sources):
            if isinstance(hashrouting.read(sources, ckpt.config, lookup, spec.num_experts,
                                           spec.num_experts_per_tok), str):
                continue
            found = hashrouting.layer_condition(sources, ckpt.config, n["layers"], lookup.cls.name, spec.num_layers)
            if not isinstance(found, str) and found[1]:
                raise unsupported(f"hash routing ({lookup.describe()}) in layers {found[1]} whose table the "
                                  "checkpoint does not hold", where, spec.model_type)
        return
    leaf = tables[0].rsplit(".", 1)[-1]
    lookup = next((found for found in hashrouting.lookups(sources) if found.table == leaf), None)
    if lookup is None:  # forms.read_checkpoint read it as a table only where the code indexes it
        raise unsupported(f"an integer tensor {tables[0]} the code does not index by token ids", where,
                          spec.model_type)
    read = hashrouting.read(sources, ckpt.config, lookup, spec.num_experts, spec.num_experts_per_tok)
    if isinstance(read, str):
        raise unsupported(f"hash routing ({lookup.describe()}): {read}", where, spec.model_type)
    what = f"hash routing ({lookup.describe()})"
    layer_re = re.compile(rf"{re.escape(n['model'])}\.{re.escape(n['layers'])}\.(\d+)\.(.+)")
    layers = []
    for name in tables:
        match = layer_re.fullmatch(name)
        if match is None or match.group(2) != f"{n['mlp']}.{n['router']}.{leaf}":
            raise unsupported(f"{what} with its table stored as {name}, not under a layer's router "
                              f"({n['mlp']}.{n['router']}.{leaf})", where, spec.model_type)
        shape = ckpt.tensors[name].shape
        if shape != (spec.vocab_size, spec.num_experts_per_tok):
            raise CheckpointError(f"tensor {name} has shape {list(shape)}, but a table of each token id's experts "
                                  f"holds {[spec.vocab_size, spec.num_experts_per_tok]} (vocab_size, "
                                  "num_experts_per_tok).", where)
        layers.append(int(match.group(1)))
    found = hashrouting.layer_condition(sources, ckpt.config, n["layers"], lookup.cls.name, spec.num_layers)
    if isinstance(found, str):
        raise unsupported(f"{what}: {found}", where, spec.model_type)
    condition, coded = found
    if sorted(layers) != coded:
        raise CheckpointError(f"the checkpoint holds hash routing's table {leaf} in layers {sorted(layers)}, but the "
                              f"code builds its hash router where `{condition}`: layers {coded}.", where)
    if not set(coded) <= set(spec.sparse_layers):
        raise unsupported(f"{what} in layers {sorted(set(coded) - set(spec.sparse_layers))} without experts", where,
                          spec.model_type)
    # What the port computes beside it: the scored layers' routing inside FusedMoE, the hashed layers' its own.
    beside = [f for f, on in (("identity experts", spec.zero_expert_count), ("a correction bias",
                                                                              spec.moe_correction_bias),
                              ("sparsemixer routing", spec.moe_routing == "sparsemixer"),
                              ("a p-norm of the weights", spec.moe_pnorm),
                              ("routing weights on the experts' input", spec.moe_weights_on_input),
                              ("clamped SiLU experts", spec.expert_activation == "silu_clamp")) if on]
    if beside:
        raise unsupported(f"{what} beside {', '.join(beside)}: the port computes hash routing with FusedMoE's "
                          "plain experts and a router without them", where, spec.model_type)
    tensors = ", ".join(tables)
    spec.set("hash_layers", coded, Source("code", f"{condition} on config.json ({lookup.cls.name}); the tables "
                                                  f"{tensors}"))
    spec.set("hash_condition", condition, Source("code", f"{lookup.cls.name} built where `{condition}`"))
    spec.set("hash_table", leaf, Source("code", f"{lookup.describe()}; stored as {ckpt.tensors[tables[0]].dtype}"))
    spec.set("hash_scoring", read.scoring, Source("code", read.evidence))
    spec.set("hash_renormalize", read.renormalize,
             Source("code", read.evidence, f"config.{read.renormalize_key}" if read.renormalize_key else None))
    spec.set("hash_scaling_factor", read.scale,
             Source("code", read.evidence, f"config.{read.scale_key}" if read.scale_key else None))
