"""Checks that need no engine: mapping coverage, shapes, concat order, vocab, ties, rope."""

from __future__ import annotations

import ast
import copy
import re
from collections import Counter, defaultdict

from scaffold.checkpoint import Checkpoint
from scaffold.detect import detect
from scaffold.detect.configreads import accounted_keys, unaccounted_reads
from scaffold.errors import ScaffoldError
from scaffold.mapping import (
    EXPERT_PARAMS,
    embedding_tensor,
    head_tensor,
    port_rest,
    recurrent_layer,
    renamed_name,
    stacked_modules,
    sublayer_module,
    transposed_modules,
    weight_table,
)
from scaffold.spec import FIELDS, Spec, port_names, stacked_shapes
from scaffold.verify.port import Port
from scaffold.verify.report import Report

SHARDS_OF = {"self_attn.qkv_proj": ("q", "k", "v"), "mlp.gate_up_proj": (0, 1)}


def expected_params(spec: Spec) -> dict[str, tuple]:
    """Every parameter the port holds that a checkpoint tensor must fill -> the shards it needs.

    Written from the spec's structure (block, layouts, biases), not from mapping.py's table,
    so the two can be held against each other.
    """
    n = port_names(spec.names)  # the port's module names (a nested top-level module keeps its last component)
    top, head = f"{n['model']}.", f"{n['lm_head']}."
    params: dict[str, tuple] = {f"{top}{n['embed_tokens']}.weight": (None,)}
    if not spec.norm_weightless and "norm" in n:
        params[f"{top}{n['norm']}.weight"] = (None,)
    if spec.norm_bias and "norm" in n:
        params[f"{top}{n['norm']}.bias"] = (None,)
    if "embed_norm" in n:  # built as the final norm is
        for kind in () if spec.norm_weightless else ("weight", "bias") if spec.norm_bias else ("weight",):
            params[f"{top}{n['embed_norm']}.{kind}"] = (None,)
    if spec.position_scheme == "learned":
        params[f"{top}{n['embed_positions']}.weight"] = (None,)
    if not spec.tie_word_embeddings:
        params[f"{head}weight"] = (None,)
    if spec.lm_head_bias:
        params[f"{head}bias"] = (None,)
    if spec.head_act is not None:  # a transform before the head: its linear map, and a norm built as the others
        transform = f"{n['head_transform']}."
        params[f"{transform}{n['head_dense']}.weight"] = (None,)
        if spec.head_dense_bias:
            params[f"{transform}{n['head_dense']}.bias"] = (None,)
        for kind in () if spec.norm_weightless else ("weight", "bias") if spec.norm_bias else ("weight",):
            params[f"{transform}{n['head_norm']}.{kind}"] = (None,)
    if spec.per_layer_input_size:  # the per-layer input table, the projection into it, its norm (built as the others)
        params[f"{top}{n['per_layer_input_table']}.weight"] = (None,)
        params[f"{top}{n['per_layer_input_model_proj']}.weight"] = (None,)
        for kind in () if spec.norm_weightless else ("weight", "bias") if spec.norm_bias else ("weight",):
            params[f"{top}{n['per_layer_input_model_norm']}.{kind}"] = (None,)
    if spec.hyper_streams:  # the head collapsing the hyper-connections' streams: its matrix, bias and scale
        for name in spec.hyper_head_params:
            params[f"{top}{spec.hyper_head}.{name}"] = (None,)
    if spec.altup_num_inputs:  # the lists building AltUp's copies and mapping them back
        for attr in (spec.altup_projections, spec.altup_unembed_projections):
            for i in range(spec.altup_num_inputs - 1):
                params[f"{top}{attr}.{i}.weight"] = (None,)
    norms = {"pre_norm": ("attn_norm", "mlp_norm"), "parallel": ("attn_norm", "mlp_norm"),
             "post_norm": ("attn_post_norm", "mlp_post_norm"), "residual_norm": ("attn_post_norm", "mlp_post_norm"),
             "sandwich": ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm")}[spec.block]
    attn, mlp = n["self_attn"], n["mlp"]
    sparse = set(spec.sparse_layers)
    for i in range(spec.num_layers):
        p = f"{top}{n['layers']}.{i}."
        kinds = () if spec.norm_weightless else ("weight", "bias") if spec.norm_bias else ("weight",)
        for role in norms:
            if role not in n:  # a parallel block may share one norm
                continue
            if role == "attn_norm" and i in spec.unnormed_attn_layers:  # an identity there
                continue
            if n[role] in spec.gated_norms or (n[role] in spec.gated_norms_conditional
                                               and i in spec.gated_norm_layers):
                inner, gate, up, down = spec.gated_norm_parts  # the norm inside, the gate's linears
                for kind in kinds:
                    params[f"{p}{n[role]}.{inner}.{kind}"] = (None,)
                for linear in (up, down):
                    params[f"{p}{n[role]}.{gate + '.' if gate else ''}{linear}.weight"] = (None,)
                continue
            for kind in kinds:
                params[f"{p}{n[role]}.{kind}"] = (None,)
        if spec.layer_scalar:  # the layer's output scale, a parameter of the layer itself
            params[f"{p}{spec.layer_scalar}"] = (None,)
        for mixer in spec.hyper_mixers:  # the hyper-connections' mixers, whole on every rank
            for name in spec.hyper_params:
                params[f"{p}{mixer}.{name}"] = (None,)
        if spec.per_layer_input_size:  # the per-layer gate and projection, and a norm built as the others
            params[f"{p}{n['per_layer_input_gate']}.weight"] = (None,)
            params[f"{p}{n['per_layer_input_proj']}.weight"] = (None,)
            for kind in kinds:
                params[f"{p}{n['per_layer_input_norm']}.{kind}"] = (None,)
        if spec.altup_num_inputs:  # AltUp's linears, its router's norm and output scale; Laurel's linears and norm
            altup, laurel = f"{p}{spec.altup_module}.", f"{p}{spec.laurel_module}."
            for linear in (spec.altup_router, spec.altup_prediction, spec.altup_correction):
                params[f"{altup}{linear}.weight"] = (None,)
            params[f"{altup}{spec.altup_output_scale}"] = (None,)
            for linear in (spec.laurel_down, spec.laurel_up):
                params[f"{laurel}{linear}.weight"] = (None,)
            for kind in kinds:
                params[f"{altup}{spec.altup_router_norm}.{kind}"] = (None,)
                params[f"{laurel}{spec.laurel_norm}.{kind}"] = (None,)
        if spec.qkv_layout == "latent":
            # The low-rank query's and the latent's down-projections fused in one parameter (shards 0, 1), or the
            # queries' own projection beside the latent's; the latent's norm and expansion. The latent norms are
            # built as the other norms are.
            if spec.q_lora_rank:
                params[f"{p}{attn}.{n['qkv_proj']}.weight"] = (0, 1)
                params[f"{p}{attn}.{n['q_b_proj']}.weight"] = (None,)
                latent_norms = ("q_a_norm", "kv_a_norm")
            else:
                params[f"{p}{attn}.{n['q_proj']}.weight"] = (None,)
                params[f"{p}{attn}.{n['kv_a_proj']}.weight"] = (None,)
                latent_norms = ("kv_a_norm",)
            params[f"{p}{attn}.{n['kv_b_proj']}.weight"] = (None,)
            if spec.latent_out_gate:  # the output's gate, a projection of its own
                params[f"{p}{attn}.{spec.latent_out_gate}.weight"] = (None,)
            for role in latent_norms:
                for kind in kinds:
                    params[f"{p}{attn}.{n[role]}.{kind}"] = (None,)
        elif spec.qkv_layout == "routed":
            # A mixture of attention heads: the keys' and values' projection (one tensor, cut by its loader), the
            # router, the experts' query and output banks and the output's bias, each under its own name.
            routed = f"{p}{attn}.{n['moa']}."
            for name in (f"{p}{attn}.{n['qkv_proj']}.weight", f"{routed}{n['moa_router']}.weight",
                         f"{routed}{n['moa_q_bank']}.weight", f"{routed}{n['moa_o_bank']}.weight",
                         f"{routed}{n['moa_bias']}"):
                params[name] = (None,)
        elif i in spec.kv_share_layers:
            # Keys and values of an earlier layer: the queries' own projection alone, under the checkpoint's name.
            for kind in ("weight", "bias") if spec.qkv_bias else ("weight",):
                params[f"{p}{attn}.{n['q_proj']}.{kind}"] = (None,)
        else:
            qkv_kinds = ("weight", "bias") if spec.qkv_bias else ("weight",)
            for kind in qkv_kinds:
                params[f"{p}{attn}.{n['qkv_proj']}.{kind}"] = SHARDS_OF["self_attn.qkv_proj"]
        # An output bias the attention holds as its own parameter (o_bias_param) is o_proj's bias on its layers.
        o_bias = spec.o_bias or (spec.o_bias_param is not None and i in spec.o_bias_layers)
        for kind in (() if spec.qkv_layout == "routed" else ("weight", "bias") if o_bias else ("weight",)):
            params[f"{p}{attn}.{n['o_proj']}.{kind}"] = (None,)
        if spec.key_bias_proj:  # the key bias's projection of the values and its parameter
            for kind in ("weight", "bias") if spec.key_bias_proj_bias else ("weight",):
                params[f"{p}{attn}.{spec.key_bias_proj}.{kind}"] = (None,)
            params[f"{p}{attn}.{spec.key_bias_param}"] = (None,)
        for name in (spec.residual_scale_attn, spec.residual_scale_mlp):
            if name:
                params[f"{p}{name}"] = (None,)
        if spec.attention_sinks and (not spec.attention_sinks_layers or i in spec.attention_sinks_layers):
            params[f"{p}{attn}.{spec.attention_sinks}"] = (None,)
        for vector in spec.diff_lambdas:  # differential attention's, whole on every rank
            params[f"{p}{attn}.{vector}"] = (None,)
        if "attn_gate" in n:  # a separate gate projection (not one folded into q_proj)
            for kind in ("weight", "bias") if spec.attn_gate_bias else ("weight",):
                params[f"{p}{attn}.{n['attn_gate']}.{kind}"] = (None,)
        if spec.qk_norm != "none":  # built as the other norms are, so with their bias; or with nothing
            for kind in () if spec.qk_norm_weightless else kinds:
                params[f"{p}{attn}.{n['q_norm']}.{kind}"] = (None,)
                if i not in spec.kv_share_layers:
                    params[f"{p}{attn}.{n['k_norm']}.{kind}"] = (None,)
        if spec.attn_sub_norm:  # likewise
            for kind in kinds:
                params[f"{p}{attn}.{n['attn_sub_norm']}.{kind}"] = (None,)
        if i in sparse:
            params.update(_expert_params(spec, p))
            if i in spec.hash_layers:  # hash routing's table, under the router
                params[f"{p}{n['mlp']}.{port_names(n)['router']}.{spec.hash_table}"] = (None,)
            continue
        for kind in ("weight", "bias") if spec.mlp_bias else ("weight",):
            if kind == "weight" or not spec.mlp_down_bias_only:
                if spec.mlp_kind == "gated":
                    params[f"{p}{mlp}.{n['gate_up_proj']}.{kind}"] = SHARDS_OF["mlp.gate_up_proj"]
                else:
                    params[f"{p}{mlp}.{n['up_proj']}.{kind}"] = (None,)
            params[f"{p}{mlp}.{n['down_proj']}.{kind}"] = (None,)
        if spec.gate_extra_bias:
            params[f"{p}{mlp}.{spec.gate_extra_bias}"] = (None,)
        if spec.mlp_sub_norm:
            for kind in kinds:
                params[f"{p}{mlp}.{n['mlp_sub_norm']}.{kind}"] = (None,)
        for tensor in spec.act_tensors:  # the activation's own (xIELU's alpha_p, ...)
            params[f"{p}{mlp}.{n['act_fn']}.{tensor}"] = (None,)
        if spec.parallel_moe_experts:  # routed experts beside the dense MLP (Gemma 4's), their router and norms
            params.update(_parallel_moe_params(spec, p, kinds))
    if spec.recurrent_stacks:
        return _in_stacks(spec, params)
    return _in_sublayers(spec, params) if spec.sublayer_count else params


def _in_stacks(spec: Spec, params: dict[str, tuple]) -> dict[str, tuple]:
    """Stacks run in cycles (spec.recurrent_stacks): every layer's parameters once per stack, under the stack's
    list (model.L_module.layers.0.), and the stored first states (model.z_L_init)."""
    n = spec.names
    head = f"{n['model']}.{n['layers']}."
    out: dict[str, tuple] = {}
    for name, shards in params.items():
        if name.startswith(head):
            out.update((f"{n['model']}.{stack}.{spec.recurrent_layers}.{name[len(head):]}", shards)
                       for stack in spec.recurrent_stacks)
        else:
            out[name] = shards
    for start in spec.cycle_start:
        if start not in ("embeddings", "zeros"):
            out[f"{n['model']}.{start}"] = (None,)
    return out


def _in_sublayers(spec: Spec, params: dict[str, tuple]) -> dict[str, tuple]:
    """A layer of sublayers (spec.sublayer_count): the attention's and the norms' parameters once per sublayer, in
    the lists at each index, and each sublayer's dense MLP (gated) beside the mixture of experts."""
    n = spec.names
    head = f"{n['model']}.{n['layers']}."
    lists = (n["self_attn"], n["attn_norm"], n["mlp_norm"])
    out: dict[str, tuple] = {}
    for name, shards in params.items():
        layer, _, rest = name[len(head):].partition(".") if name.startswith(head) else ("", "", "")
        attr, _, inner = rest.partition(".")
        if layer.isdigit() and attr in lists:
            out.update((f"{head}{layer}.{attr}.{i}.{inner}", shards) for i in range(spec.sublayer_count))
        else:
            out[name] = shards
    for layer in range(spec.num_layers):
        for i in range(spec.sublayer_count):
            mlp = f"{head}{layer}.{spec.sublayer_mlp}.{i}."
            out[f"{mlp}{n['gate_up_proj']}.weight"] = SHARDS_OF["mlp.gate_up_proj"]
            out[f"{mlp}{n['down_proj']}.weight"] = (None,)
    return out


def _parallel_moe_params(spec: Spec, p: str, kinds: tuple[str, ...]) -> dict[str, tuple]:
    """The parameters of the routed experts a layer runs beside its dense MLP (p: the layer's prefix)."""
    experts, router = f"{p}{spec.parallel_moe_experts}", f"{p}{spec.parallel_moe_router}"
    ids = range(spec.parallel_moe_num_experts)
    params: dict[str, tuple] = {
        f"{experts}.{EXPERT_PARAMS['w1']}": tuple((e, w) for e in ids for w in ("w1", "w3")),
        f"{experts}.{EXPERT_PARAMS['w2']}": tuple((e, "w2") for e in ids),
        f"{router}.{spec.parallel_moe_router_proj}.weight": (None,),
    }
    for name in (spec.parallel_moe_router_scale, spec.parallel_moe_expert_scale):
        if name:
            params[f"{router}.{name}"] = (None,)
    for norm in (spec.parallel_moe_dense_norm, spec.parallel_moe_input_norm, spec.parallel_moe_output_norm):
        for kind in kinds if norm else ():
            params[f"{p}{norm}.{kind}"] = (None,)
    return params


def _expert_params(spec: Spec, p: str) -> dict[str, tuple]:
    """The parameters of one mixture-of-experts block (p: the layer's prefix) and the shards each needs."""
    n = spec.names
    mlp, experts = f"{p}{n['mlp']}", range(spec.num_experts)
    # The router under the port's name for it (a router kept deeper, gate.wg, keeps its last component).
    params: dict[str, tuple] = {f"{mlp}.{port_names(n)['router']}.weight": (None,)}
    params[f"{mlp}.{n['experts']}.{EXPERT_PARAMS['w1']}"] = tuple((e, w) for e in experts for w in ("w1", "w3"))
    params[f"{mlp}.{n['experts']}.{EXPERT_PARAMS['w2']}"] = tuple((e, "w2") for e in experts)
    if spec.expert_bias:  # FusedMoE(has_bias=True): a bias per expert, filled like its weight
        for shard in ("w1", "w2"):
            params[f"{mlp}.{n['experts']}.{EXPERT_PARAMS[shard].replace('_weight', '_bias')}"] = params[
                f"{mlp}.{n['experts']}.{EXPERT_PARAMS[shard]}"]
    if spec.router_bias:
        params[f"{mlp}.{port_names(n)['router']}.bias"] = (None,)
    if "shared_expert" in n:
        shared = f"{mlp}.{n['shared_expert']}"
        params[f"{shared}.{n['gate_up_proj']}.weight"] = SHARDS_OF["mlp.gate_up_proj"]
        params[f"{shared}.{n['down_proj']}.weight"] = (None,)
    if "shared_expert_gate" in n:
        params[f"{mlp}.{n['shared_expert_gate']}.weight"] = (None,)
    if spec.moe_correction_bias:
        params[f"{mlp}.{spec.moe_correction_bias}"] = (None,)
    if spec.moa_moe_bias:  # the bias the block adds to its output
        params[f"{mlp}.{spec.moa_moe_bias}"] = (None,)
    if spec.moe_output_norm:  # built as the layer's norms are
        kinds = () if spec.norm_weightless else ("weight", "bias") if spec.norm_bias else ("weight",)
        for kind in kinds:
            params[f"{mlp}.{spec.moe_output_norm}.{kind}"] = (None,)
    return params


def check_mapping(report: Report, spec: Spec, ckpt: Checkpoint, table=None) -> None:
    """Every shard of every parameter filled exactly once. `table`: weight_table(spec, ckpt) if already made."""
    rows, homeless = table or weight_table(spec, ckpt)
    filled: dict[str, list] = defaultdict(list)
    for row in rows:
        if row.param:
            filled[row.param].append(row.shard)
    problems = [f"tensor {n} has no home in the port" for n in homeless]
    expected = expected_params(spec)
    for param, shards in expected.items():
        got = Counter(filled.get(param, []))
        for shard in shards:
            if got[shard] != 1:
                what = "never loaded" if not got[shard] else "loaded twice"
                problems.append(f"{param}{'' if shard is None else f' shard {shard!r}'} is {what}")
    extra = sorted(set(filled) - set(expected))
    problems += [f"tensor(s) load {p}, which the port does not have" for p in extra]
    loaded = sum(1 for r in rows if r.param)
    report.add("mapping coverage", not problems, "; ".join(problems[:3]) if problems else
               f"{loaded} tensors fill {len(filled)} parameters, every shard exactly once")


def check_shapes(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    n = spec.names
    q, kv, inter, hidden = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                            spec.intermediate_size, spec.hidden_size)
    attn, mlp = n["self_attn"], n["mlp"]
    want = {f"{attn}.{n['o_proj']}": hidden, f"{mlp}.{n['down_proj']}": hidden}
    latent = spec.qkv_layout == "latent"
    if latent:
        heads, rope, nope, value = spec.num_heads, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim
        want.update({f"{attn}.{n['kv_a_proj']}": spec.kv_lora_rank + rope,
                     f"{attn}.{n['kv_b_proj']}": heads * (nope + value)})
        if spec.q_lora_rank:
            # An output gate in the query's rows (A.X-K2's): each head's gate is as wide as its value.
            gate = value if spec.attn_output_gate == "in_query" else 0
            want.update({f"{attn}.{n['q_a_proj']}": spec.q_lora_rank,
                         f"{attn}.{n['q_b_proj']}": heads * (nope + rope + gate)})
        else:
            want[f"{attn}.{n['q_proj']}"] = heads * (nope + rope)
    elif spec.qkv_layout == "routed":
        # A mixture of attention heads: no output projection; keys then values in one tensor, the router's rows.
        del want[f"{attn}.{n['o_proj']}"]
        want.update({f"{attn}.{n['qkv_proj']}": 2 * kv,
                     f"{attn}.{n['moa']}.{n['moa_router']}": spec.moa_num_experts})
    elif spec.gated_qkv:
        want[f"{attn}.{spec.gated_qkv}"] = 4 * q  # [gate | q | k | v], as many heads each
    elif spec.qkv_layout == "separate":
        want.update({f"{attn}.{n['q_proj']}": spec.query_rows, f"{attn}.{n['k_proj']}": kv,
                     f"{attn}.{n['v_proj']}": spec.num_kv_heads * spec.value_dim})
    elif spec.qkv_layout == "kv_pairs":  # the queries' tensor, and each KV head's key and value rows in another
        want.update({f"{attn}.{n['q_proj']}": q, f"{attn}.{n['kv_proj']}": 2 * kv})
    else:
        want[f"{attn}.{n['qkv_proj']}"] = q + 2 * kv
    if not spec.has_dense_mlp:
        del want[f"{mlp}.{n['down_proj']}"]
    elif spec.mlp_kind == "plain":
        want[f"{mlp}.{n['up_proj']}"] = inter
    elif spec.gate_up_layout == "separate":
        want.update({f"{mlp}.{n['gate_proj']}": inter, f"{mlp}.{n['up_proj']}": inter})
    else:
        want[f"{mlp}.{n['gate_up_proj']}"] = 2 * inter
    if spec.is_moe:
        want[f"{mlp}.{n['router']}"] = spec.num_experts + spec.zero_expert_count  # identity experts scored too
    stacked = {}  # experts stored 3-D: the whole shape of each tensor, by its name inside a layer
    if spec.is_moe and spec.experts_layout in ("stacked", "flattened"):
        stacked = stacked_shapes(spec)
    if spec.qkv_layout == "routed":  # the attention experts' banks: [experts, rows, columns] of each
        routed = f"{attn}.{n['moa']}"
        stacked.update({f"{routed}.{n['moa_q_bank']}.weight": (spec.moa_num_experts, kv, hidden),
                        f"{routed}.{n['moa_o_bank']}.weight": (spec.moa_num_experts, hidden, kv)})
    if spec.is_moe and spec.experts_layout not in ("stacked", "flattened"):
        for e in range(spec.num_experts):
            experts = f"{mlp}.{n['experts']}.{e}"
            want.update({f"{experts}.{n['expert_gate_proj']}": spec.moe_intermediate_size,
                         f"{experts}.{n['expert_up_proj']}": spec.moe_intermediate_size,
                         f"{experts}.{n['expert_down_proj']}": hidden})
    # Compared under the port's names: the checkpoint's tensors are renamed below as the port loads them (a
    # router kept one module deeper, gate.wg, loads as the port's wg), so the modules expected are renamed too.
    want = {renamed_name(spec, f"{module}.weight").rsplit(".", 1)[0]: rows for module, rows in want.items()}
    # The MLP's gate / up rows, which layers of widths of their own (layer_intermediate_sizes) size per layer.
    mlp_modules = {renamed_name(spec, f"{mlp}.{n[r]}.weight").rsplit(".", 1)[0]
                   for r in ("gate_proj", "up_proj", "gate_up_proj") if r in n} if spec.has_dense_mlp else set()
    query = renamed_name(spec, f"{attn}.{n['q_proj']}.weight").rsplit(".", 1)[0] if "q_proj" in n else None
    key = renamed_name(spec, f"{attn}.{n['k_proj']}.weight").rsplit(".", 1)[0] if "k_proj" in n else None
    value = renamed_name(spec, f"{attn}.{n['v_proj']}.weight").rsplit(".", 1)[0] if "v_proj" in n else None
    fused = (renamed_name(spec, f"{attn}.{n['qkv_proj']}.weight").rsplit(".", 1)[0]
             if spec.qkv_layout == "fused" and "qkv_proj" in n else None)
    prefix = f"{n['model']}.{n['layers']}."
    transposed = transposed_modules(spec)
    problems, seen = [], set()
    for name, info in ckpt.tensors.items():
        if (stacked_layer := recurrent_layer(spec, name)) is not None:  # a stack's layer, checked as the model's
            name = f"{prefix}{stacked_layer[1]}.{stacked_layer[2]}"
        rest = name[len(prefix):].split(".", 1)[-1]
        if name.startswith(prefix) and rest in stacked:
            seen.add(rest)
            if tuple(info.shape) != stacked[rest]:
                problems.append(f"{name} has shape {list(info.shape)}, the spec needs {list(stacked[rest])} "
                                + ("(experts x rows, columns)" if spec.experts_layout == "flattened"
                                   else "(experts, rows, columns)"))
            continue
        if not name.startswith(prefix) or not name.endswith(".weight"):
            continue
        layer, rest = name[len(prefix):].split(".", 1)
        if (sublayer := sublayer_module(spec, rest)) is not None:  # checked as its role's module of a plain layer
            attr, _index, inner = sublayer
            rest = f"{n['mlp'] if attr == spec.sublayer_mlp else attr}.{inner}"
        module = port_rest(spec, renamed_name(spec, rest)).rsplit(".", 1)[0]
        if module in want:
            seen.add(module)
            # GPT-2's Conv1D stores [in, out]: its output rows are the last dimension.
            rows = info.shape[-1] if module in transposed else info.shape[0]
            wanted = want[module]
            if module == query and spec.layer_num_heads and layer.isdigit() and int(layer) < spec.num_layers:
                wanted = spec.heads_of(int(layer)) * spec.head_dim  # this layer's own query heads
            if module == fused and (spec.layer_num_heads or spec.layer_num_kv_heads) and layer.isdigit() \
                    and int(layer) < spec.num_layers:  # this layer's own query and KV heads in one tensor
                wanted = (spec.heads_of(int(layer)) + 2 * spec.kv_heads_of(int(layer))) * spec.head_dim
            if module in (key, value) and spec.layer_num_kv_heads and layer.isdigit() \
                    and int(layer) < spec.num_layers:  # this layer's own KV heads (and head width)
                wanted = spec.kv_heads_of(int(layer)) * (spec.head_dim_of(int(layer)) if module == key
                                                         else spec.value_dim_of(int(layer)))
            if spec.layer_intermediate_sizes and wanted in (inter, 2 * inter) and module in mlp_modules \
                    and layer.isdigit() and int(layer) < spec.num_layers:  # this layer's own MLP width
                wanted = wanted // inter * spec.layer_intermediate_sizes[int(layer)]
            if module == query and spec.layer_head_dim and layer.isdigit() and int(layer) < spec.num_layers:
                wanted = spec.num_heads * spec.head_dim_of(int(layer))  # this layer's own head width
            if rows != wanted:
                problems.append(f"{name} has {rows} rows, the spec needs {wanted}")
    problems += [f"no checkpoint tensor for {m}" for m in sorted((set(want) | set(stacked)) - seen)]
    inter = ("/".join(map(str, sorted(set(spec.layer_intermediate_sizes)))) if spec.layer_intermediate_sizes
             else inter)
    mlp_detail = (f"gate/up {inter} rows each" if spec.mlp_kind == "gated" else f"up {inter} rows")
    if spec.is_moe:
        mlp_detail = (f"{spec.num_experts} experts with gate/up {spec.moe_intermediate_size} rows each"
                      + ((" (2-D tensors of every expert's rows, cut per expert)" if spec.experts_layout == "flattened"
                         else " (3-D tensors, cut per expert)") if stacked else "")
                      + (f"; dense MLP gate/up {inter} rows each" if spec.has_dense_mlp else ""))
    own_heads = (f"; layers of {'/'.join(map(str, sorted(set(spec.layer_num_heads))))} query heads"
                 if spec.layer_num_heads else "")
    own_heads += (f"; layers of {'/'.join(map(str, sorted(set(spec.layer_num_kv_heads))))} KV heads"
                  if spec.layer_num_kv_heads else "")
    own_heads += (f"; layers' own head widths {'/'.join(map(str, sorted(set(spec.layer_head_dim))))}"
                  if spec.layer_head_dim else "")
    v_rows = spec.num_kv_heads * spec.value_dim
    attention = (f"latent attention: latent {spec.kv_lora_rank} + rotated key {spec.qk_rope_head_dim} rows, "
                 f"{spec.num_heads} heads of q {spec.qk_nope_head_dim} + {spec.qk_rope_head_dim}, v {spec.v_head_dim}"
                 if latent else
                 f"mixture of attention heads: {spec.moa_num_experts} experts of q {kv} rows and output {kv} columns, "
                 f"top-{spec.moa_top_k} per token, k {kv}, v {kv} rows (GQA {spec.num_heads}:{spec.num_kv_heads})"
                 if spec.qkv_layout == "routed" else f"q {spec.query_rows}"
                 f"{' (query and gate per head)' if spec.attn_output_gate == 'in_query' else ''}, k {kv}, v {v_rows} rows "
                 f"(GQA {spec.num_heads}:{spec.num_kv_heads}"
                 f"{own_heads}"
                 f"{', ' + spec.qkv_layout if spec.qkv_layout != 'separate' else ''})")
    report.add("per-shard shapes", not problems, problems[0] if problems else f"{attention}; {mlp_detail}")


def stacked_mapping_of(model_file) -> list[tuple]:
    """The stacked_params_mapping literal of a generated model file, read with ast."""
    tree = ast.parse(model_file.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if node_value := getattr(node, "value", None):
            if any(isinstance(t, ast.Name) and t.id == "stacked_params_mapping" for t in targets):
                return [tuple(t) for t in ast.literal_eval(node_value)]
    raise ScaffoldError("the model file has no stacked_params_mapping.", model_file)


def module_constant(model_file, name: str):
    """A literal assigned to a module-level name in a generated model file, read with ast; None if absent."""
    tree = ast.parse(model_file.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def check_expert_roles(report: Report, spec: Spec, model_file) -> None:
    """The model file's EXPERT_PROJECTIONS: which checkpoint projection FusedMoE treats as gate, up and down."""
    if not spec.is_moe:
        return
    n = spec.names
    want = {"ckpt_gate_proj_name": n["expert_gate_proj"], "ckpt_up_proj_name": n["expert_up_proj"],
            "ckpt_down_proj_name": n["expert_down_proj"]}
    got = module_constant(model_file, "EXPERT_PROJECTIONS")
    if not isinstance(got, dict):
        report.add("expert projections", False, "the model file has no EXPERT_PROJECTIONS table")
        return
    wrong = [f"{key} is {got.get(key)!r}, the checkpoint's {key[5:-10]} projection is {value!r}"
             for key, value in want.items() if got.get(key) != value]
    if got.get("ckpt_gate_proj_name") == want["ckpt_up_proj_name"] and got.get("ckpt_up_proj_name") == \
            want["ckpt_gate_proj_name"]:
        wrong.insert(0, "the experts' gate and up projections are swapped")
    stacked = ""
    if spec.experts_layout == "flattened":
        # One 2-D tensor per projection: which per-expert projection each one's rows hold.
        expect = {n["flat_gate"]: (n["expert_gate_proj"],), n["flat_up"]: (n["expert_up_proj"],),
                  n["flat_down"]: (n["expert_down_proj"],)}
        table = module_constant(model_file, "STACKED_EXPERTS")
        if not isinstance(table, dict) or {k: tuple(v) for k, v in table.items()} != expect:
            wrong.insert(0, f"STACKED_EXPERTS is {table!r}, the checkpoint's flattened expert tensors hold "
                            f"{expect!r}")
        stacked = f" (flattened: {n['flat_gate']}, {n['flat_up']}, {n['flat_down']})"
    elif spec.experts_layout == "stacked":
        # The 3-D tensors: which per-expert projections each one's rows hold, in row order.
        halves = (n["expert_gate_proj"], n["expert_up_proj"])
        if spec.expert_gate_up_order != "gate_first" and spec.expert_activation != "swigluoai":
            halves = halves[::-1]
        expect = {n["stacked_gate_up"]: halves, n["stacked_down"]: (n["expert_down_proj"],)}
        if spec.expert_bias:
            expect.update({n["stacked_gate_up_bias"]: halves, n["stacked_down_bias"]: (n["expert_down_proj"],)})
        table = module_constant(model_file, "STACKED_EXPERTS")
        if not isinstance(table, dict) or {k: tuple(v) for k, v in table.items()} != expect:
            wrong.insert(0, f"STACKED_EXPERTS is {table!r}, the checkpoint's 3-D expert tensors hold {expect!r}")
        stacked = f" ({n['stacked_gate_up']}: {' rows, then '.join(expect[n['stacked_gate_up']])} rows)"
    report.add("expert projections", not wrong, wrong[0] if wrong else
               f"{spec.num_experts} experts: gate {want['ckpt_gate_proj_name']} -> w1, up {want['ckpt_up_proj_name']}"
               f" -> w3, down {want['ckpt_down_proj_name']} -> w2{stacked}; top-{spec.num_experts_per_tok} routing"
               f"{', renormalized' if spec.moe_renormalize else ''}")


def check_concat_order(report: Report, spec: Spec, model_file) -> None:
    """The model file's stacked_params_mapping against what each checkpoint module is.

    Catches hand edits and broken generations: a k_proj loaded as shard "v", gate as 1.
    """
    expected = {shard_name: (fused, shard_id) for shard_name, fused, shard_id in stacked_modules(spec)}
    mapping = stacked_mapping_of(model_file)
    problems, seen, ids = [], set(), {}
    for param, shard_name, shard_id in mapping:
        want = expected.get(shard_name)
        ids[shard_name.rsplit(".", 1)[-1]] = shard_id
        if want is None:
            problems.append(f"{shard_name} is not a shard of a fused projection in this port")
        elif (param, shard_id) != want:
            problems.append(f"{shard_name} loads into {param} shard {shard_id!r}, but belongs in "
                            f"{want[0]} shard {want[1]!r}")
        seen.add(shard_name)
    problems += [f"{m} has no entry" for m in sorted(set(expected) - seen)]
    n = {role: spec.names.get(role, role) for role in ("k_proj", "v_proj", "gate_proj", "up_proj")}
    swapped = ""
    if ids.get(n["k_proj"]) == "v" and ids.get(n["v_proj"]) == "k":
        swapped = " (k and v are swapped)"
    if ids.get(n["gate_proj"]) == 1 and ids.get(n["up_proj"]) == 0:
        swapped = " (gate and up are swapped)"
    if problems:
        report.add("q/k/v and gate/up order", False, problems[0] + swapped)
    elif expected:
        report.add("q/k/v and gate/up order", True,
                   ", ".join(f"{k.rsplit('.', 1)[-1]} -> {v[0].rsplit('.', 1)[-1]}[{v[1]!r}]" for k, v in expected.items()))
    elif spec.qkv_layout == "routed":
        report.add("q/k/v and gate/up order", True, f"{spec.names['qkv_proj']} holds keys then values (chunk(2)), cut by "
                                                    "MergedColumnParallelLinear's loader; the queries are the "
                                                    "attention experts' own")
    else:
        report.add("q/k/v and gate/up order", True, "the checkpoint stores fused projections; split by load_weights")


def check_vocab(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    rows = ckpt.tensors[embedding_tensor(spec)].shape[0]
    head = ckpt.tensors.get(head_tensor(spec))
    tok = ckpt.tokenizer.vocab_size
    problems = []
    if spec.vocab_size != rows:
        problems.append(f"vocab_size {spec.vocab_size} but embed_tokens has {rows} rows")
    if head is not None and head.shape[0] != rows:
        problems.append(f"lm_head has {head.shape[0]} rows, embed_tokens {rows}")
    if tok is not None and tok > spec.vocab_size:
        problems.append(f"the tokenizer has {tok} tokens, more than vocab_size {spec.vocab_size}")
    detail = f"vocab_size {spec.vocab_size} = embedding rows" + (" = lm_head rows" if head is not None else "")
    if tok is not None:
        detail += f"; tokenizer {tok} tokens" + (f" ({spec.vocab_size - tok} padded rows)" if tok < rows else "")
    report.add("vocabulary", not problems, problems[0] if problems else detail)


def check_tied(report: Report, spec: Spec, ckpt: Checkpoint) -> None:
    has_head = head_tensor(spec) in ckpt.tensors
    if spec.tie_word_embeddings and has_head:
        same = _tensors_equal(ckpt, head_tensor(spec), embedding_tensor(spec))
        report.add("tied embeddings", same, "lm_head.weight equals embed_tokens" if same else
                   "the port ties lm_head to embed_tokens, but the checkpoint's lm_head.weight differs from it")
    elif spec.tie_word_embeddings:
        report.add("tied embeddings", True, "no lm_head.weight: the head is the embedding")
    elif not has_head:
        report.add("tied embeddings", False, "the port has its own lm_head but the checkpoint has no lm_head.weight")
    else:
        report.add("tied embeddings", True, "untied: lm_head.weight is loaded on its own")


def _tensors_equal(ckpt: Checkpoint, a: str, b: str) -> bool:
    # Deferred on purpose: the static checks read tensor data only here, for a tied head; torch costs seconds.
    from safetensors import safe_open

    def load(name):
        with safe_open(str(ckpt.path / ckpt.tensors[name].file), framework="pt") as f:
            return f.get_tensor(name)

    import torch  # deferred with safe_open above

    return torch.equal(load(a), load(b))


def check_rope(report: Report, spec: Spec, detected: Spec | None) -> None:
    if spec.position_scheme != "rotary":
        report.add("rope parameters", True, f"not used: the port's position scheme is {spec.position_scheme}")
        return
    theta = spec.rope_parameters.get("rope_theta")
    if not theta:
        report.add("rope parameters", False, "the spec has no rope_theta")
        return
    detail = f"{spec.rope_parameters}"
    if detected is not None:
        detail += f" (checkpoint: {detected.source('rope_parameters')})"
    report.add("rope parameters", True, detail)


# Fields a port reads from vllm_config.model_config.hf_config at run time whatever their
# source (the template emits config reads for them), so a sibling checkpoint of the
# architecture may differ in them: rotary parameters and scaling, which layers slide or
# skip rotary, the tied head, and the facts the checks keep.
RUNTIME_FIELDS = ("rope_parameters", "sliding_rope_parameters", "partial_rotary_factor", "sliding_window_layers",
                  "no_rope_layers", "tie_word_embeddings", "dtype", "tokenizer_vocab_size")
# Fields whose presence decides what code the port has (a soft cap, a multiplier, a window):
# a sibling may change the value, read from its config, but not have one where the port has none.
PRESENCE_FIXED = ("sliding_window", "attention_scale", "attn_logit_softcap", "embedding_multiplier",
                  "residual_multiplier", "logits_scale", "final_logit_softcap", "no_rope_layers",
                  "sliding_rope_parameters", "shared_expert_intermediate_size", "dense_layers", "moe_groups",
                  "moe_topk_groups", "moe_routed_scaling_factor", "attention_chunk_size")


def read_at_run_time(spec: Spec, detected: Spec, name: str) -> bool:
    """Whether the port serves the checkpoint's value of `name` by reading its config at run time."""
    absent = (None, [], {}, 0)
    if name in PRESENCE_FIXED and (getattr(spec, name) in absent) != (getattr(detected, name) in absent):
        return False
    return name in RUNTIME_FIELDS or detected.source(name).expr is not None


def overridden_fields(spec_file) -> set[str]:
    """Fields a spec file overrode when the port was generated: the port holds them as literals.

    scaffold_spec.toml writes each field after a comment naming its source ("# override: FILE")."""
    try:
        lines = spec_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return set()
    out = set()
    for previous, line in zip(lines, lines[1:]):
        field = re.match(r"^(?:# )?(\w+) = ", line)
        if field and previous.startswith("# override:"):
            out.add(field.group(1))
    return out


def sibling_spec(spec: Spec, detected: Spec, overridden: set[str] = frozenset()) -> tuple[Spec, list[str]]:
    """The port's spec with the values it reads from this checkpoint's config, and the fields taken so."""
    effective, taken = copy.deepcopy(spec), []
    for name in FIELDS:
        if name == "package" or name in overridden or getattr(spec, name) == getattr(detected, name):
            continue
        if read_at_run_time(spec, detected, name):
            setattr(effective, name, copy.deepcopy(getattr(detected, name)))
            taken.append(name)
    return effective, taken


def spec_drift(spec: Spec, detected: Spec) -> list[str]:
    """Fields where the port's spec differs from what the checkpoint says now."""
    out = []
    for name in FIELDS:
        if name in ("package",):
            continue
        mine, theirs = getattr(spec, name), getattr(detected, name)
        if mine != theirs:
            out.append(f"{name}: port {mine!r}, checkpoint {theirs!r} ({detected.source(name)})")
    return out


def check_config_reads(report: Report, spec: Spec, detected: Spec | None, ckpt: Checkpoint) -> None:
    """Warn about each config key the modeling code reads that no spec field accounts for (key and line).
    The port's spec file keeps values, not provenance: the keys come from detection on this checkpoint."""
    accounted = accounted_keys(spec.provenance) | (accounted_keys(detected.provenance) if detected else set())
    unknown = unaccounted_reads(ckpt, accounted)
    if unknown:
        listed = ", ".join(f"{key} ({where})" for key, where in list(unknown.items())[:12])
        more = f" and {len(unknown) - 12} more" if len(unknown) > 12 else ""
        report.note("config keys the code reads", f"{len(unknown)} key(s) no spec field accounts for: {listed}{more}; "
                    "check what each changes, and set the field it belongs to with --spec", keys=unknown)
    else:
        report.add("config keys the code reads", True, "every key the modeling code reads is accounted for")


def run_static(report: Report, port: Port, ckpt: Checkpoint) -> list[str]:
    """The checks that need no engine. A sibling checkpoint (another depth, rope scaling, tied head or
    sliding pattern than the port was generated from) is checked, and then served, with the values the
    port reads from its config at run time: port.spec becomes that effective spec."""
    try:
        detected = detect(ckpt)
    except ScaffoldError:
        detected = None
    taken: list[str] = []
    if detected is not None:
        port.spec, taken = sibling_spec(port.spec, detected, overridden_fields(port.path / "scaffold_spec.toml"))
    spec = port.spec
    check_mapping(report, spec, ckpt)
    check_shapes(report, spec, ckpt)
    check_concat_order(report, spec, port.model_file)
    check_expert_roles(report, spec, port.model_file)
    check_vocab(report, spec, ckpt)
    check_tied(report, spec, ckpt)
    check_rope(report, spec, detected)
    drift = spec_drift(spec, detected) if detected is not None else []
    runtime = f"; read from its config at run time: {', '.join(taken)}" if taken else ""
    check_config_reads(report, spec, detected, ckpt)
    if drift:
        report.note("spec matches checkpoint", f"{len(drift)} field(s) differ: " + "; ".join(drift) + runtime)
    else:
        report.add("spec matches checkpoint", True, "every field is what the checkpoint says" + runtime)
    return drift
