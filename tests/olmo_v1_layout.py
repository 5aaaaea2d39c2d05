"""OLMo v1's tensor layout (ai2 hf_olmo: `model.transformer.blocks.N.att_proj`), written as a checkpoint here.

OLMo v1's checkpoints ship a modeling_olmo.py that builds the model with the `olmo` package (`from olmo.model import
OLMo`), code the checkpoint does not hold; its user describes the model with a spec file. Its decoder block keeps
every projection as its own module, with no attention or MLP module between:

    model.transformer.wte.weight                     [embedding_size, d_model]   (the head is tied to it)
    model.transformer.blocks.N.att_proj.weight       [3 * d_model, d_model]      q, k, v one after another
    model.transformer.blocks.N.attn_out.weight       [d_model, d_model]
    model.transformer.blocks.N.ff_proj.weight        [2 * F, d_model]            x, then the gate (silu(gate) * x)
    model.transformer.blocks.N.ff_out.weight         [d_model, F]

and its layer norms hold no weight (layer_norm_with_affine: false). SPEC is what that user writes.

`build_with_code` writes such a checkpoint with remote code of our own making (CONFIGURATION, MODELING: the block
computing as OLMo v1's sequential block does, pre-norm, rotary on the halves, silu(gate) * x over ff_proj's (x, gate)
halves, the head tied to wte), so that verify has a transformers reference to compare the spec-described port with.
"""

from __future__ import annotations

import json
from pathlib import Path

D_MODEL, HEADS, LAYERS, FFN, VOCAB, EMBEDDINGS = 128, 2, 2, 512, 1000, 1024

SPEC = f'''[spec]
num_layers = {LAYERS}
num_kv_heads = {HEADS}
head_dim = {D_MODEL // HEADS}
intermediate_size = {FFN}
vocab_size = {EMBEDDINGS}
qkv_layout = "fused"
qkv_bias = false
o_bias = false
qk_norm = "none"
mlp_kind = "gated"
gate_up_layout = "fused"
gate_up_order = "up_first"
mlp_bias = false
block = "pre_norm"
norm_kind = "layer"
norm_eps = 1e-5
norm_offset = 0.0
norm_bias = false
norm_weightless = true
tie_word_embeddings = true
lm_head_bias = false
skipped_tensors = []
mlp_on_layer = true
attn_on_layer = true

[spec.names]
model = "model"
embed_tokens = "transformer.wte"
layers = "transformer.blocks"
norm = "transformer.ln_f"
lm_head = "transformer.ff_out"
self_attn = "self_attn"
qkv_proj = "att_proj"
o_proj = "attn_out"
mlp = "mlp"
gate_up_proj = "ff_proj"
down_proj = "ff_out"
attn_norm = "attn_norm"
mlp_norm = "ff_norm"

[spec.config_keys]
hidden_size = "d_model"
num_layers = "n_layers"
num_heads = "n_heads"
'''


def write_layout(out: Path) -> tuple[Path, Path]:
    """A checkpoint of OLMo v1's tensor names and config keys (random tensors, no code), and the spec file beside
    it; returns both paths."""
    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["OLMoForCausalLM"], "model_type": "hf_olmo", "d_model": D_MODEL, "n_heads": HEADS,
              "n_layers": LAYERS, "mlp_ratio": 2 * FFN // D_MODEL, "activation_type": "swiglu", "rope": True,
              "layer_norm_type": "default", "layer_norm_with_affine": False, "include_bias": False,
              "weight_tying": True, "vocab_size": VOCAB, "embedding_size": EMBEDDINGS, "max_sequence_length": 512,
              "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(0)
    tensors = {"model.transformer.wte.weight": torch.randn(EMBEDDINGS, D_MODEL, generator=g)}
    for i in range(LAYERS):
        block = f"model.transformer.blocks.{i}"
        tensors[f"{block}.att_proj.weight"] = torch.randn(3 * D_MODEL, D_MODEL, generator=g)
        tensors[f"{block}.attn_out.weight"] = torch.randn(D_MODEL, D_MODEL, generator=g)
        tensors[f"{block}.ff_proj.weight"] = torch.randn(2 * FFN, D_MODEL, generator=g)
        tensors[f"{block}.ff_out.weight"] = torch.randn(D_MODEL, FFN, generator=g)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    spec = out.parent / f"{out.name}.spec.toml"
    spec.write_text(SPEC)
    return out, spec


CONFIGURATION = """from transformers import PretrainedConfig


class OlmolabConfig(PretrainedConfig):
    model_type = "olmolab"

    def __init__(self, d_model=128, n_heads=2, n_layers=2, mlp_ratio=8, vocab_size=1000, embedding_size=1024,
                 max_sequence_length=512, rope_theta=10000.0, layer_norm_eps=1e-5, weight_tying=True, **kwargs):
        self.d_model = d_model
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.mlp_ratio = mlp_ratio
        self.vocab_size = vocab_size
        self.embedding_size = embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope_theta = rope_theta
        self.layer_norm_eps = layer_norm_eps
        self.weight_tying = weight_tying
        super().__init__(tie_word_embeddings=False, **kwargs)

    @property
    def num_hidden_layers(self):
        return self.n_layers

    @property
    def hidden_size(self):
        return self.d_model

    @property
    def num_attention_heads(self):
        return self.n_heads
"""

MODELING = """import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_olmolab import OlmolabConfig


class WeightlessLayerNorm(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.eps = config.layer_norm_eps
        self.size = config.d_model

    def forward(self, x):
        return F.layer_norm(x, (self.size,), None, None, self.eps)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class OlmolabBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.head_dim = config.d_model // config.n_heads
        self.theta = config.rope_theta
        hidden = config.mlp_ratio * config.d_model
        self.attn_norm = WeightlessLayerNorm(config)
        self.ff_norm = WeightlessLayerNorm(config)
        self.att_proj = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.attn_out = nn.Linear(config.d_model, config.d_model, bias=False)
        self.ff_proj = nn.Linear(config.d_model, hidden, bias=False)
        self.ff_out = nn.Linear(hidden // 2, config.d_model, bias=False)

    def rotary(self, q, k):
        seq = q.shape[-2]
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.att_proj(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.rotary(q, k)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_out(att.transpose(1, 2).reshape(b, s, d))
        h = self.ff_proj(self.ff_norm(x))
        h, gate = h.chunk(2, dim=-1)
        return x + self.ff_out(F.silu(gate) * h)


class OlmolabForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = OlmolabConfig
    base_model_prefix = "model"

    def __init__(self, config):
        super().__init__(config)
        self.model = nn.Module()
        self.model.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.embedding_size, config.d_model),
            blocks=nn.ModuleList([OlmolabBlock(config) for _ in range(config.n_layers)]),
            ln_f=WeightlessLayerNorm(config),
        ))
        self.post_init()

    def forward(self, input_ids=None, **kwargs):
        x = self.model.transformer.wte(input_ids)
        for block in self.model.transformer.blocks:
            x = block(x)
        x = self.model.transformer.ln_f(x)
        logits = F.linear(x, self.model.transformer.wte.weight)
        return CausalLMOutputWithPast(logits=logits)
"""


def build_with_code(out: Path, *, seed: int = 0, std: float = 0.08) -> tuple[Path, Path]:
    """A checkpoint of OLMo v1's layout whose remote code (ours) transformers runs, and its spec file."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True)
    (out / "configuration_olmolab.py").write_text(CONFIGURATION)
    (out / "modeling_olmolab.py").write_text(MODELING)
    config = {"architectures": ["OlmolabForCausalLM"], "model_type": "olmolab", "d_model": D_MODEL, "n_heads": HEADS,
              "n_layers": LAYERS, "mlp_ratio": 2 * FFN // D_MODEL, "vocab_size": VOCAB, "embedding_size": EMBEDDINGS,
              "max_sequence_length": 512, "rope_theta": 10000.0, "layer_norm_eps": 1e-5, "weight_tying": True,
              "torch_dtype": "float32",
              "auto_map": {"AutoConfig": "configuration_olmolab.OlmolabConfig",
                           "AutoModelForCausalLM": "modeling_olmolab.OlmolabForCausalLM"}}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out, trust_remote_code=True),
                                             trust_remote_code=True)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0, std)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    spec = out.parent / f"{out.name}.spec.toml"
    spec.write_text(SPEC)
    return out, spec
