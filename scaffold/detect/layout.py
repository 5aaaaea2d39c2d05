"""Tensor layout: module names, which projections are fused, the block, the norms, biases, ties.

The tensors are the ground truth here; config flags such as attention_bias only
say what the author meant. Where the tensors cannot tell two computations apart
(a fused q/k/v tensor stored per head or per projection, an RMSNorm from a
LayerNorm without bias, a norm that scales by 1 + w), the modeling source is
read as text: the checkpoint's own code, else transformers' modeling file.
"""

from __future__ import annotations

import re

from scaffold.checkpoint import Checkpoint
from scaffold.detect import moe
from scaffold.detect.common import BACKEND_HINT
from scaffold.detect.common import unsupported as _unsupported
from scaffold.detect.sourcecode import added_to_call, interleaved_qkv, modeling_sources, norm_code
from scaffold.errors import CheckpointError, UnsupportedArchitecture
from scaffold.spec import Source, Spec, Undetermined, Unknown

# Tensor names that mean an architecture this generator cannot express.
UNSUPPORTED_MARKERS = (
    (re.compile(r"\.(mamba|ssm|mixer)\.|\.A_log$|\.dt_bias$|\.conv1d\."), "state-space (Mamba-style) blocks"),
    (re.compile(r"\.linear_attn\.|\.(recurrent|rwkv|time_mix)\w*\."), "linear or recurrent attention"),
)

LAYER = re.compile(r"([A-Za-z_]\w*)\.layers\.(\d+)\.(.+)\Z")

# Module names a role goes by in the checkpoints the generator knows (first match wins).
CANDIDATES = {
    "self_attn": ("self_attn", "attention"),
    "qkv_proj": ("qkv_proj", "query_key_value"),
    "o_proj": ("o_proj", "dense"),
    "mlp": ("mlp",),
    "plain_up": ("c_fc", "dense_h_to_4h", "up_proj"),
    "down_proj": ("down_proj", "c_proj", "dense_4h_to_h"),
}
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")




def detect(ckpt: Checkpoint, spec: Spec) -> None:
    where = ckpt.config_file
    for pattern, feature in UNSUPPORTED_MARKERS:
        hits = sorted(n for n in ckpt.tensors if pattern.search(n))
        if hits:
            raise UnsupportedArchitecture(
                f"the checkpoint uses {feature} (e.g. tensor {hits[0]!r}), which the generator cannot express "
                "yet.",
                where,
                hint=BACKEND_HINT,
            )
    names: dict[str, str] = {}
    matches = {n: m for n in ckpt.tensors if (m := LAYER.match(n))}  # the tensors inside decoder layers
    prefixes = sorted({m.group(1) for m in matches.values()})
    if len(prefixes) != 1:
        sample = ", ".join(sorted(ckpt.tensors)[:4])
        raise Undetermined(*(Unknown(
            f"names.{role}",
            "the tensors do not follow a decoder layout the generator knows (PREFIX.layers.N....); "
            f"found {'layer lists under ' + ', '.join(prefixes) if prefixes else 'no layer list'}, e.g. {sample}",
            tuple((f"{p}.layers", "one of several layer lists") for p in prefixes)
            or (("PREFIX.layers.N", "no tensor matches"),),
        ) for role in ("model", "layers")))
    prefix = names["model"] = prefixes[0]
    names["layers"] = "layers"
    layer_ids = {int(m.group(2)) for m in matches.values()}
    # Layers 0..num_layers-1, each present, compared without building that range (the count is untrusted).
    if len(layer_ids) != spec.num_layers or min(layer_ids) != 0 or max(layer_ids) != spec.num_layers - 1:
        raise CheckpointError(
            f"config.json says {spec.num_layers} layers but the tensors hold layers "
            f"{min(layer_ids)}..{max(layer_ids)} ({len(layer_ids)} of them).",
            where,
        )

    # Top level: the embedding and final norm under the prefix, the head beside it.
    vocab, hidden = spec.vocab_size, spec.hidden_size
    top = {n: info for n, info in ckpt.tensors.items() if n not in matches}
    inside = {n[len(prefix) + 1:]: i for n, i in top.items() if n.startswith(prefix + ".") and n.count(".") == 2}
    embeds = sorted(n.rsplit(".", 1)[0] for n, i in inside.items() if n.endswith(".weight") and len(i.shape) == 2)
    norms = sorted(n.rsplit(".", 1)[0] for n, i in inside.items() if n.endswith(".weight") and i.shape == (hidden,))
    heads = sorted(n.rsplit(".", 1)[0] for n, i in top.items()
                   if n.count(".") == 1 and n.endswith(".weight") and len(i.shape) == 2)
    if len(embeds) != 1:
        raise Undetermined(Unknown("names.embed_tokens", f"expected one embedding matrix directly under {prefix!r}, "
                                   f"found {embeds or 'none'}", tuple((e, "one of several") for e in embeds)))
    if len(norms) != 1:
        raise Undetermined(Unknown("names.norm", f"expected one final norm directly under {prefix!r}, found "
                                   f"{norms or 'none'}", tuple((n, "one of several") for n in norms)))
    if len(heads) > 1:
        raise Undetermined(Unknown("names.lm_head", f"expected at most one output head beside {prefix!r}, found "
                                   f"{heads}", tuple((h, "one of several") for h in heads)))
    names["embed_tokens"], names["norm"] = embeds[0], norms[0]
    names["lm_head"] = heads[0] if heads else "lm_head"
    embed_name, head_name = f"{prefix}.{embeds[0]}.weight", f"{names['lm_head']}.weight"

    # Layer 0: which module plays which role.
    per_layer: dict[int, dict] = {i: {} for i in layer_ids}
    for n, m in matches.items():
        per_layer[int(m.group(2))][m.group(3)] = ckpt.tensors[n]
    layer0 = per_layer[0]

    def has(rest: str, tensors: dict = layer0) -> bool:
        return rest in tensors

    def src(rest: str, layer: int = 0) -> Source:
        return Source("tensor", f"{prefix}.layers.{layer}.{rest}")

    def first(role: str, inside_of: str = "", tensors: dict = layer0) -> str | None:
        for cand in CANDIDATES[role]:
            path = f"{inside_of}.{cand}" if inside_of else cand
            if has(f"{path}.weight", tensors) or any(r.startswith(path + ".") for r in tensors):
                return cand
        return None

    attn = first("self_attn")
    if attn is None:
        raise Undetermined(Unknown("names.self_attn", "layer 0 has no attention module the generator knows",
                                   tuple((c, "no tensor of layer 0 under it") for c in CANDIDATES["self_attn"])))
    names["self_attn"] = attn
    sources = modeling_sources(ckpt)
    if all(has(f"{attn}.{p}.weight") for p in ("q_proj", "k_proj", "v_proj")):
        names.update(q_proj="q_proj", k_proj="k_proj", v_proj="v_proj", qkv_proj="qkv_proj")
        spec.set("qkv_layout", "separate", src(f"{attn}.q_proj.weight"))
        qkv_bias = has(f"{attn}.q_proj.bias")
        spec.set("qkv_bias", qkv_bias, src(f"{attn}.q_proj.bias"))
    elif (fused := first("qkv_proj", attn)) is not None:
        names["qkv_proj"] = fused
        found = interleaved_qkv(sources, fused)
        if found is not None:
            spec.set("qkv_layout", "interleaved",
                     Source("code", f"{found}: {fused} output viewed as [heads, 3 * head_size]"))
            _one_kv_head_per_head(ckpt, spec, f"{prefix}.layers.0.{attn}.{fused}.weight")
        else:
            detail = "q, k, v rows one after another" + (
                "" if sources else " (no modeling source to say otherwise)")
            spec.set("qkv_layout", "fused", Source("tensor", f"{prefix}.layers.0.{attn}.{fused}.weight: {detail}"))
        spec.set("qkv_bias", has(f"{attn}.{fused}.bias"), src(f"{attn}.{fused}.bias"))
    else:
        raise Undetermined(Unknown("qkv_layout", f"layer 0's {attn} has no q_proj/k_proj/v_proj and no fused q/k/v "
                                   "weight", (("q_proj, k_proj, v_proj", "not all present"),
                                              *((c, "absent") for c in CANDIDATES["qkv_proj"]))))
    o_proj = first("o_proj", attn)
    if o_proj is None:
        raise Undetermined(Unknown("names.o_proj", f"layer 0's {attn} has no output projection the generator knows",
                                   tuple((c, "absent") for c in CANDIDATES["o_proj"])))
    names["o_proj"] = o_proj
    spec.set("o_bias", has(f"{attn}.{o_proj}.bias"), src(f"{attn}.{o_proj}.bias"))
    if has(f"{attn}.q_norm.weight"):
        info = layer0[f"{attn}.q_norm.weight"]
        if len(info.shape) != 1 or not has(f"{attn}.k_norm.weight"):
            raise _unsupported(f"q/k norm weights of shape {list(info.shape)} (one norm per head)", where,
                               spec.model_type)
        kind = "per_head" if info.shape[0] == spec.head_dim else "full"
        names.update(q_norm="q_norm", k_norm="k_norm")
        spec.set("qk_norm", kind, Source("tensor", f"{prefix}.layers.0.{attn}.q_norm.weight has {info.shape[0]} rows"))
    else:
        spec.set("qk_norm", "none", src(f"{attn}.q_norm.weight (absent)"))

    # The MLP: dense in layer 0, or a mixture of experts whose dense parts (the MLP of
    # the layers without experts, or the shared expert) are read like a dense MLP.
    expert_modules = moe.find_layout(ckpt, spec, names, prefix, per_layer)
    ref, ref_layer, ref_name = layer0, 0, "layer 0"
    if expert_modules is not None:
        sparse = min(set(per_layer) - set(spec.dense_layers))
        if spec.dense_layers:
            ref_layer = spec.dense_layers[0]
            ref, ref_name = per_layer[ref_layer], f"layer {ref_layer}"
        elif "shared_expert" in names:
            ref, ref_layer = moe.shared_expert_tensors(per_layer[sparse], names), sparse
            ref_name = f"layer {sparse}'s shared expert"
        else:
            ref = None
    mlp = names["mlp"] if expert_modules is not None else first("mlp")
    if mlp is None:
        raise Undetermined(Unknown("names.mlp", "layer 0 has no MLP module the generator knows",
                                   tuple((c, "absent") for c in CANDIDATES["mlp"])))
    names["mlp"] = mlp
    extra = []
    if ref is None:
        # Experts only: the dense roles keep their conventional names and are not used.
        names.update(gate_proj="gate_proj", up_proj="up_proj", gate_up_proj="gate_up_proj", down_proj="down_proj")
        spec.set("mlp_kind", "gated", Source("tensor", f"{prefix}.layers.{sparse}.{mlp}.experts: gated experts"))
        spec.set("gate_up_layout", "separate", Source("default", "no dense MLP"))
        spec.set("mlp_bias", False, Source("default", "no dense MLP"))
    else:
        _dense_mlp(spec, names, mlp, ref, ref_layer, ref_name, first, src, where)
        # A 1-D tensor on the MLP besides the projections: an extra bias the code adds somewhere.
        extra = sorted(rest.split(".", 1)[1] for rest in ref if rest.startswith(mlp + ".") and rest.count(".") == 1)
    for name in extra:
        found = added_to_call(ckpt, names.get("gate_proj", "gate_proj"), name)
        if found is None:
            raise UnsupportedArchitecture(
                f"tensor {prefix}.layers.0.{mlp}.{name} has no home in the port: the modeling source does not "
                "show it added to gate_proj's output, and the generator does not know where else it would go.",
                where,
            )
        spec.set("gate_extra_bias", name, Source("code", f"{found}: added to gate_proj(x)"))

    _norms_and_block(ckpt, spec, names, layer0, sources, inside)

    # Whatever a layer holds that no role claimed would be dropped: refuse instead.
    claimed = {f"{attn}.{names[r]}" for r in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")
               if r in names}
    claimed.add(f"{attn}.{names['qkv_proj']}")
    claimed |= {names[r] for r in ("attn_norm", "attn_post_norm", "mlp_norm", "mlp_post_norm") if r in names}
    dense = {f"{mlp}.{names[r]}" for r in ("gate_proj", "up_proj", "gate_up_proj", "down_proj") if r in names}
    dense |= {f"{mlp}.{e}" for e in extra}
    sparse_layers = sorted(set(per_layer) - set(spec.dense_layers)) if expert_modules is not None else []
    checked = {0: claimed | (expert_modules if 0 in sparse_layers else dense)}
    for layer in sparse_layers[:1] + spec.dense_layers[:1]:
        checked[layer] = claimed | (expert_modules if layer in sparse_layers else dense)
    for layer, mine in checked.items():
        stray = sorted(r for r in per_layer[layer] if r.rsplit(".", 1)[0] not in mine and r not in mine
                       and "rotary_emb." not in r)
        if stray:
            raise _unsupported(f"layer {layer} holds tensor(s) that no part of the port computes with "
                               f"({', '.join(f'{prefix}.layers.{layer}.{s}' for s in stray[:3])})", where,
                               spec.model_type)
    spec.set("names", names, Source("tensor", "module names of the embedding, layer 0 and the head"))

    key = "tie_word_embeddings"
    configured = ckpt.config.get(key)
    head = head_name in ckpt.tensors
    if not head:
        if configured is False:
            raise CheckpointError(
                f"config.json says tie_word_embeddings is false but the checkpoint has no {head_name}: "
                "the output head would have no weights.",
                where,
            )
        spec.set("tie_word_embeddings", True, Source("tensor", f"no {head_name}: the head is the embedding"))
    else:
        spec.set("tie_word_embeddings", bool(configured),
                 Source("config", f"config.json {key}" if configured is not None else f"{head_name} present"))
    spec.set("lm_head_bias", f"{names['lm_head']}.bias" in ckpt.tensors, Source("tensor", f"{names['lm_head']}.bias"))

    embed_rows = ckpt.tensors[embed_name].shape[0]
    said = f"vocab_size {vocab} ({spec.source('vocab_size')})"  # from config.json, or from the user's spec file
    if embed_rows != vocab:
        raise CheckpointError(f"{said} but {embed_name} has {embed_rows} rows.", where)
    if head and ckpt.tensors[head_name].shape[0] != vocab:
        raise CheckpointError(f"{said} but {head_name} has {ckpt.tensors[head_name].shape[0]} rows.", where)


def _dense_mlp(spec: Spec, names: dict, mlp: str, ref: dict, layer: int, ref_name: str, first, src,
               where) -> None:
    """The dense MLP's kind, layout, names and biases, read from the tensors `ref` of one layer."""
    prefix = names["model"]

    def has(rest: str) -> bool:
        return rest in ref

    down = first("down_proj", mlp, ref)
    if has(f"{mlp}.gate_proj.weight") and has(f"{mlp}.up_proj.weight"):
        names.update(gate_proj="gate_proj", up_proj="up_proj", gate_up_proj="gate_up_proj")
        spec.set("mlp_kind", "gated", src(f"{mlp}.gate_proj.weight", layer))
        spec.set("gate_up_layout", "separate", src(f"{mlp}.gate_proj.weight", layer))
        up = "gate_proj"
    elif has(f"{mlp}.gate_up_proj.weight"):
        names["gate_up_proj"] = "gate_up_proj"
        spec.set("mlp_kind", "gated", src(f"{mlp}.gate_up_proj.weight", layer))
        spec.set("gate_up_layout", "fused", Source("tensor", f"{prefix}.layers.{layer}.{mlp}.gate_up_proj.weight: "
                                                             "gate rows, then up rows"))
        up = "gate_up_proj"
    elif (up := first("plain_up", mlp, ref)) is not None and down is not None:
        names["up_proj"] = up
        spec.set("mlp_kind", "plain", Source("tensor", f"{prefix}.layers.{layer}.{mlp}.{up}.weight without a gate"))
        spec.set("gate_up_layout", "separate", Source("default", "no gate"))
    else:
        raise Undetermined(Unknown("mlp_kind", f"{ref_name}'s {mlp} is neither a gated MLP (gate_proj, up_proj, "
                                   "down_proj) nor a plain one (an up projection and a down projection)",
                                   (("gated", "no gate_proj and up_proj, no gate_up_proj"),
                                    ("plain", "no up projection among " + ", ".join(CANDIDATES["plain_up"])
                                     + " with a down projection"))))
    if down is None:
        raise Undetermined(Unknown("names.down_proj", f"{ref_name}'s {mlp} has no down projection the generator "
                                   "knows", tuple((c, "absent") for c in CANDIDATES["down_proj"])))
    names["down_proj"] = down
    spec.set("mlp_bias", has(f"{mlp}.{up}.bias") or has(f"{mlp}.{down}.bias"), src(f"{mlp}.{down}.bias", layer))
    if "shared_expert" in names and spec.mlp_kind != "gated":
        raise UnsupportedArchitecture(f"{ref_name}'s {mlp} is not a gated MLP; the generator's mixture-of-experts "
                                      "layers are gated.", where)


def _one_kv_head_per_head(ckpt: Checkpoint, spec: Spec, tensor: str) -> None:
    """Per-head interleaved q/k/v has as many KV heads as query heads, whatever the config says."""
    rows = ckpt.tensors[tensor].shape[0]
    if rows != 3 * spec.num_heads * spec.head_dim:
        raise CheckpointError(f"tensor {tensor} has {rows} rows; per-head q/k/v over {spec.num_heads} heads of "
                              f"size {spec.head_dim} needs {3 * spec.num_heads * spec.head_dim}.", ckpt.config_file)
    spec.set("num_kv_heads", spec.num_heads, Source("tensor", f"{tensor}: q, k and v rows for every head",
                                                    spec.source("num_heads").expr))


def _norms_and_block(ckpt: Checkpoint, spec: Spec, names: dict, layer0: dict, sources: dict, inside: dict) -> None:
    where = ckpt.config_file
    have = {n for n in NORMS if f"{n}.weight" in layer0}
    parallel = ckpt.config.get("use_parallel_residual")
    if have == set(NORMS):
        block, detail = "sandwich", "norms before and after both attention and MLP"
        names.update(attn_norm="input_layernorm", attn_post_norm="post_attention_layernorm",
                     mlp_norm="pre_feedforward_layernorm", mlp_post_norm="post_feedforward_layernorm")
    elif have == {"post_attention_layernorm", "post_feedforward_layernorm"}:
        block, detail = "post_norm", "norms after attention and after MLP, none before"
        names.update(attn_post_norm="post_attention_layernorm", mlp_post_norm="post_feedforward_layernorm")
    elif have == {"input_layernorm", "post_attention_layernorm"}:
        names.update(attn_norm="input_layernorm", mlp_norm="post_attention_layernorm")
        if parallel is True:
            block, detail = "parallel", "config.json use_parallel_residual: attention and MLP both read the input"
        else:
            block, detail = "pre_norm", "input_layernorm before attention, post_attention_layernorm before MLP"
    elif have == {"input_layernorm"}:
        names["attn_norm"] = "input_layernorm"
        block, detail = "parallel", "one norm per layer: attention and MLP both read its output"
    else:
        raise Undetermined(Unknown("block", f"layer 0 has the norms {sorted(have) or 'none'}, a block layout the "
                                   "generator does not know", tuple((n, "absent") for n in NORMS if n not in have)))
    if parallel is False and block == "parallel":
        raise _unsupported("config.json use_parallel_residual is false but each layer has one norm", where,
                           spec.model_type)
    spec.set("block", block, Source("tensor", detail))

    norm_attr = names.get("attn_norm") or names.get("attn_post_norm")
    code = norm_code(sources, norm_attr)
    has_bias = f"{norm_attr}.bias" in layer0
    if code is not None:
        kind = "layer" if code.centered else "rms"
        spec.set("norm_kind", kind, Source("code", f"{code.where}: {code.cls} "
                                                   f"{'subtracts the mean' if code.centered else 'is an RMS norm'}"))
        spec.set("norm_offset", code.weight_offset,
                 Source("code", f"{code.where}: {code.cls} scales by "
                                f"{'(1 + weight)' if code.weight_offset else 'weight'}"))
    else:
        spec.set("norm_kind", "layer" if has_bias else "rms",
                 Source("tensor", f"{norm_attr}.bias {'present' if has_bias else 'absent'} (no modeling source)"))
        spec.set("norm_offset", 0.0, Source("default", "norm output is x_normed * weight"))
    if has_bias and spec.norm_kind == "rms":
        raise _unsupported(f"{norm_attr} has a bias but its code is an RMS norm", where, spec.model_type)
    spec.set("norm_bias", has_bias, Source("tensor", f"{names['model']}.layers.0.{norm_attr}.bias"))
    final_bias = f"{names['norm']}.bias" in inside
    if final_bias != has_bias:
        raise _unsupported("the final norm and the layer norms differ in having a bias", where, spec.model_type)
