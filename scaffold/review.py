"""What a person reads: `scaffold inspect` output, and REVIEW.md of both generators (this module alone writes it)."""

from __future__ import annotations

import json
import re

from scaffold import __version__
from scaffold.analysis import Analysis
from scaffold.backend.compliance import render_markdown
from scaffold.backend.plan import BackendPlan, serve_command
from scaffold.backend.sections import compliance_json, compliance_markdown, compliance_text
from scaffold.detect.activations import gated_forms
from scaffold.detect.chunks import block_size_for
from scaffold.mapping import embedding_tensor, head_tensor
from scaffold.spec import FIELDS, group_heading, omitted, port_names
from scaffold.text import markdown_text

VERIFY_MARKER = "<!-- scaffold verify results -->"


def warnings(analysis: Analysis) -> list[str]:
    spec, ckpt = analysis.spec, analysis.ckpt
    out = []
    rope = spec.source("rope_parameters")
    if spec.position_scheme != "rotary":
        pass  # no rotary embedding: its parameters are not used
    elif rope.kind == "code":
        out.append(f"rope_theta is not in config.json; it was taken from the modeling code ({rope.detail}). "
                   "vLLM would otherwise assume its own default.")
    elif rope.kind == "default":
        out.append("no rope parameters in config.json or the modeling source; the port assumes rope_theta "
                   f"{spec.rope_parameters.get('rope_theta')}.")
    tok = ckpt.tokenizer
    if tok.vocab_size is None:
        out.append("no tokenizer vocabulary could be read (no tokenizer.json or vocab.json).")
    elif tok.vocab_size > spec.vocab_size:
        out.append(f"the tokenizer has {tok.vocab_size} tokens but the embedding only {spec.vocab_size} rows: "
                   "token ids past the embedding would index out of range.")
    elif tok.vocab_size < spec.vocab_size:
        out.append(f"the tokenizer has {tok.vocab_size} tokens and the embedding {spec.vocab_size} rows: "
                   f"{spec.vocab_size - tok.vocab_size} padded rows that no token reaches (fine, but the "
                   "model can still sample them).")
    if tok.files and not tok.chat_template:
        out.append("the tokenizer has no chat_template: /v1/chat/completions will not format conversations.")
    if tok.files and tok.pad_token is None:
        out.append("the tokenizer defines no pad token.")
    if spec.dtype != "float32":
        out.append(f"the checkpoint is stored in {spec.dtype}; vLLM serves it in {spec.dtype} unless --dtype says "
                   "otherwise, and parity is checked in float32.")
    if ckpt.sources:
        out.append(f"the checkpoint ships its own code ({', '.join(ckpt.sources)}); it was read, never run, "
                   "to generate this port.")
    return out


def spec_rows(analysis: Analysis) -> list[tuple[str, str, str]]:
    spec = analysis.spec
    return [(name, json.dumps(getattr(spec, name)), str(spec.source(name))) for name in FIELDS
            if not omitted(name, getattr(spec, name))]


_md = markdown_text  # checkpoint-derived text for a REVIEW.md line or table cell


EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")


def weight_rows_markdown(rows) -> list[str]:
    """The weights table: one row per tensor, except that the experts of one layer and projection
    share a row (a 128-expert model would otherwise list 384 rows per layer)."""
    groups: dict[tuple, list] = {}
    for r in rows:
        match = EXPERT_INDEX.search(r.checkpoint) if isinstance(r.shard, tuple) else None
        if match is None:
            groups[(r.checkpoint, r.param, r.shard)] = [r]
        else:
            key = (EXPERT_INDEX.sub(".experts.{E}.", r.checkpoint, count=1), r.param, r.shard[1], r.shape)
            groups.setdefault(key, []).append(r)
    out = []
    for members in groups.values():
        r = members[0]
        target = f"`{r.param}`" if r.param else f"skipped: {r.note}"
        if len(members) == 1 and not isinstance(r.shard, tuple):
            out.append(f"| `{_md(r.checkpoint)}` | {list(r.shape)} | {_md(target)} | {_md(_shard(r.shard))} |")
            continue
        experts = sorted(m.shard[0] for m in members)
        span = (f"{experts[0]}..{experts[-1]}" if experts == list(range(experts[0], experts[-1] + 1))
                else ", ".join(map(str, experts)))
        name = EXPERT_INDEX.sub(".experts.{E}.", r.checkpoint, count=1)
        out.append(f"| `{_md(name)}`, E = {span} | {list(r.shape)} each | {_md(target)} | "
                   f"(E, {_md(repr(r.shard[1]))}) |")
    return out


def _shard(shard) -> str:
    return "" if shard is None else repr(shard)


def inspect_text(analysis: Analysis) -> str:
    spec, ckpt = analysis.spec, analysis.ckpt
    lines = [f"checkpoint  {ckpt.path}", f"shards      {len(ckpt.shards)} ({ckpt.index_file or 'no index'})",
             f"tensors     {len(ckpt.tensors)}", "", "spec (value  <- source)"]
    width, previous = max(len(n) for n in FIELDS), None
    for name, value, source in spec_rows(analysis):
        if heading := group_heading(name, previous):
            lines.append(f" {heading}")
        previous = name
        lines.append(f"  {name:<{width}}  {value}  <- {source}")
    tok = ckpt.tokenizer
    lines += ["", "vocabulary", f"  config vocab_size   {spec.vocab_size}",
              f"  embedding rows      {ckpt.tensors[embedding_tensor(spec)].shape[0]}",
              f"  lm_head rows        {ckpt.tensors[head_tensor(spec)].shape[0] if head_tensor(spec) in ckpt.tensors else 'tied'}",
              f"  tokenizer tokens    {tok.vocab_size if tok.vocab_size is not None else 'unknown'}"]
    lines += ["", "weights (checkpoint tensor -> vLLM parameter [shard id])"]
    w = max(len(r.checkpoint) for r in analysis.rows)
    for r in analysis.rows:
        target = r.param if r.param else f"(skipped: {r.note})"
        shard = f" [{_shard(r.shard)}]" if r.shard is not None else ""
        lines.append(f"  {r.checkpoint:<{w}}  {list(r.shape)!s:<14} -> {target}{shard}")
    notes = warnings(analysis)
    if notes:
        lines += ["", "warnings"] + [f"  - {n}" for n in notes]
    lines += [""] + compliance_text(analysis)
    return "\n".join(lines)


def inspect_json(analysis: Analysis) -> dict:
    spec, ckpt = analysis.spec, analysis.ckpt
    return {
        "checkpoint": str(ckpt.path),
        "spec": {n: getattr(spec, n) for n in FIELDS},
        "provenance": {n: str(spec.source(n)) for n in FIELDS},
        "vocab": {
            "config": spec.vocab_size,
            "embedding_rows": ckpt.tensors[embedding_tensor(spec)].shape[0],
            "lm_head_rows": ckpt.tensors[head_tensor(spec)].shape[0] if head_tensor(spec) in ckpt.tensors else None,
            "tokenizer": ckpt.tokenizer.vocab_size,
        },
        "weights": [
            {"checkpoint": r.checkpoint, "shape": list(r.shape), "param": r.param, "shard": r.shard, "note": r.note}
            for r in analysis.rows
        ],
        "warnings": warnings(analysis),
        "backend": compliance_json(analysis),
    }


def _latent(spec) -> str:
    """What the port's multi-head latent attention computes, with the checkpoint's module names."""
    n = spec.names
    attn = n["self_attn"]
    query = (f"the queries come from `{attn}.{n['q_a_proj']}` ({spec.q_lora_rank} wide), normed by "
             f"`{n['q_a_norm']}`, and `{n['q_b_proj']}`; `{n['q_a_proj']}` and `{n['kv_a_proj']}` load as shards 0 "
             f"and 1 of `{attn}.{n['qkv_proj']}` (one matmul, whole on every rank)" if spec.q_lora_rank
             else f"the queries come from `{attn}.{n['q_proj']}`")
    scale = ("(qk_nope_head_dim + qk_rope_head_dim) ** -0.5" if spec.attention_scale is None
             else _md(spec.source("attention_scale").detail))
    layer, cached = (("vLLM's `Attention` over the decompressed keys and values", "the port expands per head")
                     if spec.latent_sink_decompressed else
                     ("vLLM's `MLAAttention`" if spec.latent_query_input != "normed" or spec.latent_out_gate
                      or spec.attn_output_gate == "in_query" else "vLLM's `MultiHeadLatentAttentionWrapper`",
                      "which vLLM caches"))
    return (f"- attention: multi-head latent attention ({layer}): {query}; "
            f"`{n['kv_a_proj']}` makes the {spec.kv_lora_rank}-wide latent (normed by `{n['kv_a_norm']}`) and one "
            f"{spec.qk_rope_head_dim}-wide rotated key shared by the heads, {cached}; `{n['kv_b_proj']}` "
            f"expands the latent into each head's {spec.qk_nope_head_dim}-wide unrotated key and "
            f"{spec.v_head_dim}-wide value; scale {scale}, times YaRN's mscale squared where the rotary embedding "
            "is YaRN-scaled.")


def _routed(spec) -> str:
    """What the port's mixture of attention heads computes, with the checkpoint's module names."""
    n = spec.names
    routed = f"{n['self_attn']}.{n['moa']}"
    return (f"- attention: a mixture of attention heads ({_md(spec.source('qkv_layout').detail)}): "
            f"`{routed}.{n['moa_router']}` picks {spec.moa_top_k} of {spec.moa_num_experts} experts per token "
            f"(top-k of its logits, then a softmax over them); each chosen expert's rows of "
            f"`{routed}.{n['moa_q_bank']}` make one group of {spec.num_kv_heads} query heads, computed for every "
            f"expert and the chosen gathered ({spec.moa_num_experts} / {spec.moa_top_k} times the work of the chosen "
            f"alone); keys and values from `{n['self_attn']}.{n['qkv_proj']}` (`MergedColumnParallelLinear`, keys "
            f"then values), shared by the groups: the modeling code tiles them, so its query head j x "
            f"{spec.num_kv_heads} + h reads KV head h, and the port hands vLLM's `Attention` "
            f"({spec.num_heads} heads over {spec.num_kv_heads}) its queries in [KV head, group] order and the "
            f"output back; each group's output goes through its expert's columns of `{routed}.{n['moa_o_bank']}`, "
            f"weighted by its gate, summed, plus `{routed}.{n['moa_bias']}`. Under tensor parallelism each rank "
            "holds its KV heads (rows of both banks' experts, of the keys and the values), the output is all-reduced "
            "and the bias added once; KV heads fewer than the ranks are refused by an assertion.")


def _cycle_term(term: str) -> str:
    return "the embeddings" if term == "embeddings" else f"`{term}`'s state"


def _cycle_start(model: str, start: str) -> str:
    return {"embeddings": "the embeddings", "zeros": "zeros"}.get(start, f"`{model}.{start}`")


def decisions(spec) -> list[str]:
    """What the port computes, in the order a reader meets it in model.py."""
    n = spec.names
    q, kv = spec.query_rows, spec.num_kv_heads * spec.head_dim
    qkv = f"{n['self_attn']}.{n['qkv_proj']}"
    how = {
        "separate": f"q, k, v are separate tensors, loaded into `{qkv}` (`QKVParallelLinear`) as shards q, k, v",
        "fused": f"the checkpoint's `{qkv}` holds q, k, v rows one after another; load_weights cuts it into "
                 "shards q, k, v so tensor parallelism shards each projection",
        "interleaved": f"the checkpoint's `{qkv}` holds q, k, v per head ([heads, 3, head_dim] rows); "
                       "load_weights regroups it into shards q, k, v",
        "grouped": f"the checkpoint's `{qkv}` holds, per KV head, that group's query heads, then its key, then its "
                   "value ([kv_heads, heads / kv_heads + 2, head_dim] rows); load_weights regroups it into shards "
                   "q, k, v",
        "blocked": f"the checkpoint's `{qkv}` holds {spec.qkv_blocks} row blocks, each with its share of the heads "
                   f"as {', '.join(spec.qkv_block_order)} parts ([blocks, 3, heads / blocks * head_dim] rows); "
                   "load_weights regroups it into shards q, k, v",
        "kv_pairs": f"the checkpoint's `{n['self_attn']}.{n.get('q_proj')}` holds q, its "
                    f"`{n['self_attn']}.{n.get('kv_proj')}` each KV head's key then its value ([kv_heads, 2, head_dim] "
                    f"rows); load_weights loads the one as shard q of `{qkv}` and de-interleaves the other into "
                    "shards k, v",
    }.get(spec.qkv_layout)
    if spec.qkv_layout == "latent":
        out = [_latent(spec)]
    elif spec.qkv_layout == "routed":
        out = [_routed(spec)]
    else:
        out = [f"- attention: {how} ({q} + {kv} + {kv} rows{', with bias' if spec.qkv_bias else ''}); "
               f"scale {'head_dim ** -0.5' if spec.attention_scale is None else _md(spec.source('attention_scale').detail)}"
               + (f"; scores soft-capped at {spec.attn_logit_softcap}" if spec.attn_logit_softcap else "")
               + (f"; q, k and v clamped to [-{spec.qkv_clip}, {spec.qkv_clip}] as projected"
                  if spec.qkv_clip is not None else "") + "."]
    if spec.index_topk is not None:
        topk = spec.source("index_topk").expr or str(spec.index_topk)
        selector = ", ".join(f"`{n['self_attn']}.{m}`" for m in spec.key_selector)
        out.append(f"- **serves contexts up to index_topk tokens** (`{_md(topk)}` = {spec.index_topk}): the checkpoint's "
                   f"attention keeps, for each query, the index_topk keys its selector ({selector}) scores best "
                   f"({_md(spec.source('key_selector').detail)}). A query that sees at most index_topk keys keeps them "
                   "all, so the port computes dense attention and does not load the selector's tensors; beyond "
                   "index_topk tokens the selection is not computed, and the port refuses at load time a "
                   "max_model_len above index_topk.")
    if spec.layer_head_dim:
        dims = spec.source("layer_head_dim").expr or "layer_head_dim[layer_idx]"
        kvs = spec.source("layer_num_kv_heads").expr or "layer_num_kv_heads[layer_idx]"
        out.append(f"- head width and KV heads of each layer's own: `{dims}` "
                   f"({', '.join(map(str, spec.layer_head_dim))}) and `{kvs}` "
                   f"({', '.join(map(str, spec.layer_num_kv_heads))}), read by each layer's attention at run time.")
    if spec.layer_num_heads:
        out.append(f"- query heads of each layer's own: `{spec.source('layer_num_heads').expr}[layer_idx]` "
                   f"({', '.join(map(str, spec.layer_num_heads))}), read by each layer's attention at run time "
                   f"(`{n.get('q_proj', n.get('qkv_proj'))}` and `{n['o_proj']}` sized by it"
                   + ("" if spec.layer_num_kv_heads else "; the KV heads are num_kv_heads in every layer") + ").")
    if spec.layer_num_kv_heads:
        sized = f"`{n['qkv_proj']}`" if "k_proj" not in n else f"`{n['k_proj']}` and `{n['v_proj']}`"
        out.append(f"- KV heads of each layer's own: `{_md(spec.source('layer_num_kv_heads').expr or '')}` "
                   f"({', '.join(map(str, spec.layer_num_kv_heads))}), the modeling code's expression, evaluated by "
                   f"each layer's attention at run time ({sized} sized by it).")
    if spec.qkv_layout != "latent" and spec.value_dim != spec.head_dim:
        out.append(f"- value heads {spec.v_head_dim} wide (`{_md(spec.source('v_head_dim').expr or str(spec.v_head_dim))}`), "
                   f"q and k heads {spec.head_dim}: `{qkv}` is built with `v_head_size`, `{n['o_proj']}` takes heads x "
                   f"{spec.v_head_dim}; vLLM's CPU attention takes one head size, so q, k and v are zero-padded to "
                   f"{max(spec.head_dim, spec.v_head_dim)} per head and each head's output cut back to its "
                   f"{spec.v_head_dim} value columns (the zeros change neither the scores nor those columns).")
    if spec.attn_value_scale is not None:
        out.append(f"- the values are multiplied by {spec.attn_value_scale} "
                   f"({_md(spec.source('attn_value_scale').detail)}) before attention.")
    if spec.qkv_layout == "latent" and spec.q_lora_rank and (spec.latent_query_input != "normed"
                                                             or spec.attn_output_gate == "in_query"):
        reads = {"normed": "the normed low-rank query",
                 "normed+unnormed": "the normed low-rank query and the unnormed one, concatenated in that order",
                 "unnormed+normed": "the unnormed low-rank query and the normed one, concatenated in that order",
                 }[spec.latent_query_input]
        gate = ""
        if spec.attn_output_gate == "in_query":
            gate = (f"; each head's rows hold {'the gate, then the query' if spec.latent_gate_first else 'the query, then the gate'}"
                    f" (v_head_dim {spec.v_head_dim} wide), and the attention output is multiplied by "
                    f"{spec.attn_gate_act}(gate) before `{n['o_proj']}`; the port computes the query itself and "
                    "calls vLLM's MLAAttention, not its MLA wrapper")
        out.append(f"- latent attention whose query up-projection `{n['q_b_proj']}` reads {reads}{gate} "
                   f"({_md(spec.source('latent_query_input').detail)}).")
    elif spec.attn_output_gate == "in_query":
        out.append(f"- gated attention, the gate folded into `{n['q_proj']}`: its rows hold, per head, the query "
                   f"then the gate ({q} rows); `{qkv}` is built with twice the query heads so each "
                   "tensor-parallel rank takes its heads' [query | gate] pairs, cut in two after the projection; the "
                   f"attention output is multiplied by {spec.attn_gate_act}(gate) before `{n['o_proj']}`.")
    elif spec.attn_output_gate != "none":
        per = "one value per head" if spec.attn_output_gate == "per_head" else "one value per output element"
        out.append(f"- gated attention: the attention output is multiplied by {spec.attn_gate_act}"
                   f"(`{spec.names['self_attn']}.{spec.names['attn_gate']}`(x)), {per}, before "
                   f"`{spec.names['o_proj']}`; the gate is a ColumnParallelLinear whose rows each tensor-parallel rank "
                   "takes by its heads.")
    if spec.latent_out_gate:
        out.append(f"- gated latent attention ({_md(spec.source('latent_out_gate').detail)}): the attention output is "
                   f"multiplied element by element by {spec.latent_out_gate_act}(`{spec.names['self_attn']}."
                   f"{spec.latent_out_gate}`(x)), {spec.num_heads} heads x v_head_dim {spec.v_head_dim}, before "
                   f"`{spec.names['o_proj']}`; the gate is a ColumnParallelLinear whose rows each tensor-parallel rank "
                   "takes by its heads.")
    if spec.latent_sink_decompressed:
        out.append("- latent attention with sinks: vLLM's MLAAttention takes no sinks, so the port expands the latent "
                   f"into each head's key ({spec.qk_nope_head_dim} unrotated columns from `{spec.names['kv_b_proj']}`"
                   f" and the shared {spec.qk_rope_head_dim}-wide rotated key) and value ({spec.v_head_dim} columns) "
                   "and runs vLLM's `Attention` with the sinks, keys and values zero-padded to the wider of the two "
                   "(vLLM's CPU attention takes one head size). **Its KV cache holds full keys and values per head, "
                   "not the compressed latent**: far more memory per token than the checkpoint's MLA cache. vLLM sizes the cache "
                   "for MLA for this model type unless **VLLM_MLA_DISABLE=1** is set; the port refuses to load "
                   "without it.")
    if spec.attention_sinks:
        out.append(f"- attention sinks: `{spec.names['self_attn']}.{spec.attention_sinks}` holds a learned logit per "
                   "head that vLLM's `Attention(sinks=...)` adds to each softmax's denominator; each tensor-parallel "
                   "rank loads its heads' slice"
                   + (f"; only in layers {spec.attention_sinks_layers}, where "
                      f"`{_md(spec.source('attention_sinks_layers').expr or '')}` (the code builds them there)."
                      if spec.attention_sinks_layers else "."))
    if spec.diff_lambdas:
        lam = spec.diff_lambdas
        out.append(f"- differential attention ({_md(spec.source('diff_lambdas').detail)}): two vLLM attentions over "
                   "the same q and k, fed the first and the second half of the value heads (each repeated twice); "
                   "their outputs, [o1 | o2] per head, are paired head i with head i + H/2 and subtracted, the second "
                   f"weighted by exp(sum({lam[0]} * {lam[1]})) - exp(sum({lam[2]} * {lam[3]})) + init, "
                   f"init = `{spec.diff_lambda_init}`; the difference is RMS-normed over 2 * head_dim (no weight, eps "
                   f"{spec.diff_norm_eps}) and scaled by 1 - init before `{spec.names['o_proj']}`. Under tensor "
                   "parallelism the value heads and the outputs are all-gathered and each rank computes the pairs "
                   f"whose `{spec.names['o_proj']}` columns it holds.")
    if spec.key_bias_proj:
        a = spec.names["self_attn"]
        window = spec.source("key_bias_window")
        out.append(f"- a bias per key ({_md(spec.source('key_bias_proj').detail)}): each key's scores get "
                   f"exp(`{a}.{spec.key_bias_param}` * softplus(`{a}.{spec.key_bias_proj}`(v))) added, v every KV "
                   "head's values of that key; vLLM's attention computes it as one more column of each head (q' = "
                   "[q, 1], k' = [k, bias / scale], the bias riding in the KV cache with its key), the heads "
                   "zero-padded to the next size vLLM's CPU attention takes and each head's output cut back. Under "
                   f"tensor parallelism `{spec.key_bias_proj}` is row-parallel over the KV heads' values; with fewer "
                   "KV heads than ranks (each replicated) it is whole on every rank, which gathers each KV head's "
                   "values once."
                   + (f" **The modeling code keeps only the top {spec.key_bias_window} keys of each query beyond "
                      f"that many** (`{_md(window.expr or str(spec.key_bias_window))}`); a query that sees no more "
                      "keeps them all, so the port refuses at load any max_model_len above "
                      f"`{_md(window.expr or str(spec.key_bias_window))}`." if spec.key_bias_window is not None
                      else ""))
    if spec.o_bias_param:
        out.append(f"- an output bias the attention keeps as its own parameter, `{spec.names['self_attn']}."
                   f"{spec.o_bias_param}`, added by the layer to `{spec.names['o_proj']}`'s output "
                   f"({_md(spec.source('o_bias_param').detail)}): loaded as `{spec.names['o_proj']}`'s bias on layers "
                   f"{spec.o_bias_layers}, the only ones that hold it.")
    if spec.moa_moe_bias:
        out.append(f"- a bias the MoE block adds to its output, `{spec.names['mlp']}.{spec.moa_moe_bias}` "
                   f"({_md(spec.source('moa_moe_bias').detail)}), after the experts' all-reduce (whole on every "
                   "rank).")
    if spec.expert_activation == "silu_clamp":
        limit = spec.source("expert_clamp_limit").expr or str(spec.expert_clamp_limit)
        out.append(f"- **experts computed by the port, not by FusedMoE**: they compute silu(gate.clamp(max=L)) * "
                   f"up.clamp(-L, L) with L = `{_md(limit)}` ({spec.expert_clamp_limit:g}; "
                   f"{_md(spec.source('expert_activation').detail)}). vLLM's FusedMoE takes L as swiglu_limit, but "
                   "its CPU kernel does not apply it; the port's ClampedSiluExperts routes with vLLM's router and "
                   "loops over the routed experts in torch (one custom op): unquantized, without expert "
                   "parallelism or EPLB, slower than FusedMoE's kernels.")
    if spec.moe_output_norm:
        out.append(f"- a norm over the MoE block's output, `{spec.names['mlp']}.{spec.moe_output_norm}` "
                   f"({_md(spec.source('moe_output_norm').detail)}), applied after the experts' all-reduce"
                   + (", kept on the decoder layer by the checkpoint and loaded into the block" if
                      spec.moe_output_norm_on_layer else "") + ".")
    if spec.parallel_moe_experts:
        norms = [f"`{n}`" for n in (spec.parallel_moe_dense_norm, spec.parallel_moe_input_norm,
                                    spec.parallel_moe_output_norm) if n]
        router_parts = [p for p, on in (("a weightless RMS norm", spec.parallel_moe_router_norm),
                                        (f"x `{spec.parallel_moe_router_scale}`", spec.parallel_moe_router_scale),
                                        ("x hidden_size ** -0.5", spec.parallel_moe_router_root)) if on]
        out.append(f"- **routed experts beside the dense MLP**: each layer adds `{spec.parallel_moe_experts}` "
                   f"({spec.parallel_moe_num_experts} experts {spec.parallel_moe_intermediate_size} wide, top "
                   f"{spec.parallel_moe_top_k}, {spec.parallel_moe_activation}; vLLM's FusedMoE) to its dense MLP's "
                   f"output ({_md(spec.source('parallel_moe_experts').detail)})"
                   + (f", with the norms {', '.join(norms)}" if norms else "")
                   + f"; the router `{spec.parallel_moe_router}` reads "
                   + ("the residual stream" if spec.parallel_moe_router_input == "residual" else
                      "the experts' normed input")
                   + (f" through {', '.join(router_parts)}" if router_parts else "")
                   + ", a softmax over every expert, the top k"
                   + (", renormalized" if spec.parallel_moe_renormalize else "")
                   + (f", each times `{spec.parallel_moe_expert_scale}`" if spec.parallel_moe_expert_scale else "")
                   + f" ({_md(spec.source('parallel_moe_router_proj').detail)}); replicated on every rank.")
    if spec.sublayer_count:
        n = spec.names
        out.append(f"- {spec.sublayer_count} sublayers per decoder layer, each with its own `{n['attn_norm']}`, "
                   f"`{n['self_attn']}`, `{n['mlp_norm']}` and `{spec.sublayer_mlp}` (module lists indexed by the "
                   f"sublayer); the mixture of experts `{n['mlp']}` reads sublayer {spec.shortcut_reads}'s "
                   f"`{n['mlp_norm']}` output and is added to the layer's output "
                   f"({_md(spec.source('sublayer_count').detail)}). Each sublayer's attention caches under a layer "
                   f"name of its own ({spec.sublayer_count} x layer + sublayer).")
    if spec.recurrent_stacks:
        n = spec.names
        calls = "; ".join(
            f"`{stack}` on {' + '.join(map(_cycle_term, inputs.split('+')))}"
            + (f", config.{inner} times" if inner else "")
            + f", starting from {_cycle_start(n['model'], start)}"
            for stack, inner, inputs, start in zip(spec.recurrent_stacks, spec.cycle_inner, spec.cycle_inputs,
                                                   spec.cycle_start))
        out.append(f"- layer stacks run in config.{spec.cycle_outer} cycles ({_md(spec.source('recurrent_stacks').detail)}"
                   f"): each cycle runs {calls}; the forward returns `{spec.cycle_result}`'s state. Each stack holds "
                   f"its own `{spec.recurrent_layers}`"
                   + (f" and ends with `{spec.recurrent_norm}`, a norm without parameters" if spec.recurrent_norm
                      else "")
                   + ". Every (step, layer) runs its own vLLM `Attention` with its own KV cache (layer name: step x "
                   "layers per stack + layer), all on the layer's shared projections, as vLLM's hrm_text.py does. "
                   "The attention is causal: transformers' HrmText attends bidirectionally within a prefix only when "
                   "token_type_ids are passed (with config.prefix_lm), which neither vLLM's engine nor the verifier "
                   "passes; vLLM's own hrm_text.py (PrefillPrefixLMAttention) attends bidirectionally over every "
                   "prompt instead. No pipeline parallelism: every cycle runs every stack, so no split of the layers "
                   "into consecutive stages computes the model; the class declares no SupportsPP (as vLLM's own "
                   "hrm_text.py), so vLLM refuses pipeline_parallel_size above 1 when the engine starts.")
    if spec.gated_qkv:
        n = spec.names
        out.append(f"- `{n['self_attn']}.{spec.gated_qkv}` holds four equal row blocks [gate | q | k | v] "
                   f"({_md(spec.source('gated_qkv').detail)}): load_weights cuts it into `{n['attn_gate']}` and the "
                   f"q, k, v shards of `{n['self_attn']}.{n['qkv_proj']}`.")
    if spec.hash_layers:
        renorm = spec.source("hash_renormalize").expr or str(spec.hash_renormalize)
        scale = spec.source("hash_scaling_factor").expr or f"{spec.hash_scaling_factor:g}"
        out.append(f"- **hash routing** in layers {spec.hash_layers} (where `{_md(spec.hash_condition)}`): each "
                   f"token's experts are its row of the integer table `{spec.names['mlp']}.{spec.names['router']}."
                   f"{spec.hash_table}` ({_md(spec.source('hash_table').detail)}), weighted by the router's "
                   f"{spec.hash_scoring} scores there, renormalized where `{_md(renorm)}`, times `{_md(scale)}` "
                   f"({_md(spec.source('hash_scoring').detail)}). The table is loaded as an int64 parameter, whole on "
                   "every rank; the block computes the weights and hands FusedMoE a [tokens, experts] table of them "
                   "(its custom routing function takes the top k); the model passes the token ids down, so a "
                   "request served from prompt embeddings is refused in those layers.")
    if spec.zero_expert_count:
        out.append(f"- {spec.zero_expert_count} identity experts (`{_md(spec.source('zero_expert_count').expr or '')}`)"
                   f" scored after the routed ones ({_md(spec.source('zero_expert_count').detail)}): the block takes "
                   "the top-k itself, hands FusedMoE the routed experts' slots (the others weight 0) and adds each "
                   "chosen identity expert's weight times the token's state; their gate/up tensors are not loaded.")
    if spec.sublayer_latent_scales:
        out.append(f"- the latent attention scales {' and '.join(spec.sublayer_latent_scales)} by "
                   f"(hidden_size / rank) ** 0.5 ({_md(spec.source('sublayer_latent_scales').detail)}): folded into "
                   "the latent norms' weights on load.")
    if spec.attn_sub_norm:
        out.append(f"- a norm over the whole attention output, `{spec.names['self_attn']}.{spec.names['attn_sub_norm']}`"
                   f", before `{spec.names['o_proj']}` ({_md(spec.source('attn_sub_norm').detail)}); its weight is "
                   "whole on every tensor-parallel rank, which gathers the heads' outputs to apply it "
                   "(`full_width_norm`).")
    if spec.qk_norm != "none":
        out.append(f"- q/k norm {'over each head' if spec.qk_norm == 'per_head' else 'over the whole projection (gathered across tensor-parallel ranks)'}"
                   + (", without parameters (`RMSNorm(has_weight=False)`)" if spec.qk_norm_weightless else "")
                   + (", only in the layers that rotate q and k" if spec.qk_norm_rope_layers_only else "") + ".")
    if spec.v_norm:
        out.append(f"- an RMS norm without a scale over each value head, `{spec.names['self_attn']}.{spec.v_norm}` "
                   f"({_md(spec.source('v_norm').detail)}).")
    if spec.kv_share_layers:
        pairs = ", ".join(f"{i} <- {j}" for i, j in zip(spec.kv_share_layers, spec.kv_share_sources))
        out.append(f"- layers that compute no keys or values and read an earlier layer's ({pairs}), served through "
                   f"vLLM's `kv_sharing_target_layer_name` ({_md(spec.source('kv_share_layers').detail)}).")
    if spec.k_eq_v_layers:
        out.append(f"- layers {', '.join(map(str, spec.k_eq_v_layers))} take the keys' projection as values: its "
                   f"rows are loaded into the k and the v shard ({_md(spec.source('k_eq_v_layers').detail)}).")
    out.append(f"- {_positions(spec)}.")
    if spec.attn_temperature_floor_scale is not None:
        out.append(f"- temperature tuning{' on the layers without rotary' if spec.attn_temperature_nope_only else ''}"
                   f": q scaled by log(floor((position + 1) / {spec.attn_temperature_floor_scale:g}) + 1) * "
                   f"{spec.attn_temperature_scale:g} + 1 ({_md(spec.source('attn_temperature_floor_scale').detail)}).")
    if spec.attention_chunk_size:
        chunk = spec.attention_chunk_size
        block = block_size_for(chunk)
        serve = ("" if chunk % 128 == 0
                 else f" Serve it with `--block-size {block}`: the default of 128 does not divide the chunk." if block
                 else " No block size of 32, 64 or 128 divides it, so vLLM's CPU build cannot serve this port.")
        out.append(f"- chunked attention: on layers {spec.chunked_layers} a query sees the keys of its own chunk of "
                   f"{chunk} positions (vLLM's `ChunkedLocalAttention`, whose chunk must be a multiple of the "
                   f"KV-cache block size).{serve}")
    if spec.sliding_window:
        out.append(f"- sliding window of {spec.sliding_window} tokens on layers {spec.sliding_window_layers}; "
                   "the other layers attend fully.")
    if spec.mlp_kind == "gated":
        where = ("gate and up are separate tensors, loaded as shards 0 and 1" if spec.gate_up_layout == "separate"
                 else "the checkpoint's gate_up_proj holds gate rows then up rows; load_weights cuts it into "
                      "shards 0 and 1" if spec.gate_up_order == "gate_first"
                 else "the checkpoint's gate_up_proj holds up rows then gate rows; load_weights cuts it and loads "
                      "the second half as shard 0 (gate), the first as shard 1 (up)")
        out.append(f"- MLP: gated, {where} of `{n['mlp']}.{n['gate_up_proj']}` (`MergedColumnParallelLinear`, "
                   + (f"each layer's own width, `{_md(spec.source('layer_intermediate_sizes').expr or '')}` "
                      f"({', '.join(map(str, spec.layer_intermediate_sizes))}) rows each"
                      if spec.layer_intermediate_sizes else f"{spec.intermediate_size} rows each")
                   + f"), activation `{_md(spec.hidden_act)}` "
                   + ("fused with the multiply."
                      if (gated_forms(spec.hidden_act) or ("and_mul",))[0] == "and_mul"
                      else "on the gate half, then the multiply (vLLM has no fused kernel for it; `get_act_fn`)."))
    else:
        out.append(f"- MLP: plain, `{n['mlp']}.{n['up_proj']}` (`ColumnParallelLinear`) then `{_md(spec.hidden_act)}` "
                   f"then `{n['mlp']}.{n['down_proj']}` (`RowParallelLinear`)"
                   + (f"; the numbered children of an nn.Sequential, the port's `{port_names(n)['up_proj']}` and "
                      f"`{port_names(n)['down_proj']}`, renamed on load." if n['up_proj'] != port_names(n)['up_proj']
                      else "."))
    if spec.act_tensors:
        out.append(f"- the activation holds tensors of its own, `{n['mlp']}.{n['act_fn']}.`"
                   f"{{{', '.join(spec.act_tensors)}}} ({_md(spec.source('act_tensors').detail)}): the port builds "
                   "vLLM's class for it in every layer (get_act_fn would share one) in the model's dtype, and loads "
                   "them, replicated on every rank.")
    if spec.mlp_sub_norm:
        out.append(f"- a norm over the activated width, `{n['mlp']}.{n['mlp_sub_norm']}`, before "
                   f"`{n['mlp']}.{n['down_proj']}` ({_md(spec.source('mlp_sub_norm').detail)}); its weight is whole "
                   "on every tensor-parallel rank, which gathers the MLP's columns to apply it (`full_width_norm`).")
    if spec.gate_extra_bias:
        out.append(f"- `mlp.{spec.gate_extra_bias}` is added to the gate half of gate_up_proj's output before the "
                   f"activation ({_md(spec.source('gate_extra_bias').detail)}); it is sharded like the gate rows.")
    norm = {"rms": "RMSNorm", "layer": "LayerNorm"}[spec.norm_kind]
    if spec.norm_kind == "rms" and spec.norm_offset:
        norm = "GemmaRMSNorm (scales by 1 + weight)"
    elif spec.norm_kind == "layer":
        norm += " with bias" if spec.norm_bias else " without bias"
    if spec.norm_weightless:
        norm = {"rms": "RMSNorm", "layer": "LayerNorm"}[spec.norm_kind] + " without parameters (no scale, no bias)"
    if spec.embedding_norm and "embed_norm" in n:
        norm += f"; `{n['embed_norm']}`, a norm of its own, normalizes the embeddings before the first layer"
    elif spec.embedding_norm:
        norm += f"; the final norm `{n['norm']}` also normalizes the embeddings before the first layer"
    if spec.unnormed_attn_layers:
        norm += (f"; no `{n['attn_norm']}` in layers {spec.unnormed_attn_layers} (an identity there: "
                 f"{_md(spec.source('unnormed_attn_layers').detail)})")
    block = {"pre_norm": "norm before attention and before the MLP",
             "sandwich": "norms before and after both attention and the MLP",
             "post_norm": "norm after attention and after the MLP, before each residual add",
             "residual_norm": "post-LN: a norm on each residual sum, whose output is the next residual",
             "parallel": "attention and MLP both read the layer input and add to it"
                         + ("" if "mlp_norm" in n else ", through one shared norm")}[spec.block]
    out.append(f"- block: {spec.block} ({block}); norms are {norm}.")
    if spec.per_layer_input_size:
        n = spec.names
        out.append(f"- per-layer input embeddings: ({n['per_layer_input_model_norm']}({n['per_layer_input_model_proj']}"
                   f"(h) x {spec.per_layer_input_model_scale:.6g}) + {n['per_layer_input_table']}(ids) x "
                   f"{spec.per_layer_input_table_scale:.6g}) x {spec.per_layer_input_scale:.6g}, "
                   f"{spec.per_layer_input_size} wide per layer; each layer adds {n['per_layer_input_norm']}("
                   f"{n['per_layer_input_proj']}({spec.per_layer_input_act}({n['per_layer_input_gate']}(h)) x its "
                   f"slice)) to its output ({_md(spec.source('per_layer_input_size').detail)}).")
    if spec.hyper_streams:
        mixers = " and ".join(f"`{m}`" for m in spec.hyper_mixers)
        comb = (f", the streams mixed by a softmax matrix made doubly stochastic by {spec.hyper_sinkhorn_iters} "
                f"Sinkhorn iterations (eps {spec.hyper_sinkhorn_eps:g})" if spec.hyper_sinkhorn_iters else
                ", the streams otherwise kept")
        out.append(f"- hyper-connections: the residual kept as {spec.hyper_streams} streams per token; {mixers} mix "
                   f"them into the attention's and the MLP's input (sigmoid + {spec.hyper_pre_eps:g}) and write "
                   f"each output back with {spec.hyper_post_scale:g} x sigmoid + {spec.hyper_post_eps:g}{comb}; "
                   f"`{spec.hyper_head}` collapses them before the final norm, all in float32 "
                   f"({_md(spec.source('hyper_streams').detail)}).")
    if spec.altup_num_inputs:
        a = spec.altup_module
        out.append(f"- alternating updates (AltUp): {spec.altup_num_inputs} copies of the residual stream, copies 1.. "
                   f"{spec.altup_projections}[i - 1](h0) rescaled to h0's root mean square (mean square floored at "
                   f"{spec.altup_eps:g}); each layer runs on copy {spec.altup_active_idx}, predicted by {a}."
                   f"{spec.altup_prediction} and corrected by {a}.{spec.altup_correction} (router {a}.{spec.altup_router}"
                   f" over {a}.{spec.altup_router_norm}), beside the low-rank branch {spec.laurel_module} (rank "
                   f"{spec.laurel_rank}); the copies merged after the layers as the mean of copy 0 and "
                   f"{spec.altup_unembed_projections}[i - 1](y_i) rescaled "
                   f"({_md(spec.source('altup_num_inputs').detail)}).")
    if spec.activation_sparsity:
        cut = [i for i, f in enumerate(spec.activation_sparsity) if f > 0]
        out.append(f"- activation sparsity: the gate projection's output cut at mean + std x icdf(f) before the "
                   f"activation in layers {cut} (f: {[spec.activation_sparsity[i] for i in cut]}), the statistics "
                   f"over the whole gate width ({_md(spec.source('activation_sparsity').detail)}).")
    scales = []
    if spec.embedding_multiplier is not None:
        scales.append(f"embeddings x {_md(spec.source('embedding_multiplier').expr or spec.embedding_multiplier)}")
    if spec.residual_multiplier is not None:
        scales.append(f"sublayer outputs x {spec.residual_multiplier:g} before the residual add")
    for role, name in (("attention", spec.residual_scale_attn), ("MLP", spec.residual_scale_mlp)):
        if name:
            scales.append(f"the residual x the layer's own `{name}` (one per channel) before the {role}'s output is "
                          "added")
    for name in (*spec.gated_norms, *spec.gated_norms_conditional):
        inner, gate, up, down = spec.gated_norm_parts
        where = (f"where `{spec.gated_norm_condition}` (layers {spec.gated_norm_layers})"
                 if name in spec.gated_norms_conditional else "in every layer")
        scales.append(f"`{name}` gated {where}: its `{inner}` output x {spec.gated_norm_acts[1]}("
                      f"`{down}`({spec.gated_norm_acts[0]}(`{up}`(y)))), the gate replicated on every rank "
                      f"({_md(spec.source('gated_norms').detail)})")
    if spec.layer_scalar:
        scales.append(f"each layer's output x its own `{spec.layer_scalar}` ({_md(spec.source('layer_scalar').detail)})")
    if spec.logits_scale is not None:
        scales.append(f"logits x {spec.logits_scale:g}")
    if spec.final_logit_softcap is not None:
        scales.append(f"logits soft-capped at {spec.final_logit_softcap:g}")
    if scales:
        out.append("- scaling: " + "; ".join(scales) + ".")
    tied = f"tied: {n['lm_head']} is {n['embed_tokens']}" if spec.tie_word_embeddings else "untied"
    out.append(f"- embeddings {tied}.")
    if spec.head_act is not None:
        out.append(f"- head transform: `{n['head_transform']}` computes `{n['head_norm']}`({spec.head_act}("
                   f"`{n['head_dense']}`(h))) before the head ({_md(spec.source('head_act').detail)}).")
    if spec.normalized_head:
        over = "columns (over the vocabulary)" if spec.normalized_head_columns else "rows"
        out.append(f"- normalized head: the {over} of `{n['lm_head']}` are L2-normalized once, in load_weights, as "
                   f"the modeling code normalizes them before its matmul ({_md(spec.source('normalized_head').detail)}).")
    return out


def _positions(spec) -> str:
    """How the port encodes positions, in words."""
    where = _md(spec.source("position_scheme"))
    if spec.position_scheme == "alibi":
        return (f"positions: ALiBi, no rotary embedding ({where}); each head adds its slope times the key "
                "distance to the attention scores, slopes computed per head and sliced per tensor-parallel rank")
    if spec.position_scheme == "none":
        return f"positions: none, no rotary embedding and no attention bias ({where})"
    at = f"position + {spec.position_offset}" if spec.position_offset else "the position"
    if spec.position_scheme == "learned":
        return (f"positions: a learned table `{spec.names.get('embed_positions')}`, its row at {at} added to the "
                f"token embedding; no rotary embedding ({where})")
    if spec.position_scheme == "sinusoidal":
        divisor = "hidden_size / 2" + (f" - {spec.sinusoid_shift}" if spec.sinusoid_shift else "")
        order = "sines and cosines interleaved" if spec.sinusoid_interleaved else "all sines, then all cosines"
        zeroed = (f", row `{_md(spec.source('sinusoid_padding_row').expr or spec.sinusoid_padding_row)}` zeroed"
                  if spec.source("sinusoid_padding_row").kind != "default" else "")
        return (f"positions: a table of sines and cosines the port builds at init (sin/cos of position x "
                f"{spec.sinusoid_base:g} ** (-j / ({divisor})), {order}{zeroed}), its row at {at} added to the token "
                f"embedding; no checkpoint tensor, no rotary embedding ({where})")
    rope = f"rotary embedding: {'NeoX' if spec.rope_neox_style else 'GPT-J (interleaved pairs)'} style"
    if spec.rope_reversed:
        rope += (" turning by -theta (rotate_half returns cat((x2, -x1))): q and k rows loaded with each head's "
                 "rotated halves swapped, so that NeoX rotary by +theta gives the same scores")
    if spec.partial_rotary_factor != 1.0:
        rope += f" over {spec.partial_rotary_factor:g} of each head"
    if spec.rope_frequency_order:
        rope += (f", its frequencies in the order the modeling code computes them ({spec.rope_frequency_order}: "
                 "column j turns at base ** (-2 * order[j] / d))")
    if spec.rope_table_float16:
        rope += ("; its cos/sin table rounded to float16 as the modeling code rounds it (`.half()`), q and k "
                 "rotated by the rounded values")
    if spec.rope_position_rows:
        rope += ("; config.json declares multimodal rotary sections, so vLLM hands the model a row of positions per "
                 "section: the text-only port builds them identical and rotates by the first")
    if spec.no_rope_layers:
        rope += f"; layers {spec.no_rope_layers} skip it"
    return rope


def review_markdown(analysis: Analysis) -> str:
    spec, ckpt = analysis.spec, analysis.ckpt
    out = [
        f"# Review: {spec.architecture} port",
        "",
        f"Generated by vllm-scaffold {__version__} from `{_md(ckpt.path)}`. Read this instead of the diff: it says what "
        "the generator understood, where each value came from, and what it could not decide.",
        "",
        "## Spec",
        "",
        "| field | value | source |",
        "| --- | --- | --- |",
    ]
    for name, value, source in spec_rows(analysis):
        out.append(f"| {name} | `{_md(value)}` | {_md(source)} |")
    out += [
        "",
        "## Decisions",
        "",
    ]
    out += decisions(spec)
    out += ["", "## Warnings", ""]
    out += [f"- {_md(w)}" for w in warnings(analysis)] or ["- none"]
    out += ["", "## Weights", "", "| checkpoint tensor | shape | vLLM parameter | shard |", "| --- | --- | --- | --- |"]
    out += weight_rows_markdown(analysis.rows)
    out += [""] + compliance_markdown(analysis)
    out += [""] + verify_section("Not verified yet: run `scaffold verify` on this folder.")
    return "\n".join(out)


def backend_review_markdown(p: BackendPlan, package: str, reason: str) -> str:
    """REVIEW.md of a package serving the checkpoint through vLLM's transformers backend."""
    arch = p.ckpt.config["architectures"][0]
    serve = " ".join(serve_command(p, "CKPT"))
    out = [
        f"# Review: {_md(arch)} through vLLM's transformers backend",
        "",
        (f"Generated by vllm-scaffold {__version__} from `{_md(p.ckpt.path)}`. No model code was written: vLLM "
         f"builds the model from {_md(p.compliance.origin)} and fuses it at load time."),
        "",
        "## Decision",
        "",
        f"- Why not a native port: {_md(reason)}",
        *[f"- **Known defect of this vLLM's backend**: {_md(d)}. `scaffold verify` measures it." for d in p.defects],
        f"- Launch: `{_md(serve)}` (or `LLM(model=CKPT, **{package}.engine_kwargs())`).",
        (f"- Recorded with: {_md(', '.join(f'{k} {v}' for k, v in sorted(p.versions.items())))}. Pin both; a bump "
         "of either can un-fuse a module silently, which `tests/test_fusions.py` catches."),
        "",
    ]
    out += render_markdown(p.compliance)
    out += ["## Checkpoint tensors against the backend's module tree", "",
            (f"Checked without an engine (the base model built from config.json on the `meta` device, each tensor "
             f"name mapped as vLLM's backend maps it): {_md(p.tensors.summary())}."), ""]
    out += verify_section("**Parity with transformers not checked**: no engine has run this package yet. Run "
                          "`scaffold verify` on this folder.")
    return "\n".join(out)


def verify_section(placeholder: str) -> list[str]:
    """The last section of every REVIEW.md: `scaffold verify` replaces what follows the marker with its report."""
    return ["## Verify results", "", VERIFY_MARKER, "", placeholder, ""]
