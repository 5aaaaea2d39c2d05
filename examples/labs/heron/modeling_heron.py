# Copyright 2026 Heron Research. Released under the Apache License 2.0.
"""Heron: a grouped-query decoder with one fused q/k/v projection laid out per key/value group.

The fused ``attn.qkv`` weight holds, for each KV group in turn, that group's query heads,
then its key head, then its value head (rows of head_dim each).
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_heron import HeronConfig


class HeronRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def precompute_freqs(head_dim, positions, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    freqs = torch.einsum("bs,d->bsd", positions.float(), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos()[:, None], emb.sin()[:, None]


def apply_rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class HeronAttention(nn.Module):
    def __init__(self, config: HeronConfig):
        super().__init__()
        self.n_q_heads = config.n_q_heads
        self.kv_groups = config.kv_groups
        self.q_per_kv = config.n_q_heads // config.kv_groups
        self.head_dim = config.dim // config.n_q_heads
        self.theta = config.theta
        self.qkv = nn.Linear(config.dim, (self.n_q_heads + 2 * self.kv_groups) * self.head_dim, bias=False)
        self.proj = nn.Linear(self.n_q_heads * self.head_dim, config.dim, bias=False)

    def forward(self, x, positions):
        bsz, seqlen, _ = x.shape
        fused = self.qkv(x).view(bsz, seqlen, self.kv_groups, self.q_per_kv + 2, self.head_dim)
        q = fused[..., : self.q_per_kv, :].reshape(bsz, seqlen, self.n_q_heads, self.head_dim)
        k = fused[..., -2, :]
        v = fused[..., -1, :]
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = precompute_freqs(self.head_dim, positions, self.theta)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k = k[:, :, None].expand(-1, -1, self.q_per_kv, -1, -1).reshape(bsz, self.n_q_heads, seqlen, self.head_dim)
        v = v[:, :, None].expand(-1, -1, self.q_per_kv, -1, -1).reshape(bsz, self.n_q_heads, seqlen, self.head_dim)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype))
        return self.proj(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class HeronFeedForward(nn.Module):
    def __init__(self, config: HeronConfig):
        super().__init__()
        self.gate_lin = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.up_lin = nn.Linear(config.dim, config.hidden_dim, bias=False)
        self.down_lin = nn.Linear(config.hidden_dim, config.dim, bias=False)

    def forward(self, x):
        return self.down_lin(F.silu(self.gate_lin(x)) * self.up_lin(x))


class HeronBlock(nn.Module):
    def __init__(self, config: HeronConfig):
        super().__init__()
        self.attn_in_norm = HeronRMSNorm(config.dim, eps=config.rms_eps)
        self.attn = HeronAttention(config)
        self.ffn_in_norm = HeronRMSNorm(config.dim, eps=config.rms_eps)
        self.ffn = HeronFeedForward(config)

    def forward(self, x, positions):
        x = x + self.attn(self.attn_in_norm(x), positions)
        return x + self.ffn(self.ffn_in_norm(x))


class HeronPreTrainedModel(PreTrainedModel):
    config_class = HeronConfig
    base_model_prefix = "backbone"
    _no_split_modules = ["HeronBlock"]

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, HeronRMSNorm):
            module.weight.data.fill_(1.0)


class HeronModel(HeronPreTrainedModel):
    def __init__(self, config: HeronConfig):
        super().__init__(config)
        self.embed = nn.Embedding(config.n_words, config.dim)
        self.blocks = nn.ModuleList([HeronBlock(config) for _ in range(config.n_blocks)])
        self.out_norm = HeronRMSNorm(config.dim, eps=config.rms_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def forward(self, input_ids, position_ids: Optional[torch.LongTensor] = None, **kwargs):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        h = self.embed(input_ids)
        for block in self.blocks:
            h = block(h, position_ids)
        return BaseModelOutput(last_hidden_state=self.out_norm(h))


class HeronForCausalLM(HeronPreTrainedModel, GenerationMixin):
    def __init__(self, config: HeronConfig):
        super().__init__(config)
        self.backbone = HeronModel(config)
        self.head = nn.Linear(config.dim, config.n_words, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.backbone.embed

    def get_output_embeddings(self):
        return self.head

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        logits = self.head(self.backbone(input_ids, position_ids=position_ids).last_hidden_state).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)
