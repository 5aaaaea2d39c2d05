"""What the native model template is given besides the spec: its choices and its imports, made in Python.

templates/package/__package__/model.py.j2 and its partials (the _parts/ folder beside it) read
as the Python they generate. The decisions behind them are made here, once each: which optional
pieces a port carries (`choices`), which names it imports (`imports`), how a norm layer is built
(`norm_constructor`), and the data some class attributes list (`packed_modules`,
`logits_processor_arguments`). A template tests a flag; it does not derive one.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass

from scaffold.detect.activations import vllm_activation_call
from scaffold.errors import SpecError
from scaffold.mapping import EXPERT_PARAMS
from scaffold.purecode import BUILTINS
from scaffold.spec import (
    ATTENTION_ROLES,
    CODE_LONGROPE,
    COMPUTED_ROPE_BASE,
    MLP_ROLES,
    THETA_UNREAD,
    Spec,
    on_layer_roles,
    port_names,
)

# The one-line form of an import longer than this is written one name a line, as ruff's isort
# wraps it (ruff format then keeps the exploded form: the trailing comma is magic).
IMPORT_LINE_LENGTH = 88


@dataclass(frozen=True)
class Import:
    """`import module`, or `from module import names`."""

    module: str
    names: tuple[str, ...] = ()
    # One name a line: for lists that differ between ports, so that a diff of two ports reads one
    # name per changed line (also what a line longer than IMPORT_LINE_LENGTH becomes).
    one_per_line: bool = False

    @property
    def text(self) -> str:
        if not self.names:
            return f"import {self.module}"
        one_line = f"from {self.module} import {', '.join(self.names)}"
        if not self.one_per_line and len(one_line) <= IMPORT_LINE_LENGTH:
            return one_line
        return "\n".join([f"from {self.module} import (", *(f"    {name}," for name in self.names), ")"])


def helper_names(spec: Spec) -> frozenset[str]:
    """The names of the code's arithmetic helpers the port carries (spec code_helpers)."""
    return frozenset(ast.parse(text).body[0].name for text in spec.code_helpers)


def _reads_config_and_layer(expr: str, helpers: frozenset[str] = frozenset()) -> bool:
    """Whether the code's expression reads the config and the layer's index alone (names `config`, `layer_idx`),
    calling at most the arithmetic builtins and the helpers the port carries, so that the port's decoder layer may
    evaluate it as written."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return False
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in callees}
    # Calls of the arithmetic builtins only (a helper of the code written out: OpenELM's make_divisible).
    calls_ok = all(isinstance(n.func, ast.Name) and (n.func.id in BUILTINS and not n.keywords or n.func.id in helpers)
                   for n in ast.walk(tree) if isinstance(n, ast.Call))
    return names <= {"config", "layer_idx"} and calls_ok and not any(
        isinstance(n, (ast.Lambda, ast.NamedExpr)) for n in ast.walk(tree))


def rotated_dims(spec: Spec) -> str | None:
    """The config key holding how many head dims rotate (GPT-J's `config.rotary_dim`), read by the port at run
    time, when the code says the model rotates part of the head that way."""
    source = spec.source("partial_rotary_factor")
    return source.expr if source.kind == "code" and source.expr.startswith("config.") else None


# How the port computes each activation a gate on the attention output may apply (spec.GATE_ACTIVATIONS): torch's
# own functions, the ones transformers' modeling code calls by these names.
GATE_FUNCTIONS = {"sigmoid": "torch.sigmoid", "softplus": "nn.functional.softplus", "silu": "nn.functional.silu",
                  "tanh": "torch.tanh", "relu": "torch.relu"}


def choices(spec: Spec, overridden: set[str]) -> dict[str, object]:
    """The flags the model template and its partials test, each derived once from the spec.

    A spec override of a value the config decides (`overridden`) is written into the port as
    a literal, as render's cfg() does, instead of read from the config at run time.
    """
    gated = spec.mlp_kind == "gated"
    moe = spec.is_moe
    shared = moe and "shared_expert" in spec.names
    mlp_class = spec.has_dense_mlp or shared
    # The port reads config.tie_word_embeddings at run time where config.json holds it or transformers' config class
    # defines it; a config class of the port's own (a model type transformers does not know) where config.json lacks
    # the key may not define the attribute at all (transformers 5's PretrainedConfig no longer does: Falcon's original
    # RWConfig), so there the port keeps the value the tensors gave (no lm_head, or one of its own).
    literal_tie = "tie_word_embeddings" in overridden or (
        spec.register_config and spec.source("tie_word_embeddings").detail != "config.json tie_word_embeddings")
    literal_layers = "sliding_window_layers" in overridden
    # The code's own condition for a sliding-window layer (over config and layer_idx), read by the port at run time
    # (GPT-Neo's `config.attention_layers[layer_idx] == 'local'`).
    window_condition = (spec.source("sliding_window_layers").expr
                        if spec.sliding_window and spec.source("sliding_window_layers").kind == "code"
                        and not literal_layers else None)
    literal_no_rope = "no_rope_layers" in overridden
    literal_chunks = "chunked_layers" in overridden
    # The code's own condition for the layers whose attention holds an output bias parameter (GPT-NeoX-Japanese's
    # `layer_idx == config.num_hidden_layers - 1`), else the listed layers.
    o_bias_condition = (spec.source("o_bias_layers").expr
                        if spec.o_bias_param and spec.source("o_bias_layers").kind == "code"
                        and "o_bias_layers" not in overridden else None)
    # KV heads of each layer's own: the code's expression over config and layer_idx (MiMo-V2's), else the listed
    # counts.
    kv_source = spec.source("layer_num_kv_heads")
    kv_heads_expr = ((kv_source.expr if kv_source.kind == "code" and kv_source.expr
                      and "layer_num_kv_heads" not in overridden else f"{spec.layer_num_kv_heads!r}[layer_idx]")
                     if spec.layer_num_kv_heads else None)
    # Each layer's MLP width (Gemma-3n's config.intermediate_size[layer_idx], Gemma 4's double-wide MLP computed from
    # intermediate_size and the layer's index): the code's expression over config and layer_idx, else the list.
    width_source = spec.source("layer_intermediate_sizes")
    mlp_width_expr = ((width_source.expr if width_source.kind == "code" and width_source.expr
                       and _reads_config_and_layer(width_source.expr, helper_names(spec))
                       and "layer_intermediate_sizes" not in overridden
                       else f"{list(spec.layer_intermediate_sizes)!r}[layer_idx]")
                      if spec.layer_intermediate_sizes else None)
    # Each layer's gate cutoff fraction (Gemma-3n's config.activation_sparsity_pattern[layer_idx]): the code's
    # expression, else the list.
    sparsity_source = spec.source("activation_sparsity")
    sparsity_expr = ((sparsity_source.expr if sparsity_source.kind == "code" and sparsity_source.expr
                      and re.fullmatch(r"config\.[A-Za-z]\w*\[layer_idx\]", sparsity_source.expr)
                      and "activation_sparsity" not in overridden
                      else f"{list(spec.activation_sparsity)!r}[layer_idx]")
                     if spec.activation_sparsity else None)
    # The code's own condition for the layers whose attention holds the sinks (MiMo-V2's sliding layers), else the
    # listed layers; None where every layer holds them.
    sinks_source = spec.source("attention_sinks_layers")
    sinks_condition = ((sinks_source.expr if sinks_source.kind == "code" and sinks_source.expr
                        and "attention_sinks_layers" not in overridden
                        else f"layer_idx in {spec.attention_sinks_layers!r}")
                       if spec.attention_sinks and spec.attention_sinks_layers else None)
    literal_rope = (bool({"rope_parameters", "partial_rotary_factor", "sliding_rope_parameters"} & overridden)
                    or spec.source("partial_rotary_factor").kind == "tensor"
                    or spec.source("rope_parameters").detail.endswith(COMPUTED_ROPE_BASE)
                    or THETA_UNREAD in spec.source("rope_parameters").detail)
    # LongRoPE factors the modeling code applies at every position (scaffold.detect.longrope): written out, since
    # vLLM would choose between the config's two sets by max_model_len.
    code_rope = not literal_rope and CODE_LONGROPE in spec.source("rope_parameters").detail
    per_type_rope = "rope_parameters.full_attention" in spec.source("rope_parameters").detail and not literal_rope
    return {
        "P": spec.class_prefix,
        "N": spec.names,
        # The port's module names: the checkpoint's, but a nested top-level module keeps only its last component.
        "A": port_names(spec.names),
        # The checkpoint's names of the projections it keeps on the decoder layer, outside the port's attention or MLP
        # module (OPT's fc1, fc2; OLMo v1's att_proj, attn_out, ff_proj, ff_out).
        "on_layer_attn": tuple(spec.names[r] for r in on_layer_roles(spec) if r in ATTENTION_ROLES and r in spec.names),
        "on_layer_mlp": tuple(spec.names[r] for r in on_layer_roles(spec) if r in MLP_ROLES and r in spec.names),
        "gated": gated,
        "moe": moe,
        # The activation vLLM's FusedMoE computes for the experts beside the dense MLP (its names for the tanh GELU).
        # FusedMoE's parameters of every expert's gate-and-up and down (scaffold.mapping.EXPERT_PARAMS).
        "parallel_moe_params": (EXPERT_PARAMS["w1"], EXPERT_PARAMS["w2"]),
        # The routed experts' activation where it is not FusedMoE's default silu (Grok-1's GELU experts).
        "moe_gated_activation": ({"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}.get(
            spec.hidden_act, spec.hidden_act) if moe and spec.expert_activation == "act_and_mul"
            and spec.hidden_act != "silu" else None),
        "parallel_moe_activation": {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}.get(
            spec.parallel_moe_activation, spec.parallel_moe_activation),
        # Experts stored as one 3-D tensor per projection: load_weights cuts them per expert.
        "stacked_experts": moe and spec.experts_layout in ("stacked", "flattened"),
        "stacked_projections": (stacked_projections(spec) if moe and spec.experts_layout in ("stacked", "flattened")
                                else {}),
        "flat_experts": moe and spec.experts_layout == "flattened",
        # The expert count read from a sub-config (DBRX's ffn_config.moe_num_experts): vLLM finds none.
        "experts_in_sub_config": moe and (spec.source("num_experts").expr or "").count(".") > 1,
        "flat_in_out": tuple(spec.names[r] for r in spec.flat_in_out) if moe else (),
        # The float tensors of a checkpoint named otherwise than .weight or .bias: its generated tests take no
        # tensor with one of these suffixes for a quantization method's (qweight, scales, ...).
        "float_suffixes": float_suffixes(spec, moe),
        # Each layer's own head width and KV heads: the config's per_layer_config as the code reads it, or the
        # spec's lists where a --spec file set them.
        "layer_head_dim": _layer_read(spec, "layer_head_dim"),
        "shared": shared,
        "dense_mlp": spec.has_dense_mlp,
        # The port has a {P}MLP class: dense layers, or a MoE block's shared expert.
        "mlp_class": mlp_class,
        "interfaces": (("SupportsQuant",) if spec.recurrent_stacks else interfaces(moe, spec.rope_position_rows)),
        # Stacks run in cycles (HRM's): the recurrent_model partial in place of base_model.
        "recurrent": bool(spec.recurrent_stacks),
        "stack_layers": [f"{spec.names['model']}.{stack}.{spec.recurrent_layers}." for stack in spec.recurrent_stacks],
        "packed_modules": packed_modules(spec, gated and mlp_class),
        "rotary": spec.position_scheme == "rotary",
        # The rotary frequencies in the order the modeling code computes them (Cohere Compass's pre-rotated ones):
        # the port's FrequencyOrderRotaryEmbedding.
        "frequency_order": spec.position_scheme == "rotary" and bool(spec.rope_frequency_order),
        # Gated attention: the function the port applies to the gate projection's output.
        "gate_fn": GATE_FUNCTIONS[spec.attn_gate_act] if spec.attn_output_gate != "none" else None,
        # Differential attention (DiffLlama's): two Attention layers and the pairing of heads across ranks.
        "diff": bool(spec.diff_lambdas),
        # A bias per key from its values (Doge's): one more column of each head, the heads padded.
        "key_bias": bool(spec.key_bias_proj),
        # A parameter of the layer the residual is multiplied by before each sublayer's output is added (Doge's).
        "residual_attn": f" * self.{spec.residual_scale_attn}" if spec.residual_scale_attn else "",
        "residual_mlp": f" * self.{spec.residual_scale_mlp}" if spec.residual_scale_mlp else "",
        # Norms inside a sublayer (BitNet's): the port's full_width_norm gathers the TP slices they span.
        "sub_norm": spec.attn_sub_norm or spec.mlp_sub_norm,
        # An activation with tensors of its own: how the port builds it, one per layer (XIELU()).
        "act_call": activation_call(spec),
        # Multi-head latent attention (DeepSeek-V2's): vLLM's MultiHeadLatentAttentionWrapper, not Attention.
        "latent": spec.qkv_layout == "latent",
        # Its query computed by the port, not by vLLM's MLA wrapper: a query up-projection over more than the normed
        # low-rank query, or an output gate in its rows (A.X-K2's).
        "latent_own_query": spec.qkv_layout == "latent" and (spec.latent_query_input != "normed"
                                                             or spec.attn_output_gate == "in_query"
                                                             or bool(spec.latent_out_gate)
                                                             or spec.latent_sink_decompressed),
        # Latent attention with sinks (HY-V4's): each head's key and value decompressed, a plain Attention.
        "latent_decompressed": spec.qkv_layout == "latent" and spec.latent_sink_decompressed,
        "latent_out_gate_fn": GATE_FUNCTIONS[spec.latent_out_gate_act] if spec.latent_out_gate else None,
        "latent_gate": spec.qkv_layout == "latent" and spec.attn_output_gate == "in_query",
        "latent_query_words": {"normed": "the normed low-rank query",
                               "normed+unnormed": "the normed low-rank query and the unnormed one, concatenated",
                               "unnormed+normed": "the unnormed low-rank query and the normed one, concatenated",
                               }[spec.latent_query_input],
        # A mixture of attention heads (JetMoE's): the routed_attention partial.
        "routed": spec.qkv_layout == "routed",
        "alibi": spec.position_scheme == "alibi",
        # GPT-2 layouts: a learned absolute position table added to the token embedding.
        "learned": spec.position_scheme == "learned",
        # A table of sines and cosines the port computes (XGLM's, CTRL's), added to the token embedding.
        "sinusoidal": spec.position_scheme == "sinusoidal",
        # Sliding-window layers with rotary parameters of their own (Gemma 3).
        "local_rope": bool(spec.sliding_rope_parameters and spec.sliding_window),
        "literal_rope": literal_rope,
        "code_rope": code_rope,
        # No rotary parameters in config.json or the code (GPT-J's): the port falls back on those it assumed.
        "assumed_rope": not literal_rope and not code_rope and spec.source("rope_parameters").kind == "default",
        "rotated_dims": rotated_dims(spec) if "partial_rotary_factor" not in overridden else None,
        "literal_layers": literal_layers,
        "window_condition": window_condition,
        "o_bias_condition": o_bias_condition,
        "kv_heads_expr": kv_heads_expr,
        "mlp_width_expr": mlp_width_expr,
        "sparsity_expr": sparsity_expr,
        # Layers reading an earlier layer's keys and values (vLLM's kv_sharing_target_layer_name), by layer.
        "kv_share": dict(zip(spec.kv_share_layers, spec.kv_share_sources)),
        # The modules of such a layer's keys and values, which checkpoints may still hold (Gemma 4's do).
        "kv_share_unused": tuple(f"{spec.names['self_attn']}.{m}" for m in
                                 [spec.names[r] for r in ("k_proj", "v_proj", "k_norm") if r in spec.names]
                                 + ([spec.v_norm] if spec.v_norm else [])) if spec.kv_share_layers else (),
        "sinks_condition": sinks_condition,
        # Value heads of their own width (v_head_dim, with separate q, k, v): the port pads the heads for vLLM's
        # attention, which takes one head size.
        "own_value_dim": spec.qkv_layout != "latent" and spec.value_dim != spec.head_dim
                         or spec.qkv_layout == "latent" and spec.latent_sink_decompressed,
        "literal_no_rope": literal_no_rope,
        "literal_chunks": literal_chunks,
        # The code's own condition for a chunked layer (Llama 4's layer type), read by the port at run time.
        "chunk_condition": (spec.source("chunked_layers").expr
                            if spec.attention_chunk_size and not literal_chunks else None),
        # The code's own condition for rotating a layer (over config and layer_idx), read by the port at run time.
        "rope_condition": (spec.source("no_rope_layers").expr
                           if spec.source("no_rope_layers").kind == "code" and not literal_no_rope else None),
        "literal_tie": literal_tie,
        # Temperature tuning (Llama 4's): "True" in every layer, "not self.use_rope" on the NoPE layers only;
        # None where no layer of this config scales its queries.
        "temperature": (None if spec.attn_temperature_floor_scale is None
                        else "True" if not spec.attn_temperature_nope_only
                        else "not self.use_rope" if spec.no_rope_layers
                        or (spec.source("no_rope_layers").kind == "code" and not literal_no_rope) else None),
        # The q/k norms only in layers that rotate (Llama 4's), where some layer does not.
        "qk_norm_guarded": spec.qk_norm_rope_layers_only and bool(
            spec.no_rope_layers or (spec.source("no_rope_layers").kind == "code" and not literal_no_rope)),
        # The port picks this layer's rotary parameters from the config's set per layer type
        # (rope_parameters.full_attention, ...) at run time.
        "per_type_rope": per_type_rope,
        # A layer type whose rotary parameters are null (Cohere Compass's NoPE layers): its layers build their
        # unused rotary from another type's set.
        "rope_null_types": per_type_rope and "those layers take no rotary" in spec.source("rope_parameters").detail,
        # The port reads config.layer_types at run time (which layers slide, which rotary set).
        "reads_layer_types": (bool(spec.sliding_window) and not literal_layers and not window_condition)
                             or per_type_rope,
        # Any override the port writes as a literal (the constants partial says so once).
        "literals": literal_rope or literal_layers or literal_no_rope or literal_tie or literal_chunks,
        "theta_unread": THETA_UNREAD in spec.source("rope_parameters").detail
                        and not (literal_layers or literal_no_rope or literal_tie or literal_chunks),
        # MoE ports whose listed layers keep a dense MLP.
        "dense_layers": moe and bool(spec.dense_layers),
        # The decoder layer's own condition for a dense MLP (over config and layer_idx), read by the port at run
        # time (DeepSeek-V3's `layer_idx >= config.first_k_dense_replace`, negated); else the listed layers.
        "dense_condition": (spec.source("dense_layers").expr
                            if moe and spec.dense_layers and spec.source("dense_layers").kind == "code"
                            and "dense_layers" not in overridden else None),
        # Qwen2-MoE's shared expert is scaled by a sigmoid gate; DeepSeek-V3's form adds it ungated.
        "shared_gate": shared and "shared_expert_gate" in spec.names,
        **routing_choices(spec),
        "TIED": "TIE_WORD_EMBEDDINGS" if literal_tie else "config.tie_word_embeddings",
        # What each residual branch is scaled by before it is added (Granite's residual_multiplier).
        "scaled": " * self.residual_multiplier" if spec.residual_multiplier is not None else "",
        # vLLM's RMSNorm adds the residual inside the norm (norm(x, residual) -> x, residual).
        # A layer whose attention reads the residual stream without its norm (an identity there) has no fused
        # norm to add the residual in, nor one whose output is scaled after its residual adds (Gemma 4's
        # layer_scalar): such ports use the sequential forward.
        "fused_residual": (spec.norm_kind == "rms" and spec.block in ("pre_norm", "sandwich")
                           and not spec.unnormed_attn_layers and not spec.layer_scalar
                           and not spec.per_layer_input_size and not spec.hyper_streams
                           and not spec.residual_scale_attn and not spec.residual_scale_mlp),
        "layer_norm_1p": spec.norm_kind == "layer" and bool(spec.norm_offset),
        # Norms gated by a small MLP of their output (A.X-K2's): the gated_norm partial.
        "gated_norm": bool(spec.gated_norm_parts),
        # A checkpoint tensor that holds several shards of one parameter (split_fused cuts it).
        "split": spec.qkv_layout not in ("separate", "latent", "routed") or (gated and spec.gate_up_layout == "fused"),
        # ... cut by row counts (self.split_sizes) rather than by a per-head view.
        "sized": spec.qkv_layout == "fused" or (gated and spec.gate_up_layout == "fused"),
        # ... counts of each layer's own (OpenELM's heads and MLP widths): split_sizes(layer_idx).
        "sized_per_layer": (spec.qkv_layout == "fused" and bool(spec.layer_num_heads or spec.layer_num_kv_heads)
                            or gated and spec.gate_up_layout == "fused" and bool(spec.layer_intermediate_sizes)),
    }


def _layer_read(spec: Spec, field: str) -> str:
    """The port's expression for one layer's value of a per-layer list field (layer_head_dim, ...)."""
    values = getattr(spec, field)
    if not values:
        return ""
    source = spec.source(field)
    if source.kind != "override" and source.expr and source.expr.startswith("config.per_layer_config[layer_idx]."):
        return source.expr
    return f"{list(values)!r}[layer_idx]"


def float_suffixes(spec: Spec, moe: bool) -> tuple[str, ...]:
    """Name endings of the checkpoint's float tensors: weights and biases, and those kept under names of their own
    (norm scales named `scale`, a gate's extra bias, a router's correction bias, attention sinks, an activation's
    own tensors, experts stored 3-D; hash routing's integer table)."""
    out = [".weight", ".bias"]
    if spec.norm_weight_name != "weight":
        out.append(f".{spec.norm_weight_name}")
    if spec.gate_extra_bias:
        out.append(f".{spec.gate_extra_bias}")
    if spec.layer_scalar:
        out.append(f".{spec.layer_scalar}")
    if moe and spec.moe_correction_bias:
        out.append(f".{spec.moe_correction_bias.rsplit('.', 1)[-1]}")
    if spec.attention_sinks:
        out.append(f".{spec.attention_sinks}")
    out += [f".{name}" for name in (spec.key_bias_param, spec.residual_scale_attn, spec.residual_scale_mlp) if name]
    out += [f".{vector}" for vector in spec.diff_lambdas]
    if spec.o_bias_param:
        out.append(f".{spec.o_bias_param}")
    out += [f".{tensor}" for tensor in spec.act_tensors]
    # The stored first states of stacks run in cycles (HRM's z_L_init).
    out += [f".{start}" for start in spec.cycle_start if start not in ("embeddings", "zeros")]
    # Hyper-connections' mixers and head: their matrix, bias and scales (under the checkpoint's names, if others).
    out += [f".{m}.{p}" for m in spec.hyper_mixers for p in spec.hyper_params]
    out += [f".{spec.hyper_head}.{p}" for p in spec.hyper_head_params if spec.hyper_head]
    out += list(spec.hyper_renamed)
    if spec.altup_num_inputs:  # AltUp's scale of the corrected active copy
        out.append(f".{spec.altup_output_scale}")
    if moe and spec.experts_layout in ("stacked", "flattened"):
        out += [f".{tensor}" for tensor in stacked_projections(spec) if not tensor.endswith((".weight", ".bias"))]
    if moe and spec.hash_table:  # hash routing's integer table: no quantization method's tensor either
        out.append(f".{spec.hash_table}")
    # The experts beside the dense MLP (3-D tensors) and their router's scales.
    out += [f".{name}" for name in (spec.parallel_moe_gate_up, spec.parallel_moe_down, spec.parallel_moe_router_scale,
                                    spec.parallel_moe_expert_scale) if name]
    return tuple(dict.fromkeys(out))


def stacked_projections(spec: Spec) -> dict[str, tuple[str, ...]]:
    """Each 3-D expert tensor (and bias) by its path inside the MoE block -> the per-expert projections its rows
    hold, in row order, as the port's load_weights hands them on (swigluoai's gate-and-up tensors are rearranged
    first into a w1 half and a w3 half)."""
    n = spec.names
    if spec.experts_layout == "flattened":  # one projection each, [experts x rows, columns]
        return {n["flat_gate"]: ("gate_proj",), n["flat_up"]: ("up_proj",), n["flat_down"]: ("down_proj",)}
    gate_up = (("gate_proj", "up_proj") if spec.expert_gate_up_order == "gate_first"
               or spec.expert_activation == "swigluoai" else ("up_proj", "gate_proj"))
    out = {n["stacked_gate_up"]: gate_up, n["stacked_down"]: ("down_proj",)}
    if spec.expert_bias:
        out.update({n["stacked_gate_up_bias"]: gate_up, n["stacked_down_bias"]: ("down_proj",)})
    return out


def interfaces(moe: bool, position_rows: bool = False) -> tuple[str, ...]:
    """The vLLM interfaces the causal-LM class declares, as vLLM's own Llama and Qwen3-MoE do.

    Every port hands EAGLE-3 the hidden states of the layers it asks for (SupportsEagle3). MoE
    ports take part in expert-parallel load balancing (MixtureOfExperts) and take no LoRA:
    vLLM's FusedMoE layers have none here. A config that declares multimodal rotary sections makes vLLM hand
    the model a row of positions per section, which it asks of the model (SupportsMRoPE).
    """
    rows = ("SupportsMRoPE",) if position_rows else ()
    if moe:
        return ("MixtureOfExperts", "SupportsEagle3", *rows, "SupportsPP", "SupportsQuant")
    return ("SupportsEagle3", "SupportsLoRA", *rows, "SupportsPP", "SupportsQuant")


def routing_choices(spec: Spec) -> dict[str, object]:
    """How the port's FusedMoE routes beyond softmax top-k (the DeepSeek-V3 form: GLM-4-MoE, dots1).

    `routing_args`: FusedMoE gets the scoring function, the group-limited top-k, the scaling factor and the
    correction bias. It always takes the grouped top-k then (one group of every expert where the model has
    none): vLLM's CPU router computes a correction bias, a sigmoid or a scaling factor only there, and on GPU
    a grouping of one group falls back to the fused top-k kernels. `bias_holder`: the module the port
    creates to keep the correction bias at the checkpoint's name (Ernie 4.5's moe_statics); None where
    it sits on the block or on the router.
    """
    bias = spec.moe_correction_bias if spec.is_moe else None
    routing_args = spec.is_moe and bool(spec.moe_sigmoid or bias or spec.moe_groups
                                        or spec.moe_routed_scaling_factor is not None)
    holder = bias.split(".")[0] if bias and "." in bias else None
    # Laguna's checkpoints keep it under the experts (`experts.e_score_correction_bias`): the port registers it on
    # the module FusedMoE builds, after building it.
    on_experts = holder is not None and holder == spec.names.get("experts") and bias.count(".") == 1
    return {
        "routing_args": routing_args,
        "correction_bias": bias,
        "bias_holder": holder if holder not in (spec.names.get("router"), None) and not on_experts else None,
        "bias_on_experts": bias.split(".")[1] if on_experts else None,
        "bias_ref": "e_score_correction_bias" if on_experts else f"self.{bias}" if bias else None,
    }


def packed_modules(spec: Spec, gate_up: bool) -> dict[str, list[str]]:
    """packed_modules_mapping: each vLLM parameter that packs several checkpoint modules, with them.

    A layout that already stores the packed module keeps its own name (packed from itself).
    """
    n = spec.names
    if spec.qkv_layout == "latent":
        packed = {n["qkv_proj"]: [n["q_a_proj"], n["kv_a_proj"]]} if spec.q_lora_rank else {}
    else:
        packed = {n["qkv_proj"]: [n["q_proj"], n["k_proj"], n["v_proj"]] if spec.qkv_layout == "separate"
                  else [n["qkv_proj"]]}
    if gate_up:
        packed[n["gate_up_proj"]] = ([n["gate_proj"], n["up_proj"]] if spec.gate_up_layout == "separate"
                                     else [n["gate_up_proj"]])
    return packed


def logits_processor_arguments(spec: Spec, cfg: Callable[[str], str]) -> list[str]:
    """LogitsProcessor's arguments: the vocabulary, and the logit scale and soft cap where the model has them."""
    arguments = [cfg("vocab_size")]
    if spec.logits_scale is not None:
        arguments.append(f"scale={cfg('logits_scale')}")
    if spec.final_logit_softcap is not None:
        arguments.append(f"soft_cap={cfg('final_logit_softcap')}")
    return arguments


def norm_class(spec: Spec) -> str:
    if spec.norm_kind == "rms":
        return "GemmaRMSNorm" if spec.norm_offset else "RMSNorm"
    return "LayerNorm1P" if spec.norm_offset else "LayerNorm"


def norm_constructor(spec: Spec, cfg: Callable[[str], str]) -> Callable[[str], str]:
    """`norm(size)` for the templates: the code that builds one of the port's norms over `size`."""
    cls = norm_class(spec)
    bias = "" if spec.norm_kind == "rms" or spec.norm_bias else ", bias=False"
    if spec.norm_weightless:  # no scale, no bias (OLMo's norms)
        bias = ", has_weight=False" if spec.norm_kind == "rms" else ", elementwise_affine=False, bias=False"

    def norm(size: str, weightless: bool = False, latent: bool = False) -> str:
        # Latent attention's own norms take the eps their constructor gives where it is another (GLM-5's class
        # default 1e-6 beside rms_norm_eps 1e-5: latent_norm_eps).
        eps = cfg("latent_norm_eps" if latent and spec.latent_norm_eps is not None else "norm_eps")
        if weightless and not spec.norm_weightless:  # a weightless RMS norm beside scaled ones (Llama 4's q/k)
            return f"RMSNorm({size}, eps={eps}, has_weight=False)"
        return f"{cls}({size}, eps={eps}{bias})"

    return norm


def imports(spec: Spec, flags: dict[str, object], act_and_mul: bool) -> tuple[list[Import], list[Import]]:
    """The port's imports: (standard library, third party), in the order the header writes them.

    The version fallbacks (Attention, FusedMoE) are code, in the header partial.
    """
    moe, alibi, mlp_class, latent = flags["moe"], flags["alibi"], flags["mlp_class"], flags["latent"]
    routed = flags["routed"]  # its own rank, an all-reduce of the output experts, banks loaded per rank
    low_rank_q = latent and bool(spec.q_lora_rank)
    # A norm over a tensor-parallel-sharded width: q/k norms over all heads, norms inside a sublayer.
    sharded_norm = spec.qk_norm == "full" or bool(flags["sub_norm"])
    gate_bias = bool(spec.gate_extra_bias)
    # Parameters the port loads with a per-rank slice of their own (the gate bias, the attention sinks).
    sliced = gate_bias or bool(spec.attention_sinks) or routed
    # The MLP's activation, and a plain one for a transform before the head (spec.head_act).
    activations = ({flags["act_call"].split("(", 1)[0] if flags["act_call"] else
                    "SwigluOAIAndMul" if spec.mlp_activation == "swigluoai" else
                    "get_act_and_mul_fn" if flags["gated"] and act_and_mul else "get_act_fn"} if mlp_class else set())
    if spec.head_act is not None or spec.per_layer_input_size or spec.gated_norm_parts:  # also a gate's MLP
        activations.add("get_act_fn")
    # Differential attention gathers the value heads and the outputs across ranks; its init may call math.exp.
    diff = bool(spec.diff_lambdas)
    # Experts computing silu(gate.clamp(max=L)) * up.clamp(-L, L): the port's own experts module (vLLM's CPU
    # FusedMoE kernel takes no clamp limit), with vLLM's router.
    clamped = moe and spec.expert_activation == "silu_clamp"
    # Routed experts beside the dense MLP (Gemma 4's): FusedMoE, a replicated router linear, a weightless RMSNorm.
    beside = bool(spec.parallel_moe_experts)
    stdlib = [
        *([Import("math")] if alibi or diff or spec.altup_num_inputs else []),
        Import("re"),
        Import("collections.abc", ("Iterable",)),
        *([] if spec.recurrent_stacks else [Import("itertools", ("islice",))]),
        Import("typing", ("ClassVar",)),
    ]
    third_party = [
        Import("torch"),
        Import("torch", ("nn",)),
        Import("vllm.compilation.decorators", ("support_torch_compile",)),
        Import("vllm.config", _present(
            ("CacheConfig", True),
            ("VllmConfig", True),
            ("get_current_vllm_config", moe),
        )),
        Import("vllm.distributed", _present(
            ("get_ep_group", moe),
            ("get_pp_group", True),
            ("get_tensor_model_parallel_rank", sharded_norm or alibi or diff or bool(spec.key_bias_proj) or clamped
             or routed),
            ("get_tensor_model_parallel_world_size", True),
            ("tensor_model_parallel_all_gather", sharded_norm or diff or bool(spec.key_bias_proj)),
            ("tensor_model_parallel_all_reduce", routed or clamped or bool(spec.activation_sparsity)),
        ), one_per_line=True),
        *([Import("vllm.distributed.utils", ("split_tensor_along_last_dim",))] if sharded_norm else []),
        *([Import("vllm.model_executor.layers.activation", tuple(sorted(activations)))] if activations else []),
        *([Import("vllm.model_executor.layers.attention", ("MLAAttention",))]
          if flags["latent_own_query"] and not flags["latent_decompressed"] else []),
        *([Import("vllm.model_executor.layers.fused_moe", ("GateLinear", "fused_moe_make_expert_params_mapping"))]
          if moe else []),
        *([Import("vllm.model_executor.layers.fused_moe.router.router_factory", ("create_fused_moe_router",))]
          if clamped else []),
        # LayerNorm1P is the port's own class.
        *([Import("vllm.model_executor.layers.layernorm", tuple(sorted(
            ({"RMSNorm"} if diff or beside and spec.parallel_moe_router_norm else set())
            | (set() if flags["layer_norm_1p"] else {norm_class(spec)}))))]
          if diff or beside or not flags["layer_norm_1p"] else []),
        Import("vllm.model_executor.layers.linear", _present(
            ("ColumnParallelLinear", not flags["gated"] or latent
             or spec.attn_output_gate not in ("none", "in_query") or bool(spec.per_layer_input_size)
             or bool(spec.kv_share_layers) or bool(spec.altup_num_inputs)),
            ("MergedColumnParallelLinear", flags["gated"] and mlp_class or low_rank_q or routed),
            ("QKVParallelLinear", not latent and not routed),
            ("ReplicatedLinear", flags["shared_gate"] or latent and not low_rank_q or spec.head_act is not None
             or routed or bool(spec.per_layer_input_size) or bool(spec.gated_norm_parts) or bool(spec.key_bias_proj)
             or beside),
            ("RowParallelLinear", not routed or mlp_class),
        ), one_per_line=True),
        Import("vllm.model_executor.layers.logits_processor", ("LogitsProcessor",)),
        *([Import("vllm.model_executor.layers.mla", ("MLAModules", "MultiHeadLatentAttentionWrapper"))]
          if latent and not flags["latent_own_query"] else []),
        Import("vllm.model_executor.layers.quantization", ("QuantizationConfig",)),
        *([Import("vllm.model_executor.layers.rotary_embedding", _present(
            ("RotaryEmbedding", flags["frequency_order"]), ("get_rope", not flags["frequency_order"])))] if flags["rotary"] else []),
        *([Import("vllm.model_executor.layers.rotary_embedding.common", ("yarn_get_mscale",))] if latent else []),
        Import("vllm.model_executor.layers.vocab_parallel_embedding", ("ParallelLMHead", "VocabParallelEmbedding")),
        Import("vllm.model_executor.model_loader.weight_utils", _present(
            ("default_weight_loader", True),
            ("maybe_remap_kv_scale_name", True),
            ("sharded_weight_loader", gate_bias or bool(spec.attention_sinks)),
        ), one_per_line=True),
        Import("vllm.model_executor.models.interfaces", flags["interfaces"], one_per_line=True),
        # PhiMoE's routing, vLLM's own (its phimoe model's custom routing function).
        *([Import("vllm.model_executor.models.phimoe", ("sparsemixer",))]
          if moe and spec.moe_routing == "sparsemixer" else []),
        Import("vllm.model_executor.models.utils", _present(
            ("PPMissingLayer", True), ("WeightsMapper", True), ("extract_layer_index", True),
            ("is_pp_missing_parameter", True),
            # Stacks run in cycles build their lists themselves, on one pipeline stage.
            # Hyper-connections' ranks hand on streams [tokens, N, hidden]: a factory of their own.
            ("make_empty_intermediate_tensors_factory", not spec.recurrent_stacks and not spec.hyper_streams),
            ("make_layers", not spec.recurrent_stacks), ("maybe_prefix", True),
        )),
        Import("vllm.sequence", ("IntermediateTensors",)),
        *([Import("vllm.model_executor.utils", ("set_weight_attrs",))] if sliced or clamped else []),
        # The clamped experts' loop and the routed attention's bank of per-expert linears: ops of their own for
        # torch.compile.
        *([Import("vllm.utils.torch_utils", ("direct_register_custom_op",))] if clamped or routed else []),
    ]
    return stdlib, third_party


def _present(*names: tuple[str, bool]) -> tuple[str, ...]:
    return tuple(name for name, wanted in names if wanted)


def activation_call(spec: Spec) -> str | None:
    """How the port builds an activation holding tensors of its own (spec.act_tensors): as vLLM's registry
    builds it (`XIELU()`), one instance per layer; None for an activation without tensors."""
    if not spec.act_tensors:
        return None
    call = vllm_activation_call(spec.hidden_act.lower())
    if call is None:
        raise SpecError(f"act_tensors lists {', '.join(spec.act_tensors)}, but vLLM's activation registry builds "
                        f"no module class for hidden_act {spec.hidden_act!r} to load them into.")
    return call


def model_context(spec: Spec, overridden: set[str], cfg: Callable[[str], str], act_and_mul: bool) -> dict:
    """Everything the model template needs beyond render's common context."""
    flags = choices(spec, overridden)
    if spec.hash_layers and (not flags["fused_residual"] or spec.sublayer_count):
        # The token ids reach the MoE block through the fused-residual layer's forward only.
        raise SpecError("hash_layers: hash routing is ported in decoder layers that add the residual inside a "
                        "fused RMSNorm (pre-norm or sandwich, one attention and MLP), not this layer's form.")
    stdlib, third_party = imports(spec, flags, act_and_mul)
    return {**flags, "norm": norm_constructor(spec, cfg), "stdlib_imports": stdlib, "imports": third_party,
            "logits_processor_arguments": logits_processor_arguments(spec, cfg)}
