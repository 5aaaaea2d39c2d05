"""Where every checkpoint tensor goes in the port: vLLM parameter and shard id.

The same table drives `scaffold inspect`, the static checks and REVIEW.md. The
generated model's `load_weights` encodes it independently (its
`stacked_params_mapping` and `split_params_mapping`), and the generated tests hold
the two against each other on the real checkpoint.

The port names its modules after the checkpoint's (spec.names), so most tensors
load under their own name. Three kinds of tensor load into part of a parameter:
- stacked: separate q/k/v (gate/up) tensors, each one shard of a fused parameter;
- split: one checkpoint tensor holding q, k, v (gate, up) one after another, cut
  into its shards;
- interleaved: one tensor holding q, k, v per head ([heads, 3, head_dim] rows),
  regrouped into the q, k, v shards;
- grouped: one tensor holding, per KV head, that group's query heads, then its key,
  then its value ([kv_heads, heads / kv_heads + 2, head_dim] rows, InternLM2's wqkv);
  interleaved is its special case kv_heads == heads;
- kv_pairs: the queries' own tensor, and one tensor holding per KV head its key rows then its value rows
  ([kv_heads, 2, head_dim] rows, TeleChat's key_value), regrouped into the k and v shards;
- blocked: one tensor of B equal row blocks, each holding its heads / B query, key and
  value heads in an order of their own ([B, 3, heads / B * head_dim] rows, CodeGen's
  qkv_proj: B = 4, q, v, k).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scaffold.checkpoint import Checkpoint
from scaffold.spec import (
    ATTENTION_ROLES,
    PER_LAYER_INPUT_LAYER_ROLES,
    PER_LAYER_INPUT_MODEL_ROLES,
    Spec,
    identity_expert_tensor,
    on_layer_roles,
    port_names,
    renamed_prefixes,
    renamed_substrings,
    renamed_suffixes,
)

# (checkpoint module within a decoder layer, fused vLLM module, shard id), with Llama's names.
STACKED = (
    ("self_attn.q_proj", "self_attn.qkv_proj", "q"),
    ("self_attn.k_proj", "self_attn.qkv_proj", "k"),
    ("self_attn.v_proj", "self_attn.qkv_proj", "v"),
    ("mlp.gate_proj", "mlp.gate_up_proj", 0),
    ("mlp.up_proj", "mlp.gate_up_proj", 1),
)
# Buffers some checkpoints save that the port recomputes.
SKIPPED = re.compile(r"(^|\.)rotary_emb\.inv_freq$|(^|\.)rotary_emb\.(cos|sin)_cached$|(^|\.)attention\.(bias|masked_bias)$")
QKV = ("q", "k", "v")
KV = ("k", "v")
GATE_UP = (0, 1)
UP_GATE = (1, 0)
# Where vLLM's FusedMoE (0.24 to 0.32) keeps the weights of every expert, inside the
# experts module: gate and up stacked as w13 ([experts, 2 * intermediate, hidden]),
# down as w2 ([experts, hidden, intermediate]). Shard ids are (expert, w1 | w2 | w3).
EXPERT_PARAMS = {"w1": "routed_experts.w13_weight", "w3": "routed_experts.w13_weight",
                 "w2": "routed_experts.w2_weight"}
EXPERT_SHARDS = (("expert_gate_proj", "w1"), ("expert_up_proj", "w3"), ("expert_down_proj", "w2"))


@dataclass(frozen=True)
class WeightRow:
    checkpoint: str
    param: str | None  # None: skipped on purpose
    shard: str | int | None
    shape: tuple[int, ...]
    note: str = ""


def stacked_modules(spec: Spec) -> list[tuple[str, str, str | int]]:
    """The (checkpoint module, fused module, shard id) entries this spec uses, inside a decoder layer."""
    n = spec.names
    rows = []
    attn = n["self_attn"]
    if spec.qkv_layout == "separate":
        rows += [(f"{attn}.{n[r]}", f"{attn}.{n['qkv_proj']}", s) for r, s in zip(("q_proj", "k_proj", "v_proj"), QKV)]
    elif spec.qkv_layout == "kv_pairs":
        # The queries' tensor is the q shard; the keys-and-values tensor holds both other shards, each KV head's
        # key rows then its value rows (a tuple of shard ids: cut by split_fused).
        rows += [(f"{attn}.{n['q_proj']}", f"{attn}.{n['qkv_proj']}", "q"),
                 (f"{attn}.{n['kv_proj']}", f"{attn}.{n['qkv_proj']}", KV)]
    elif spec.qkv_layout == "latent" and spec.q_lora_rank:
        # Both down-projections of the hidden states, the query's and the latent's, in one matmul (vLLM's
        # fused_qkv_a_proj, a MergedColumnParallelLinear that every rank holds whole).
        rows += [(f"{attn}.{n[r]}", f"{attn}.{n['qkv_proj']}", s) for r, s in zip(("q_a_proj", "kv_a_proj"), GATE_UP)]
    mlp = n["mlp"]
    if spec.mlp_kind == "gated" and spec.gate_up_layout == "separate" and spec.has_dense_mlp:
        rows += [(f"{mlp}.{n[r]}", f"{mlp}.{n['gate_up_proj']}", s) for r, s in zip(("gate_proj", "up_proj"), GATE_UP)]
    if "shared_expert" in n and spec.gate_up_layout == "separate":
        shared = f"{mlp}.{n['shared_expert']}"
        rows += [(f"{shared}.{n[r]}", f"{shared}.{n['gate_up_proj']}", s)
                 for r, s in zip(("gate_proj", "up_proj"), GATE_UP)]
    return rows


def expert_modules(spec: Spec) -> dict[str, tuple[str, tuple[int, str]]]:
    """Expert projection (module inside a sparse layer) -> (vLLM parameter inside the layer, (expert, shard id))."""
    if not spec.is_moe:
        return {}
    n = spec.names
    experts = f"{n['mlp']}.{n['experts']}"
    return {f"{experts}.{e}.{n[role]}": (f"{experts}.{EXPERT_PARAMS[shard]}", (e, shard))
            for e in range(spec.num_experts) for role, shard in EXPERT_SHARDS}


def stacked_expert_tensors(spec: Spec) -> dict[str, Targets]:
    """Tensors holding one projection of every expert ([experts, rows, columns], experts_layout "stacked"), by
    their name inside a decoder layer -> every (vLLM parameter, (expert, shard id), note) they fill: the gate and
    up halves of each expert's rows go to w1 and w3 of w13_weight, the down tensor's to w2_weight."""
    if not spec.is_moe or spec.experts_layout not in ("stacked", "flattened"):
        return {}
    n = spec.names
    mlp, inter = n["mlp"], spec.moe_intermediate_size
    experts = f"{mlp}.{n['experts']}"
    if spec.experts_layout == "flattened":
        # [experts x rows, columns]: expert e's rows e * R to (e + 1) * R, R = rows // experts.
        out = {}
        for role, shard in (("flat_gate", "w1"), ("flat_up", "w3"), ("flat_down", "w2")):
            t = " transposed" if role in spec.flat_in_out else ""
            out[f"{mlp}.{n[role]}"] = [(f"{experts}.{EXPERT_PARAMS[shard]}", (e, shard),
                                        f"expert {e}, {shard}: its slice of the rows{t}")
                                       for e in range(spec.num_experts)]
        return out
    halves = (("w1", 0), ("w3", inter)) if spec.expert_gate_up_order == "gate_first" else (("w3", 0), ("w1", inter))
    # Experts stored [in, out]: the halves are columns of each expert's slice, transposed on load.
    rows, t = ("columns", " transposed") if spec.expert_storage == "in_out" else ("rows", "")
    if spec.expert_activation == "swigluoai":
        # vLLM's swigluoai kernel takes w13 with gate and up alternating row by row; each rank's rows are the
        # pairs of its share of the width, handed to the loader as its w1 and w3 halves.
        source = "alternating" if spec.expert_gate_up_order == "interleaved" else "interleaved from the halves of"
        gate_up = [(f"{experts}.{EXPERT_PARAMS[shard]}", (e, shard),
                    f"expert {e}, {shard}: gate and up {rows} {source} [{e}]{t}, in swigluoai's alternating order")
                   for e in range(spec.num_experts) for shard in ("w1", "w3")]
    else:
        gate_up = [(f"{experts}.{EXPERT_PARAMS[shard]}", (e, shard),
                    f"expert {e}, {shard}: {rows} {a}:{a + inter} of [{e}]{t}")
                   for e in range(spec.num_experts) for shard, a in halves]
    down = [(f"{experts}.{EXPERT_PARAMS['w2']}", (e, "w2"), f"expert {e}, w2: [{e}]{t}")
            for e in range(spec.num_experts)]
    out = {f"{mlp}.{n['stacked_gate_up']}": gate_up, f"{mlp}.{n['stacked_down']}": down}
    if spec.expert_bias:
        w13, w2 = (f"{experts}.{EXPERT_PARAMS[s].replace('_weight', '_bias')}" for s in ("w1", "w2"))
        out[f"{mlp}.{n['stacked_gate_up_bias']}"] = [(w13, (e, shard), f"expert {e}, {shard} bias, as its weight")
                                                     for e in range(spec.num_experts) for shard in ("w1", "w3")]
        out[f"{mlp}.{n['stacked_down_bias']}"] = [(w2, (e, "w2"), f"expert {e}, w2 bias")
                                                  for e in range(spec.num_experts)]
    return out


def parallel_moe_targets(spec: Spec, rest: str) -> Targets | None:
    """The tensors of the routed experts beside the dense MLP (spec.parallel_moe_experts, Gemma 4's), by their name
    inside a decoder layer: each expert's gate and up halves of the 3-D gate-and-up tensor go to w1 and w3 of
    FusedMoE's w13_weight, its down to w2_weight; the router's tensors and the block's norms load under their own
    names, whole on every rank. None for any other tensor."""
    if not spec.parallel_moe_experts:
        return None
    experts, router, inter = spec.parallel_moe_experts, spec.parallel_moe_router, spec.parallel_moe_intermediate_size
    if rest == f"{experts}.{spec.parallel_moe_gate_up}":
        return [(f"{experts}.{EXPERT_PARAMS[shard]}", (e, shard), f"expert {e}, {shard}: rows {a}:{a + inter} of [{e}]")
                for e in range(spec.parallel_moe_num_experts) for shard, a in (("w1", 0), ("w3", inter))]
    if rest == f"{experts}.{spec.parallel_moe_down}":
        return [(f"{experts}.{EXPERT_PARAMS['w2']}", (e, "w2"), f"expert {e}, w2: [{e}]")
                for e in range(spec.parallel_moe_num_experts)]
    own = {f"{router}.{spec.parallel_moe_router_proj}.weight": "the experts' router, whole on every rank"}
    for name, note in ((spec.parallel_moe_router_scale, "the router input's scale"),
                       (spec.parallel_moe_expert_scale, "each expert's routing-weight scale")):
        if name:
            own[f"{router}.{name}"] = note
    for name in (spec.parallel_moe_dense_norm, spec.parallel_moe_input_norm, spec.parallel_moe_output_norm):
        if name:
            own[f"{name}.weight"] = "a norm of the experts beside the dense MLP"
    return [(rest, None, own[rest])] if rest in own else None


def split_modules(spec: Spec) -> list[tuple[str, tuple]]:
    """(module inside a decoder layer, shard ids in row order) for checkpoint tensors holding several shards."""
    n = spec.names
    rows = []
    if spec.qkv_layout in ("fused", "interleaved", "grouped", "blocked"):
        rows.append((f"{n['self_attn']}.{n['qkv_proj']}", QKV))
    if spec.mlp_kind == "gated" and spec.gate_up_layout == "fused":
        # Shard ids in row order: a tensor holding the up half first fills shard 1 from its first rows.
        order = GATE_UP if spec.gate_up_order == "gate_first" else UP_GATE
        if spec.has_dense_mlp:
            rows.append((f"{n['mlp']}.{n['gate_up_proj']}", order))
        if "shared_expert" in n:  # a shared expert whose gate and up sit in one tensor (GraniteMoE-Shared's)
            rows.append((f"{n['mlp']}.{n['shared_expert']}.{n['gate_up_proj']}", order))
    return rows


def plain_layer_modules(spec: Spec) -> list[str]:
    """Modules inside a decoder layer that load as they are (weight and, where present, bias)."""
    n = spec.names
    out = [f"{n['self_attn']}.{n['o_proj']}"]
    if spec.key_bias_proj:  # a RowParallelLinear over the values: each rank loads its KV heads' columns
        out.append(f"{n['self_attn']}.{spec.key_bias_proj}")
    if "attn_gate" in n:  # a ColumnParallelLinear: each rank loads its heads' rows
        out.append(f"{n['self_attn']}.{n['attn_gate']}")
    if spec.qkv_layout == "latent":
        latent = ("q_a_norm", "q_b_proj") if spec.q_lora_rank else ("q_proj", "kv_a_proj")
        out += [f"{n['self_attn']}.{n[r]}" for r in (*latent, "kv_a_norm", "kv_b_proj")]
        if spec.latent_out_gate:  # a ColumnParallelLinear: each rank loads its heads' rows
            out.append(f"{n['self_attn']}.{spec.latent_out_gate}")
    port = port_names(n)  # an nn.Sequential MLP's numbered children load under the port's names (renamed_substrings)
    if spec.has_dense_mlp:
        out.append(f"{n['mlp']}.{port['down_proj']}")
    if spec.qk_norm != "none" and not spec.qk_norm_weightless:
        out += [f"{n['self_attn']}.{n['q_norm']}", f"{n['self_attn']}.{n['k_norm']}"]
    if spec.mlp_kind == "plain":
        out.append(f"{n['mlp']}.{port['up_proj']}")
    if spec.is_moe:  # a router kept deeper (gate.wg) loads under the port's name for it (renamed_suffixes)
        out.append(f"{n['mlp']}.{port_names(n)['router']}")
    if "shared_expert" in n:
        out.append(f"{n['mlp']}.{n['shared_expert']}.{n['down_proj']}")
    if spec.moe_output_norm:  # the MoE block's norm over its output (under the port's name, renamed_suffixes)
        out.append(f"{n['mlp']}.{spec.moe_output_norm}")
    if "shared_expert_gate" in n:
        out.append(f"{n['mlp']}.{n['shared_expert_gate']}")
    out += [n[r] for r in ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm") if r in n]
    if spec.gated_norm_parts:  # a gated norm's own norm and its gate's linears, replicated, as the checkpoint names
        inner, gate, up, down = spec.gated_norm_parts
        out += [f"{g}.{m}" for g in (*spec.gated_norms, *spec.gated_norms_conditional)
                for m in (inner, *(f"{gate}.{x}" if gate else x for x in (up, down)))]
    if spec.attn_sub_norm:  # replicated: every rank normalizes the whole attention output
        out.append(f"{n['self_attn']}.{n['attn_sub_norm']}")
    if spec.mlp_sub_norm:
        out.append(f"{n['mlp']}.{n['mlp_sub_norm']}")
    if spec.per_layer_input_size:  # replicated: the per-layer gate, projection and norm
        out += [n[r] for r in PER_LAYER_INPUT_LAYER_ROLES]
    if spec.altup_num_inputs:  # AltUp's router, its norm and coefficients (replicated); Laurel's linears and norm
        out += [f"{spec.altup_module}.{m}" for m in (spec.altup_router, spec.altup_router_norm, spec.altup_prediction,
                                                     spec.altup_correction)]
        out += [f"{spec.laurel_module}.{m}" for m in (spec.laurel_down, spec.laurel_up, spec.laurel_norm)]
    return out




def transposed_modules(spec: Spec) -> frozenset[str]:
    """Modules inside a decoder layer whose weight the checkpoint stores [in, out] (GPT-2's Conv1D): the port's
    load_weights transposes them into vLLM's [out, in] layers (spec.transposed_roles)."""
    n = spec.names
    return frozenset(f"{n['self_attn'] if role in ATTENTION_ROLES else n['mlp']}.{n[role]}"
                     for role in spec.transposed_roles if role in n)


def port_rest(spec: Spec, rest: str) -> str:
    """The port's name for `rest`, a checkpoint tensor inside a decoder layer: the same, but for projections that
    are the layer's own (OPT's fc1.weight, spec.mlp_on_layer; OLMo v1's att_proj.weight, spec.attn_on_layer), which
    the port keeps in its MLP or attention module."""
    n = spec.names
    first = rest.split(".", 1)[0]
    for role in on_layer_roles(spec):
        if role in n and first == n[role]:
            return f"{n['self_attn'] if role in ATTENTION_ROLES else n['mlp']}.{rest}"
    return rest


def layer_prefix(spec: Spec) -> str:
    return f"{spec.names['model']}.{spec.names['layers']}."


def shard_rows(spec: Spec, shards: tuple, module: str = "") -> list[tuple[str | int, int, int]]:
    """(shard id, first row, rows) of a split tensor (`module` inside a decoder layer), in checkpoint row order."""
    if shards == QKV:
        q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
        return [("q", 0, q), ("k", q, kv), ("v", q + kv, kv)]
    n = spec.names
    shared = "shared_expert" in n and module.startswith(f"{n['mlp']}.{n['shared_expert']}.")
    inter = spec.shared_expert_intermediate_size if shared else spec.intermediate_size
    return [(shards[0], 0, inter), (shards[1], inter, inter)]


@dataclass(frozen=True)
class _Modules:
    """What each module inside a decoder layer is, computed once per spec (the tables are per layer)."""

    stacked: dict[str, tuple[str, str | int]]
    experts: dict[str, tuple[str, tuple[int, str]]]
    split: dict[str, tuple]
    plain: frozenset[str]
    top: frozenset[str]  # tensors outside the decoder layers
    stacked_experts: dict[str, Targets]  # 3-D expert tensors, by name inside a layer
    transposed: frozenset[str]  # modules whose weight is stored [in, out]

    @classmethod
    def of(cls, spec: Spec) -> _Modules:
        n = spec.names
        top = {f"{n['model']}.{n['embed_tokens']}.weight", f"{n['lm_head']}.weight", f"{n['lm_head']}.bias"}
        if "norm" in n:  # none where the base model applies no final norm
            top |= {f"{n['model']}.{n['norm']}.weight", f"{n['model']}.{n['norm']}.bias"}
        if spec.position_scheme == "learned" and "embed_positions" in n:
            top.add(f"{n['model']}.{n['embed_positions']}.weight")
        if "embed_norm" in n:
            top |= {f"{n['model']}.{n['embed_norm']}.weight", f"{n['model']}.{n['embed_norm']}.bias"}
        if spec.per_layer_input_size:  # the per-layer input table, the projection into it and its norm
            top |= {f"{n['model']}.{n[role]}.weight" for role in PER_LAYER_INPUT_MODEL_ROLES}
        if spec.hyper_head:  # the head collapsing the hyper-connections' streams: matrix, bias, scale
            top |= {f"{n['model']}.{spec.hyper_head}.{p}" for p in spec.hyper_head_params}
        if spec.altup_num_inputs:  # the lists building AltUp's copies 1.. and mapping them back
            top |= {f"{n['model']}.{attr}.{i}.weight" for attr in (spec.altup_projections,
                                                                   spec.altup_unembed_projections)
                    for i in range(spec.altup_num_inputs - 1)}
        if spec.head_act is not None:  # a transform before the head, beside it
            top |= {f"{n['head_transform']}.{n[role]}.{kind}" for role in ("head_dense", "head_norm")
                    for kind in ("weight", "bias")}
        return cls({m: (fused, shard) for m, fused, shard in stacked_modules(spec)}, expert_modules(spec),
                   dict(split_modules(spec)), frozenset(plain_layer_modules(spec)), frozenset(top),
                   stacked_expert_tensors(spec), transposed_modules(spec))


Targets = list[tuple[str | None, str | int | tuple | None, str]]


def map_tensor(spec: Spec, name: str, modules: _Modules | None = None) -> Targets | None:
    """[(vLLM parameter, shard id, note)] for one checkpoint tensor; None if the port has no home for it."""
    n = spec.names
    modules = modules or _Modules.of(spec)
    if (stacked := recurrent_layer(spec, name)) is not None:
        stack, layer, rest = stacked
        return _prefixed(f"{n['model']}.{stack}.{spec.recurrent_layers}.{layer}.", map_in_layer(spec, rest, modules))
    if (start := recurrent_start(spec, name)) is not None:
        return [(name, None, f"the first state of {start}, a vector broadcast over the tokens")]
    name = renamed_name(spec, name)
    if name in modules.top:
        if spec.tie_word_embeddings and name == f"{n['lm_head']}.weight":
            return [(None, None, f"tied to {n['model']}.{n['embed_tokens']}.weight")]
        return [(port_param(spec, name), None, "")]
    if name in spec.skipped_tensors:  # inside a layer too (CodeGen-style attn.causal_mask)
        return [(None, None, "recomputed buffer")]
    prefix = layer_prefix(spec)
    inside = _layer_and_rest(prefix, name)
    if inside is None:
        return [(None, None, "recomputed buffer")] if _skipped(name) else None
    layer, rest = inside
    return _prefixed(port_param(spec, f"{prefix}{layer}."),
                     per_layer_targets(spec, int(layer), rest, map_in_layer(spec, rest, modules)))


def recurrent_layer(spec: Spec, name: str) -> tuple[str, str, str] | None:
    """(stack, layer index, name inside the layer) of a tensor of a stack's layers (spec.recurrent_stacks:
    `model.L_module.layers.0.mlp.down_proj.weight`); None for others."""
    model = spec.names["model"]
    for stack in spec.recurrent_stacks:
        head = f"{model}.{stack}.{spec.recurrent_layers}."
        if name.startswith(head):
            layer, _, rest = name[len(head):].partition(".")
            if layer.isdigit() and rest:
                return stack, layer, rest
    return None


def recurrent_start(spec: Spec, name: str) -> str | None:
    """The stack whose first state the stored vector `name` is (HRM's model.z_L_init); None for others."""
    model = spec.names["model"]
    for stack, start in zip(spec.recurrent_stacks, spec.cycle_start):
        if start not in ("embeddings", "zeros") and name == f"{model}.{start}":
            return stack
    return None


def gated_qkv_targets(spec: Spec) -> Targets:
    """The stored [gate | q | k | v] tensor (spec.gated_qkv), inside a layer: its four equal row blocks in the
    gate's parameter and the q, k, v shards of the fused projection."""
    n = spec.names
    attn = n["self_attn"]
    rows = spec.num_heads * spec.head_dim
    return [(f"{attn}.{n['attn_gate']}.weight", None, f"rows 0:{rows} (the output gate)")] + [
        (f"{attn}.{n['qkv_proj']}.weight", shard, f"rows {rows * (i + 1)}:{rows * (i + 2)}")
        for i, shard in enumerate(QKV)]


def per_layer_targets(spec: Spec, layer: int, rest: str, targets: Targets | None) -> Targets | None:
    """map_in_layer's answer in the layers whose attention differs: a KV-shared layer (kv_share_layers) keeps its
    query projection alone, as a module of its own under the checkpoint's name, and computes nothing with its
    keys' or values' tensors; a layer taking the keys' projection as values (k_eq_v_layers) loads k_proj into the
    k and the v shard."""
    if targets is None or not (spec.kv_share_layers or spec.k_eq_v_layers):
        return targets
    n = spec.names
    attn = n["self_attn"]
    if layer in spec.kv_share_layers:
        source = spec.kv_share_sources[spec.kv_share_layers.index(layer)]
        module = rest.rpartition(".")[0]
        if module == f"{attn}.{n['q_proj']}":
            return [(rest, None, f"the queries' own projection; keys and values are layer {source}'s")]
        if module in {f"{attn}.{n[r]}" for r in ("k_proj", "v_proj", "k_norm") if r in n} | (
                {f"{attn}.{spec.v_norm}"} if spec.v_norm else set()):
            return [(None, None, f"not computed: the layer reads layer {source}'s keys and values")]
        return targets
    if layer in spec.k_eq_v_layers:
        out = list(targets)
        for param, shard, note in targets:
            if shard == "k":
                out.append((param, "v", "the keys' projection, also the values' (no value projection here)"))
        return out
    return targets


def renamed_name(spec: Spec, name: str) -> str:
    """The checkpoint name as the port loads it: a norm scale kept under another parameter name becomes its
    `weight` (the port's hf_to_vllm_mapper, spec.renamed_suffixes); the projections an attention wrapper keeps
    one module deeper move up to it (spec.renamed_substrings)."""
    dotted = f".{name}"  # `name` may be a whole name or one inside a layer (pre_attn_norm.scale)
    for old, new in renamed_substrings(spec).items():
        if new is not None and old in dotted:
            dotted = dotted.replace(old, new, 1)
            name = dotted[1:]
    for old, new in renamed_suffixes(spec).items():
        if dotted.endswith(old):
            return (dotted[: -len(old)] + new)[1:]
    return name


def port_param(spec: Spec, name: str) -> str:
    """The port's name for checkpoint name `name`: the same, but for the nested top-level modules the port
    keeps higher up (its hf_to_vllm_mapper, spec.renamed_prefixes)."""
    for old, new in renamed_prefixes(spec).items():
        if new is not None and name.startswith(old):
            return new + name[len(old):]
    return name


def sublayer_targets(spec: Spec, rest: str, modules: _Modules) -> Targets | None:
    """map_in_layer, where the layer runs sublayers (spec.sublayer_count): a module of sublayer i's lists
    (`self_attn.1.q_a_proj.weight`, `mlps.1.gate_proj.weight`) maps as the layer's own module of that role would, its
    parameters in the port's list at the same index (`self_attn.1.fused_qkv_a_proj.weight`)."""
    found = sublayer_module(spec, rest)
    if found is None:
        return map_in_layer(spec, rest, modules)
    attr, index, inner = found
    role_module = spec.names["mlp"] if attr == spec.sublayer_mlp else attr
    targets = map_in_layer(spec, f"{role_module}.{inner}", modules)
    if targets is None:
        return None
    return [(f"{attr}.{index}.{param[len(role_module) + 1:]}" if param else param, shard, note)
            for param, shard, note in targets]


def sublayer_module(spec: Spec, rest: str) -> tuple[str, int, str] | None:
    """(list, sublayer index, the rest) of a name inside a decoder layer held by one of its sublayer lists."""
    if not spec.sublayer_count:
        return None
    n = spec.names
    lists = {n["self_attn"], n["attn_norm"], n["mlp_norm"], spec.sublayer_mlp}
    attr, _, tail = rest.partition(".")
    index, _, inner = tail.partition(".")
    if attr in lists and index.isdigit() and int(index) < spec.sublayer_count and inner:
        return attr, int(index), inner
    return None


def map_in_layer(spec: Spec, rest: str, modules: _Modules) -> Targets | None:
    """map_tensor for the tensor `rest` inside a decoder layer (`self_attn.q_proj.weight`), with parameter
    names inside the layer too: the answer is the same in every layer."""
    n = spec.names
    if _skipped(rest):
        return [(None, None, "recomputed buffer")]
    if identity_expert_tensor(spec, rest):
        return [(None, None, "an identity expert's projection, never computed with (the expert hands the state on)")]
    if any(rest.startswith(f"{n['self_attn']}.{m}.") for m in spec.key_selector):
        return [(None, None, f"top-k key selector, not computed: every key is kept up to index_topk "
                             f"({spec.index_topk}) tokens")]
    rest = port_rest(spec, renamed_name(spec, rest))
    if rest in modules.stacked_experts:
        return list(modules.stacked_experts[rest])
    if (beside := parallel_moe_targets(spec, rest)) is not None:
        return beside
    module, _, kind = rest.rpartition(".")
    if spec.hyper_mixers and module in spec.hyper_mixers and kind in spec.hyper_params:
        return [(rest, None, "a hyper-connection's parameter, whole on every rank")]
    if kind not in ("weight", "bias"):
        if spec.gate_extra_bias and rest == f"{n['mlp']}.{spec.gate_extra_bias}":
            return [(rest, None, "")]
        if spec.attention_sinks and rest == f"{n['self_attn']}.{spec.attention_sinks}":
            return [(rest, None, "attention sinks, one per head")]
        if spec.diff_lambdas and module == n["self_attn"] and kind in spec.diff_lambdas:
            return [(rest, None, "differential attention's vector, whole on every rank")]
        if spec.key_bias_param and rest == f"{n['self_attn']}.{spec.key_bias_param}":
            return [(rest, None, "the key bias's parameter, one per KV head, whole on every rank")]
        if rest in (spec.residual_scale_attn, spec.residual_scale_mlp) and rest:
            return [(rest, None, "the residual's scale")]
        if spec.layer_scalar and rest == spec.layer_scalar:
            return [(rest, None, "the layer's output scale")]
        if spec.altup_num_inputs and rest == f"{spec.altup_module}.{spec.altup_output_scale}":
            return [(rest, None, "AltUp's scale of the corrected active copy")]
        if spec.moe_correction_bias and rest == f"{n['mlp']}.{spec.moe_correction_bias}":
            return [(rest, None, "routing correction bias")]
        if spec.hash_table and rest == f"{n['mlp']}.{n['router']}.{spec.hash_table}":
            return [(rest, None, "hash routing's table of each token id's experts (integers), whole on every rank")]
        if spec.act_tensors and module == f"{n['mlp']}.{n['act_fn']}" and kind in spec.act_tensors:
            return [(rest, None, f"the activation's {kind}")]
        return None
    if (routed := _routed_attention(spec, rest)) is not None:
        return routed
    if spec.gated_qkv and rest == f"{n['self_attn']}.{spec.gated_qkv}.weight":
        return gated_qkv_targets(spec)
    if spec.moa_moe_bias and rest == f"{n['mlp']}.{spec.moa_moe_bias}":
        return [(rest, None, "the MoE block's output bias, whole on every rank, added after the ranks' sum")]
    targets = _in_layer(spec, rest, module, kind, modules)
    if targets is not None and kind == "weight" and module in modules.transposed:
        return [(param, shard, "; ".join(filter(None, ("stored [in, out], transposed on load", note))))
                for param, shard, note in targets]
    if (targets is not None and spec.rope_reversed
            and module in {f"{n['self_attn']}.{n[role]}" for role in ("q_proj", "k_proj", "q_norm", "k_norm")
                           if role in n and (role.endswith("proj") or spec.qk_norm == "per_head")}):
        swapped = "each head's rotated halves swapped on load (rotary by -theta)"
        return [(param, shard, "; ".join(filter(None, (note, swapped)))) for param, shard, note in targets]
    return targets


def _routed_attention(spec: Spec, rest: str) -> Targets | None:
    """A mixture of attention heads' tensor (qkv_layout "routed"), loaded under its own name; None for others."""
    if spec.qkv_layout != "routed":
        return None
    n = spec.names
    routed = f"{n['self_attn']}.{n['moa']}"
    notes = {
        f"{routed}.{n['moa_q_bank']}.weight": "the query experts [experts, KV heads x head_dim, hidden]: each rank "
                                              "its KV heads' rows",
        f"{routed}.{n['moa_o_bank']}.weight": "the output experts [experts, hidden, KV heads x head_dim]: each rank "
                                              "its KV heads' columns",
        f"{routed}.{n['moa_router']}.weight": "the attention's router, whole on every rank",
        f"{routed}.{n['moa_bias']}": "the attention output's bias, whole on every rank, added after the ranks' sum",
        f"{n['self_attn']}.{n['qkv_proj']}.weight": "keys then values (chunk(2)): each rank its KV heads' rows of "
                                                    "both",
    }
    return [(rest, None, notes[rest])] if rest in notes else None


def _in_layer(spec: Spec, rest: str, module: str, kind: str, modules: _Modules) -> Targets | None:
    if module in modules.stacked:
        fused, shard = modules.stacked[module]
        if shard == KV:  # qkv_layout "kv_pairs"
            return [(f"{fused}.{kind}", s, f"rows of every KV head's {s} half") for s in KV]
        return [(f"{fused}.{kind}", shard, "")]
    if module in modules.experts and kind == "weight":
        param, (e, shard) = modules.experts[module]
        return [(param, (e, shard), f"expert {e}, {shard}")]
    if module in modules.split:
        shards = modules.split[module]
        if spec.qkv_layout == "interleaved" and shards == QKV:
            return [(rest, s, f"rows of every head's {s} block") for s in shards]
        if spec.qkv_layout == "grouped" and shards == QKV:
            return [(rest, s, f"rows of every KV group's {s} block") for s in shards]
        if spec.qkv_layout == "blocked" and shards == QKV:
            part = spec.qkv_block_order.index
            return [(rest, s, f"part {part(s) + 1} of 3 in each of {spec.qkv_blocks} row blocks") for s in shards]
        return [(rest, s, f"rows {a}:{a + r}") for s, a, r in shard_rows(spec, shards, module)]
    if module in modules.plain:
        return [(rest, None, "")]
    return None


def _skipped(name: str) -> bool:
    """A buffer vLLM recomputes (rotary tables, GPT-2-style causal masks)."""
    return ("rotary_emb." in name or name.endswith("bias")) and SKIPPED.search(name) is not None


def _layer_and_rest(prefix: str, name: str) -> tuple[str, str] | None:
    """("3", "self_attn.q_proj.weight") for "model.layers.3.self_attn.q_proj.weight"; None outside the layers."""
    if not name.startswith(prefix):
        return None
    layer, _, rest = name[len(prefix):].partition(".")
    return (layer, rest) if layer.isdigit() else None


def _prefixed(base: str, targets: Targets | None) -> Targets | None:
    """Targets inside a layer, named from the model's top (`base`: "model.layers.3.")."""
    if targets is None:
        return None
    return [(param if param is None else base + param, shard, note) for param, shard, note in targets]


def weight_table(spec: Spec, ckpt: Checkpoint) -> tuple[list[WeightRow], list[str]]:
    """Rows for every checkpoint tensor (one per shard it fills), and the names that have no home in the port.

    A decoder layer's tensors are mapped once per name inside the layer (a 94-layer checkpoint repeats
    each 94 times), and sorted with the natural key of that name, also computed once."""
    rows, homeless = [], []
    modules = _Modules.of(spec)
    prefix = layer_prefix(spec)
    head = natural(prefix)
    inside: dict[str, tuple[list, Targets | None]] = {}  # name in the layer -> (natural key, targets)
    keyed = []
    skipped = set(spec.skipped_tensors)
    for name in ckpt.tensors:
        if (stacked := recurrent_layer(spec, name)) is not None:
            # A layer of one of the stacks run in cycles: mapped as the model's layer of that index would be.
            stack, layer, rest = stacked
            if rest not in inside:
                inside[rest] = (natural("." + rest), map_in_layer(spec, rest, modules))
            key, targets = inside[rest]
            base = f"{spec.names['model']}.{stack}.{spec.recurrent_layers}."
            keyed.append(([*natural(base), int(layer), *key], name, _prefixed(f"{base}{layer}.", targets)))
            continue
        split = _layer_and_rest(prefix, name)
        if split is None or name in skipped:
            keyed.append((natural(name), name, map_tensor(spec, name, modules)))
            continue
        layer, rest = split
        if rest not in inside:
            inside[rest] = (natural("." + rest), sublayer_targets(spec, rest, modules))
        key, targets = inside[rest]
        targets = per_layer_targets(spec, int(layer), rest, targets)
        keyed.append(([*head, int(layer), *key], name, _prefixed(port_param(spec, f"{prefix}{layer}."), targets)))
    keyed.sort(key=lambda item: item[0])
    for _, name, targets in keyed:
        if targets is None:
            homeless.append(name)
            continue
        shape = ckpt.tensors[name].shape
        for param, shard, note in targets:
            rows.append(WeightRow(name, param, shard, shape, note))
    return rows, homeless


DIGITS = re.compile(r"(\d+)")


def natural(name: str) -> list:
    """Sort key: digit runs compare as numbers (layers.2 before layers.10)."""
    return [int(p) if p.isdigit() else p for p in DIGITS.split(name)]


def embedding_tensor(spec: Spec) -> str:
    """The checkpoint's embedding matrix (model.embed_tokens.weight for Llama)."""
    return f"{spec.names['model']}.{spec.names['embed_tokens']}.weight"


def head_tensor(spec: Spec) -> str:
    """The checkpoint's output head (lm_head.weight for Llama), absent when tied."""
    return f"{spec.names['lm_head']}.weight"
