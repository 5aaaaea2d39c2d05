# Copyright 2026 Wren Labs. Released under the Apache License 2.0.
"""Wren: a pre-norm grouped-query decoder whose SwiGLU keeps up and gate in one fused projection.

``ffn.w_in`` stores the up rows first and the gate rows second; the gate (the half that goes
through SiLU) is the second chunk.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_wren import WrenConfig


class WrenNorm(nn.Module):
    """Root-mean-square layer norm."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        norm = x.float().pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt()
        return (x.float() * norm).type_as(x) * self.scale


class WrenRoPE(nn.Module):
    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim = head_dim
        self.base = base

    def forward(self, q, k, positions):
        exponent = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=q.device) / self.head_dim
        inv_freq = self.base**-exponent
        angles = positions[..., None].float() * inv_freq
        cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None].to(q.dtype)
        sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None].to(q.dtype)

        def rot(x):
            x1, x2 = x[..., : self.head_dim // 2], x[..., self.head_dim // 2 :]
            return torch.cat([-x2, x1], -1)

        return q * cos + rot(q) * sin, k * cos + rot(k) * sin


class WrenAttention(nn.Module):
    def __init__(self, config: WrenConfig):
        super().__init__()
        self.q_heads, self.kv_heads = config.q_heads, config.kv_heads
        self.head_dim = config.model_dim // config.q_heads
        self.q = nn.Linear(config.model_dim, self.q_heads * self.head_dim, bias=False)
        self.k = nn.Linear(config.model_dim, self.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(config.model_dim, self.kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(self.q_heads * self.head_dim, config.model_dim, bias=False)
        self.rope = WrenRoPE(self.head_dim, config.rope_freq_base)

    def forward(self, x, positions):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.q_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, k, positions)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class WrenFFN(nn.Module):
    def __init__(self, config: WrenConfig):
        super().__init__()
        self.w_in = nn.Linear(config.model_dim, 2 * config.ff_dim, bias=False)
        self.w_out = nn.Linear(config.ff_dim, config.model_dim, bias=False)

    def forward(self, x):
        up, gate = self.w_in(x).chunk(2, dim=-1)
        return self.w_out(up * F.silu(gate))


class WrenBlock(nn.Module):
    def __init__(self, config: WrenConfig):
        super().__init__()
        self.pre_attn_norm = WrenNorm(config.model_dim, config.eps)
        self.attn = WrenAttention(config)
        self.pre_ffn_norm = WrenNorm(config.model_dim, config.eps)
        self.ffn = WrenFFN(config)

    def forward(self, x, positions):
        x = x + self.attn(self.pre_attn_norm(x), positions)
        return x + self.ffn(self.pre_ffn_norm(x))


class WrenPreTrainedModel(PreTrainedModel):
    config_class = WrenConfig
    base_model_prefix = "net"
    _no_split_modules = ["WrenBlock"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.init_range)
        elif isinstance(module, WrenNorm):
            nn.init.ones_(module.scale)


class WrenModel(WrenPreTrainedModel):
    def __init__(self, config: WrenConfig):
        super().__init__(config)
        self.emb = nn.Embedding(config.tokens, config.model_dim)
        self.h = nn.ModuleList(WrenBlock(config) for _ in range(config.blocks))
        self.norm_final = WrenNorm(config.model_dim, config.eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.emb

    def set_input_embeddings(self, value):
        self.emb = value

    def forward(self, input_ids, position_ids=None, **kwargs):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[-1], device=input_ids.device).unsqueeze(0)
        x = self.emb(input_ids)
        for block in self.h:
            x = block(x, position_ids)
        return BaseModelOutput(last_hidden_state=self.norm_final(x))


class WrenForCausalLM(WrenPreTrainedModel, GenerationMixin):
    def __init__(self, config: WrenConfig):
        super().__init__(config)
        self.net = WrenModel(config)
        self.logits_proj = nn.Linear(config.model_dim, config.tokens, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.net.emb

    def get_output_embeddings(self):
        return self.logits_proj

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        logits = self.logits_proj(self.net(input_ids, position_ids=position_ids).last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)
