"""Divergence localization: the same module outputs captured in transformers and in the port.

Probe points are derived from the weight table, so they work for any tensor naming:
the transformers module of a part is the parent of its checkpoint tensors, the port
module the parent of the vLLM parameter they load into. Each worker hooks its side,
runs one prompt, and saves the outputs; `localize` walks them in execution order and
names the first module whose output diverges, with the spec fields that feed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaffold.spec import FIELD_INFO, PROBES, port_names

# Spec fields that feed each kind of module; the suspects when that module diverges. Each field declares the
# probes it feeds (spec_field(probe=...) in scaffold.spec); this is that relation read the other way.
FEEDS = {kind: [name for name, info in FIELD_INFO.items() if kind in info.probe] for kind in PROBES}
THRESHOLD = 1e-3  # relative error; float32 ports agree to ~1e-6
MODULE_NOISE_FACTOR = 4.0  # a module this many times transformers' own float32 error (against float64), or less, agrees


@dataclass(frozen=True)
class Probe:
    label: str  # e.g. "layer 3 self_attn"
    kind: str  # key of FEEDS
    hf_module: str
    port_module: str
    port_output: str  # "tensor", "first" (first of a tuple), "stream" (sum of (hidden, residual)),
    # "input" (the first floating-point tensor the module is called with: a vLLM decoder layer's hidden_states
    # after its int positions; a transformers layer's hidden_states, positional or by keyword)

    @property
    def hf_output(self) -> str:
        """The transformers side: a module's output (its first element when a tuple), or its input."""
        return "input" if self.port_output == "input" else "first"


def _path(*parts: str) -> str:
    return ".".join(p for p in parts if p)


def probes_for(spec) -> list[Probe]:
    """Probe points in execution order. The port names its modules as the checkpoint does
    (spec.names), so one module path serves both sides; only the logits differ (the port
    computes them in its logits_processor)."""
    names, port = spec.names, port_names(spec.names)  # a nested top-level module keeps its last component
    root = names.get("model", "model")
    out = []
    if spec.embedding_multiplier is None:
        embed = _path(root, names["embed_tokens"])
        out.append(Probe("embedding", "embed", embed, _path(root, port["embed_tokens"]), "tensor"))
    else:
        # Both sides scale the embedding outside its module: probe what layer 0 receives.
        first = _path(root, names["layers"], "0")
        out.append(Probe("embedding after its multiplier", "embed", first, _path(root, port["layers"], "0"), "input"))
    parts = [("attn_norm", "input_layernorm", "first"), ("self_attn", "self_attn", "tensor"),
             ("attn_post_norm", "post_attention_layernorm", "first"), ("mlp_norm", "post_attention_layernorm", "first"),
             ("mlp", "mlp", "tensor"), ("mlp_post_norm", "post_attention_layernorm", "first")]
    for i in range(spec.num_layers):
        layer, port_layer = _path(root, names["layers"], str(i)), _path(root, port["layers"], str(i))
        for role, kind, mode in parts:
            if names.get(role):
                path = _path(port_layer, names[role])
                hf_path = _path(layer, names[role])
                if role == "mlp" and names[role] != "mlp":
                    # transformers may rename a checkpoint's MLP module on load (Mixtral's
                    # block_sparse_moe is `mlp` in transformers 5): either path will do.
                    hf_path = f"{hf_path}|{_path(layer, 'mlp')}"
                out.append(Probe(f"layer {i} {names[role]}", kind, hf_path, path, mode))
        out.append(Probe(f"layer {i} output", "layer", layer, port_layer, "stream"))
    if "norm" in names:  # none where the base model applies no final norm
        norm = _path(root, names["norm"])
        out.append(Probe("final norm", "final_norm", norm, _path(root, port["norm"]), "first"))
    out.append(Probe("logits", "logits", names.get("lm_head", "lm_head"), "logits_processor", "tensor"))
    return out


def capture(model, points: list[tuple[str, str, str]], store: dict) -> list:
    """Hook (label, module path, mode) points; the first call of each saves its output into `store`.

    A path may list alternatives separated by "|"; the first the model has is hooked.

    mode "tensor": the output as is; "first": the first element of a tuple output
    (a transformers layer, or a vLLM norm that returns (normed, residual));
    "stream": hidden + residual of a vLLM decoder layer, i.e. the residual stream.
    """
    import torch  # deferred on purpose: the parent process plans probes without importing torch

    handles = []
    for label, paths, mode in points:
        module = None
        for path in paths.split("|"):  # alternatives, first match wins
            try:
                module = model.get_submodule(path)
                break
            except AttributeError:
                continue
        if module is None:  # this side has no such module; the probe is left out
            continue

        if mode == "input":
            def pre_hook(_module, args, kwargs, label=label):
                if label not in store:
                    tensors = [a for a in (*args, kwargs.get("hidden_states")) if isinstance(a, torch.Tensor)
                               and a.is_floating_point()]
                    if tensors:  # a copy: vLLM's fused residual norms update their inputs in place
                        saved = tensors[0].detach().to(torch.float32)
                        store[label] = saved.reshape(-1, saved.shape[-1]).cpu().clone()

            handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            continue

        def hook(_module, _inputs, output, label=label, mode=mode):
            if label in store:
                return
            if isinstance(output, (tuple, list)):  # GPT-1's Block returns a list
                if mode == "stream" and len(output) > 1 and output[1] is not None:
                    output = output[0] + output[1]
                else:
                    output = output[0]
            store[label] = output.detach().to(torch.float32).reshape(-1, output.shape[-1]).cpu().clone()

        handles.append(module.register_forward_hook(hook))
    return handles


def first_nonfinite(hf: dict, port: dict, probes: list[Probe]) -> tuple[Probe, str] | None:
    """The first module, in execution order, whose output holds NaN or an infinity, and on which side."""
    for probe in probes:
        sides = [side for side, store in (("transformers", hf), ("the port in vLLM", port))
                 if probe.label in store and not bool(store[probe.label].isfinite().all())]
        if sides:
            return probe, " and ".join(sides)
    return None


def localize(hf: dict, port: dict, probes: list[Probe], noise: dict | None = None,
             ) -> tuple[list[tuple[str, float]], Probe | None]:
    """Relative error of every probe in execution order, and the first that diverges: past THRESHOLD and, where
    `noise` gives transformers' own float32 error at that probe (against float64), past MODULE_NOISE_FACTOR times it."""
    errors, first = [], None
    for probe in probes:
        a, b = port.get(probe.label), hf.get(probe.label)
        if a is None or b is None:
            continue
        if probe.kind == "logits" and a.shape != b.shape:
            a, b = a[-1:], b[-1:]  # vLLM computes logits only where it samples
        if a.shape != b.shape:
            rel = math.inf
        else:
            rel = float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))
            rel = math.inf if math.isnan(rel) else rel  # NaN on a side never agrees
        errors.append((probe.label, rel))
        if first is None and rel > THRESHOLD and rel > MODULE_NOISE_FACTOR * (noise or {}).get(probe.label, 0.0):
            first = probe
    return errors, first
