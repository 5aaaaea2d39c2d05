"""Divergence localization: the same module outputs captured in transformers and in the port.

Probe points are derived from the weight table, so they work for any tensor naming:
the transformers module of a part is the parent of its checkpoint tensors, the port
module the parent of the vLLM parameter they load into. Each worker hooks its side,
runs one prompt, and saves the outputs; `localize` walks them in execution order and
names the first module whose output diverges, with the spec fields that feed it.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaffold.mapping import WeightRow

# Spec fields that feed each kind of module; the suspects when that module diverges.
FEEDS = {
    "embed": ["vocab_size", "hidden_size", "dtype"],
    "input_layernorm": ["norm_kind", "norm_eps", "norm_offset", "block"],
    "self_attn": ["num_heads", "num_kv_heads", "head_dim", "qkv_layout", "qkv_bias", "o_bias", "qk_norm",
                  "rope_parameters", "partial_rotary_factor", "rope_neox_style", "sliding_window",
                  "sliding_window_layers"],
    "post_attention_layernorm": ["norm_kind", "norm_eps", "norm_offset", "block"],
    "mlp": ["mlp_kind", "hidden_act", "mlp_bias", "gate_extra_bias", "intermediate_size"],
    "layer": ["block"],
    "final_norm": ["norm_kind", "norm_eps", "norm_offset"],
    "logits": ["tie_word_embeddings", "lm_head_bias", "vocab_size"],
}
THRESHOLD = 1e-3  # relative error; float32 ports agree to ~1e-6


@dataclass(frozen=True)
class Probe:
    label: str  # e.g. "layer 3 self_attn"
    kind: str  # key of FEEDS
    hf_module: str
    port_module: str
    port_output: str  # "tensor", "first" (first of a tuple), "stream" (sum of (hidden, residual))


def _parent(name: str, levels: int = 1) -> str:
    return name.rsplit(".", levels)[0]


def probes_for(rows: list[WeightRow], num_layers: int) -> list[Probe]:
    by_param = {r.param: r.checkpoint for r in rows if r.param}
    out = []

    def add(label, kind, param, hf_levels, port_levels, port_output):
        hf_name = by_param.get(param)
        if hf_name is not None:
            out.append(Probe(label, kind, _parent(hf_name, hf_levels), _parent(param, port_levels), port_output))

    add("embedding", "embed", "model.embed_tokens.weight", 1, 1, "tensor")
    for i in range(num_layers):
        p = f"model.layers.{i}."
        add(f"layer {i} input_layernorm", "input_layernorm", p + "input_layernorm.weight", 1, 1, "first")
        add(f"layer {i} self_attn", "self_attn", p + "self_attn.o_proj.weight", 2, 2, "tensor")
        add(f"layer {i} post_attention_layernorm", "post_attention_layernorm",
            p + "post_attention_layernorm.weight", 1, 1, "first")
        add(f"layer {i} mlp", "mlp", p + "mlp.down_proj.weight", 2, 2, "tensor")
        norm = by_param.get(p + "input_layernorm.weight")
        if norm:
            out.append(Probe(f"layer {i} output", "layer", _parent(norm, 2), f"model.layers.{i}", "stream"))
    add("final norm", "final_norm", "model.norm.weight", 1, 1, "first")
    head = by_param.get("lm_head.weight") or ("lm_head.weight" if "model.embed_tokens.weight" in by_param else None)
    if head:
        out.append(Probe("logits", "logits", "lm_head", "logits_processor", "tensor"))
    return out


def capture(model, points: list[tuple[str, str, str]], store: dict) -> list:
    """Hook (label, module path, mode) points; the first call of each saves its output into `store`.

    mode "tensor": the output as is; "first": the first element of a tuple output
    (a transformers layer, or a vLLM norm that returns (normed, residual));
    "stream": hidden + residual of a vLLM decoder layer, i.e. the residual stream.
    """
    import torch

    handles = []
    for label, path, mode in points:
        module = model.get_submodule(path)

        def hook(_module, _inputs, output, label=label, mode=mode):
            if label in store:
                return
            if isinstance(output, tuple):
                if mode == "stream" and len(output) > 1 and output[1] is not None:
                    output = output[0] + output[1]
                else:
                    output = output[0]
            store[label] = output.detach().to(torch.float32).reshape(-1, output.shape[-1]).cpu().clone()

        handles.append(module.register_forward_hook(hook))
    return handles


def localize(hf: dict, port: dict, probes: list[Probe]) -> tuple[list[tuple[str, float]], Probe | None]:
    """Relative error of every probe in execution order, and the first that diverges."""
    errors, first = [], None
    for probe in probes:
        a, b = port.get(probe.label), hf.get(probe.label)
        if a is None or b is None:
            continue
        if probe.kind == "logits" and a.shape != b.shape:
            a, b = a[-1:], b[-1:]  # vLLM computes logits only where it samples
        if a.shape != b.shape:
            rel = float("inf")
        else:
            rel = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
        errors.append((probe.label, rel))
        if first is None and rel > THRESHOLD:
            first = probe
    return errors, first
