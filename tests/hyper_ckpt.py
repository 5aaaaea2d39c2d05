"""Lab checkpoints with hyper-connections: a tiny Llama (scaffold.tiny.build_tiny) whose residual is kept as several
streams, shipped as remote code: transformers' own modeling_llama.py with its relative imports made absolute, the
decoder layer's forward and the model's forward replaced, and a hyper-connection module per sublayer plus a head
that collapses the streams before the final norm. Three styles:

- "hy_v4": HY-V4's classes (HYV4UnweightedRMSNorm, HYV4HyperConnection, HYV4HyperHead) copied from transformers'
  modeling_hy_v4.py and its decoder layer's residual form (`post * out + streams`, no mixing of the streams);
- "deepseek_v4": DeepSeek-V4's classes copied from modeling_deepseek_v4.py, with the stream-mixing matrix made
  doubly stochastic by Sinkhorn iterations (`post * out + comb^T @ streams`);
- "lab": a lab's own, written otherwise (other names, the norm divided out, einsum, slices, the mixed input
  returned first, a constant write gain 2, `repeat` for the copies, the config keys n_streams and stream_floor).

Only the hyper-connections differ from Llama: the port computes everything else as for Llama. The parameters are
drawn so that the streams matter (a port that dropped them is far from transformers).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

from ckpt_factory import tiny_base

NAME = "hyperllama"
ARCHITECTURE = "HyperllamaForCausalLM"
STYLES = ("hy_v4", "deepseek_v4", "lab")
TF = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations)))

# style -> (the classes copied from transformers' file, their prefix there)
COPIED = {
    "hy_v4": ("hy_v4", "HYV4", ("HYV4UnweightedRMSNorm", "HYV4HyperConnection", "HYV4HyperHead")),
    "deepseek_v4": ("deepseek_v4", "DeepseekV4",
                    ("DeepseekV4UnweightedRMSNorm", "DeepseekV4HyperConnection", "DeepseekV4HyperHead")),
}

LAB_CLASSES = '''class StreamRouter(nn.Module):
    """A lab's stream router: reads a gated mix of the streams, writes the sublayer's output back with gains."""

    def __init__(self, config):
        super().__init__()
        self.n = config.n_streams
        self.eps = config.rms_norm_eps
        self.floor = config.stream_floor
        self.w = nn.Parameter(torch.empty(2 * config.n_streams, config.n_streams * config.hidden_size))
        self.b = nn.Parameter(torch.empty(2 * config.n_streams))
        self.alpha = nn.Parameter(torch.empty(2))

    def forward(self, x):
        b, s, n, d = x.shape
        z = x.reshape(b, s, n * d).float()
        z = z / torch.sqrt(z.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        logits = z @ self.w.t()
        read = torch.sigmoid(self.alpha[0] * logits[..., : self.n] + self.b[: self.n]) + self.floor
        write = 2.0 * torch.sigmoid(self.alpha[1] * logits[..., self.n :] + self.b[self.n :])
        merged = torch.einsum("bsn,bsnd->bsd", read, x)
        return merged, write


class StreamCollapse(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.floor = config.stream_floor
        self.w = nn.Parameter(torch.empty(config.n_streams, config.n_streams * config.hidden_size))
        self.b = nn.Parameter(torch.empty(config.n_streams))
        self.alpha = nn.Parameter(torch.empty(1))

    def forward(self, x):
        z = x.flatten(-2)
        inv = torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + self.eps)
        weights = torch.sigmoid((z @ self.w.t()) * inv * self.alpha + self.b) + self.floor
        return (weights.unsqueeze(-1) * x).sum(-2)


'''

# style -> (layer __init__ lines, layer forward body, model __init__ line, expansion, head call)
LAYER_INIT = {
    "hy_v4": ("self.attn_hc = HyperllamaHyperConnection(config)", "self.ffn_hc = HyperllamaHyperConnection(config)"),
    "deepseek_v4": ("self.attn_hc = HyperllamaHyperConnection(config)",
                    "self.ffn_hc = HyperllamaHyperConnection(config)"),
    "lab": ("self.attn_route = StreamRouter(config)", "self.mlp_route = StreamRouter(config)"),
}
ATTN_CALL = """self.self_attn(
            hidden_states=hidden_states,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )"""
LAYER_FORWARD = {
    "hy_v4": f"""        dtype = hidden_states.dtype
        residual = hidden_states
        post, hidden_states = self.attn_hc(hidden_states)
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, _ = {ATTN_CALL}
        hidden_states = (post.float().unsqueeze(-1) * hidden_states.float().unsqueeze(-2) + residual.float()).to(dtype)

        residual = hidden_states
        post, hidden_states = self.ffn_hc(hidden_states)
        hidden_states = self.post_attention_layernorm(hidden_states)
        hidden_states = self.mlp(hidden_states)
        hidden_states = (post.float().unsqueeze(-1) * hidden_states.float().unsqueeze(-2) + residual.float()).to(dtype)
        return hidden_states
""",
    "deepseek_v4": f"""        dtype = hidden_states.dtype
        post, comb, collapsed = self.attn_hc(hidden_states)
        attn_output, _ = {ATTN_CALL.replace("hidden_states=hidden_states", "hidden_states=self.input_layernorm(collapsed)")}
        hidden_states = post.to(dtype).unsqueeze(-1) * attn_output.unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), hidden_states
        )

        post, comb, collapsed = self.ffn_hc(hidden_states)
        mlp_output = self.mlp(self.post_attention_layernorm(collapsed))
        return post.to(dtype).unsqueeze(-1) * mlp_output.unsqueeze(-2) + torch.matmul(
            comb.to(dtype).transpose(-1, -2), hidden_states
        )
""",
    "lab": f"""        streams = hidden_states
        merged, write = self.attn_route(streams)
        hidden_states = self.input_layernorm(merged)
        attended, _ = {ATTN_CALL}
        streams = streams + write.unsqueeze(-1) * attended.unsqueeze(2)
        merged, write = self.mlp_route(streams)
        out = self.mlp(self.post_attention_layernorm(merged))
        streams = streams + write.unsqueeze(-1) * out.unsqueeze(2)
        return streams
""",
}
MODEL_HEAD = {"hy_v4": "self.hc_head = HyperllamaHyperHead(config)",
              "deepseek_v4": "self.hc_head = HyperllamaHyperHead(config)",
              "lab": "self.collapse = StreamCollapse(config)"}
EXPANSION = {"hy_v4": "inputs_embeds.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()",
             "deepseek_v4": "inputs_embeds.unsqueeze(2).expand(-1, -1, self.config.hc_mult, -1).contiguous()",
             "lab": "inputs_embeds.unsqueeze(2).repeat(1, 1, self.config.n_streams, 1)"}
HEAD_CALL = {"hy_v4": "self.norm(self.hc_head(hidden_states))", "deepseek_v4": "self.norm(self.hc_head(hidden_states))",
             "lab": "self.norm(self.collapse(hidden_states))"}


def _copied_classes(style: str) -> str:
    model_type, prefix, names = COPIED[style]
    path = TF / "models" / model_type / f"modeling_{model_type}.py"
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    out = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in names:
            out.append(ast.get_source_segment(text, node, padded=False))
    assert len(out) == len(names), f"{path}: not all of {names}"
    text = "\n\n\n".join(out).replace(f"{prefix}Config", "LlamaConfig")
    return text.replace(prefix, "Hyperllama") + "\n\n\n"


def modeling_source(style: str) -> str:
    text = (TF / "models" / "llama" / "modeling_llama.py").read_text(encoding="utf-8")
    text = text.replace("from ... import", "from transformers import").replace("from ...", "from transformers.")
    text = text.replace("from .configuration_llama import LlamaConfig",
                        f"from .configuration_{NAME} import HyperllamaConfig as LlamaConfig\n"
                        "from transformers.utils.generic import maybe_autocast\nimport torch.nn.functional as F")
    classes = LAB_CLASSES if style == "lab" else _copied_classes(style)
    text = text.replace("class LlamaDecoderLayer(", classes + "class LlamaDecoderLayer(", 1)
    # The decoder layer: its hyper-connection modules, and its forward's body replaced.
    init = "        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n"
    assert text.count(init) == 1
    text = text.replace(init, init + "".join(f"        {line}\n" for line in LAYER_INIT[style]))
    body = re.search(r"(    \) -> torch\.Tensor:\n)(        residual = hidden_states\n.*?        return hidden_states\n)",
                     text, flags=re.DOTALL)
    assert body, "modeling_llama.py: the decoder layer's forward"
    text = text[:body.start(2)] + LAYER_FORWARD[style] + text[body.end(2):]
    # The model: the head collapsing the streams, the streams expanded from the embeddings.
    norm = "        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)\n"
    assert text.count(norm) == 1
    text = text.replace(norm, norm + f"        {MODEL_HEAD[style]}\n")
    rotary = "        position_embeddings = self.rotary_emb(hidden_states, position_ids=position_ids)\n"
    assert text.count(rotary) == 1
    text = text.replace(rotary, rotary + f"        hidden_states = {EXPANSION[style]}\n")
    final = "        hidden_states = self.norm(hidden_states)\n        return BaseModelOutputWithPast("
    assert text.count(final) == 1
    text = text.replace(final, f"        hidden_states = {HEAD_CALL[style]}\n        return BaseModelOutputWithPast(")
    return text.replace("LlamaForCausalLM", ARCHITECTURE)


CONFIG_KEYS = {  # style -> the config keys its classes read, and the tiny values
    "hy_v4": {"hc_mult": 3, "hc_eps": 1e-4, "hc_magnitude": 1.5},
    "deepseek_v4": {"hc_mult": 3, "hc_eps": 1e-3, "hc_sinkhorn_iters": 5},
    "lab": {"n_streams": 3, "stream_floor": 0.05},
}


def configuration(style: str) -> str:
    keys = CONFIG_KEYS[style]
    params = ", ".join(f"{k}={v!r}" for k, v in keys.items())
    sets = "".join(f"        self.{k} = {k}\n" for k in keys)
    return f'''from transformers.models.llama.configuration_llama import LlamaConfig


class HyperllamaConfig(LlamaConfig):
    model_type = "{NAME}"

    def __init__(self, {params}, **kwargs):
{sets}        super().__init__(**kwargs)
'''


def hyper_tensors(style: str, config: dict, seed: int) -> dict:
    """The hyper-connections' parameters: mixing matrices, biases and scales that make the streams matter."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    n, d = CONFIG_KEYS[style]["hc_mult" if style != "lab" else "n_streams"], config["hidden_size"]
    comb = n * n if style == "deepseek_v4" else 0
    rows, scales = 2 * n + comb, 3 if comb else 2
    names = {"hy_v4": ("attn_hc", "ffn_hc", "fn", "base", "scale", "hc_head", "hc_fn", "hc_base", "hc_scale"),
             "deepseek_v4": ("attn_hc", "ffn_hc", "fn", "base", "scale", "hc_head", "hc_fn", "hc_base", "hc_scale"),
             "lab": ("attn_route", "mlp_route", "w", "b", "alpha", "collapse", "w", "b", "alpha")}[style]
    attn, mlp, fn, base, scale, head, hfn, hbase, hscale = names
    out = {}

    def randn(*shape, std=1.0):
        return (std * torch.randn(*shape, generator=gen)).contiguous()

    for layer in range(config["num_hidden_layers"]):
        for module in (attn, mlp):
            p = f"model.layers.{layer}.{module}"
            out[f"{p}.{fn}"] = randn(rows, n * d, std=(n * d) ** -0.5)
            out[f"{p}.{base}"] = randn(rows, std=0.5)
            out[f"{p}.{scale}"] = 1.0 + randn(scales, std=0.2)
    out[f"model.{head}.{hfn}"] = randn(n, n * d, std=(n * d) ** -0.5)
    out[f"model.{head}.{hbase}"] = randn(n, std=0.5)
    out[f"model.{head}.{hscale}"] = 1.0 + randn(1, std=0.2)
    return out


def build(out: Path, *, style: str = "hy_v4", seed: int = 0, overrides: dict | None = None) -> Path:
    """Write the checkpoint into `out` (created; replaced if there) and return it."""
    from safetensors.torch import save_file


    out = Path(out)
    tensors, config = tiny_base("llama", out, overrides=overrides, seed=seed)
    tensors.update(hyper_tensors(style, config, seed))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.update(model_type=NAME, architectures=[ARCHITECTURE], **CONFIG_KEYS[style],
                  auto_map={"AutoConfig": f"configuration_{NAME}.HyperllamaConfig",
                            "AutoModelForCausalLM": f"modeling_{NAME}.{ARCHITECTURE}"})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / f"configuration_{NAME}.py").write_text(configuration(style))
    (out / f"modeling_{NAME}.py").write_text(modeling_source(style))
    return out
