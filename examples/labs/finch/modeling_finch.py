# Copyright 2026 Finch Research. Released under the Apache License 2.0.
"""Finch: a pre-norm grouped-query decoder whose SwiGLU runs on one fused input projection.

``ffn.w_in`` feeds ``swiglu``, the reference path of the lab's fused kernel, which takes the two
halves of its input by position (see ``swiglu``).
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_finch import FinchConfig


class FinchNorm(nn.Module):
    """Root-mean-square layer norm."""

    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        norm = x.float().pow(2).mean(-1, keepdim=True).add(self.eps).rsqrt()
        return (x.float() * norm).type_as(x) * self.weight


class FinchRoPE(nn.Module):
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


class FinchAttention(nn.Module):
    def __init__(self, config: FinchConfig):
        super().__init__()
        self.q_heads, self.kv_heads = config.n_qh, config.n_kv
        self.head_dim = config.hidden // config.n_qh
        self.q = nn.Linear(config.hidden, self.q_heads * self.head_dim, bias=False)
        self.k = nn.Linear(config.hidden, self.kv_heads * self.head_dim, bias=False)
        self.v = nn.Linear(config.hidden, self.kv_heads * self.head_dim, bias=False)
        self.out = nn.Linear(self.q_heads * self.head_dim, config.hidden, bias=False)
        self.rope = FinchRoPE(self.head_dim, config.rope_theta_base)

    def forward(self, x, positions):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, self.q_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, k, positions)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


def swiglu(h):
    """Reference path of the fused SwiGLU kernel: the input holds two halves; the kernel's layout puts the
    value half first and the half it activates second."""
    halves = h.unflatten(-1, (2, -1))
    return halves.select(-2, 0) * F.silu(halves.select(-2, 1))


class FinchFFN(nn.Module):
    def __init__(self, config: FinchConfig):
        super().__init__()
        self.w_in = nn.Linear(config.hidden, 2 * config.ffn_hidden, bias=False)
        self.w_out = nn.Linear(config.ffn_hidden, config.hidden, bias=False)

    def forward(self, x):
        return self.w_out(swiglu(self.w_in(x)))


class FinchBlock(nn.Module):
    def __init__(self, config: FinchConfig):
        super().__init__()
        self.pre_attn_norm = FinchNorm(config.hidden, config.norm_eps)
        self.attn = FinchAttention(config)
        self.pre_ffn_norm = FinchNorm(config.hidden, config.norm_eps)
        self.ffn = FinchFFN(config)

    def forward(self, x, positions):
        x = x + self.attn(self.pre_attn_norm(x), positions)
        return x + self.ffn(self.pre_ffn_norm(x))


class FinchPreTrainedModel(PreTrainedModel):
    config_class = FinchConfig
    base_model_prefix = "net"
    _no_split_modules = ["FinchBlock"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.init_std)
        elif isinstance(module, FinchNorm):
            nn.init.ones_(module.weight)


class FinchModel(FinchPreTrainedModel):
    def __init__(self, config: FinchConfig):
        super().__init__(config)
        self.emb = nn.Embedding(config.n_tok, config.hidden)
        self.h = nn.ModuleList(FinchBlock(config) for _ in range(config.n_stack))
        self.norm_final = FinchNorm(config.hidden, config.norm_eps)
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


class FinchForCausalLM(FinchPreTrainedModel, GenerationMixin):
    def __init__(self, config: FinchConfig):
        super().__init__(config)
        self.net = FinchModel(config)
        self.logits_proj = nn.Linear(config.hidden, config.n_tok, bias=False)
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
