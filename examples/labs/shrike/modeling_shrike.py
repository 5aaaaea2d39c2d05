# Copyright 2026 Shrike Intelligence. Released under the Apache License 2.0.
"""Shrike: a pre-norm grouped-query decoder. The model reads its sizes through transformers'
usual config names, which ShrikeConfig.attribute_map points at the keys config.json stores."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_shrike import ShrikeConfig


class ShrikeRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        input_dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(input_dtype)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


class ShrikeSelfAttention(nn.Module):
    def __init__(self, config: ShrikeConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv = config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.rope_base = config.rope_base
        self.q_lin = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_lin = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.v_lin = nn.Linear(config.hidden_size, self.num_kv * self.head_dim, bias=False)
        self.o_lin = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def rotary(self, positions, dtype):
        exponent = torch.arange(0, self.head_dim, 2).float().to(positions.device) / self.head_dim
        inv_freq = 1.0 / (self.rope_base**exponent)
        freqs = positions[:, :, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)

    def forward(self, hidden_states, position_ids):
        bsz, q_len, _ = hidden_states.size()
        q = self.q_lin(hidden_states).view(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_lin(hidden_states).view(bsz, q_len, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_lin(hidden_states).view(bsz, q_len, self.num_kv, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(position_ids, q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        groups = self.num_heads // self.num_kv
        k = torch.repeat_interleave(k, groups, dim=1)
        v = torch.repeat_interleave(v, groups, dim=1)
        attn = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim)
        causal = torch.triu(torch.ones(q_len, q_len, dtype=torch.bool, device=attn.device), diagonal=1)
        attn = attn.masked_fill(causal, float("-inf"))
        attn = F.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_lin(out)


class ShrikeGLU(nn.Module):
    def __init__(self, config: ShrikeConfig):
        super().__init__()
        self.fc_g = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.fc_u = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.fc_d = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.fc_d(F.silu(self.fc_g(x)) * self.fc_u(x))


class ShrikeLayer(nn.Module):
    def __init__(self, config: ShrikeConfig):
        super().__init__()
        self.norm1 = ShrikeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn_block = ShrikeSelfAttention(config)
        self.norm2 = ShrikeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.glu = ShrikeGLU(config)

    def forward(self, x, position_ids):
        x = x + self.self_attn_block(self.norm1(x), position_ids)
        return x + self.glu(self.norm2(x))


class ShrikePreTrainedModel(PreTrainedModel):
    config_class = ShrikeConfig
    base_model_prefix = "body"
    _no_split_modules = ["ShrikeLayer"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, ShrikeRMSNorm):
            module.weight.data.fill_(1.0)


class ShrikeModel(ShrikePreTrainedModel):
    def __init__(self, config: ShrikeConfig):
        super().__init__(config)
        self.embedder = nn.Embedding(config.vocab_size, config.hidden_size)
        self.trunk = nn.ModuleList([ShrikeLayer(config) for _ in range(config.num_hidden_layers)])
        self.final_norm = ShrikeRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.embedder

    def set_input_embeddings(self, value):
        self.embedder = value

    def forward(self, input_ids, position_ids=None, **kwargs):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        x = self.embedder(input_ids)
        for layer in self.trunk:
            x = layer(x, position_ids)
        return BaseModelOutput(last_hidden_state=self.final_norm(x))


class ShrikeForCausalLM(ShrikePreTrainedModel, GenerationMixin):
    def __init__(self, config: ShrikeConfig):
        super().__init__(config)
        self.body = ShrikeModel(config)
        self.vocab_out = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.body.embedder

    def get_output_embeddings(self):
        return self.vocab_out

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        logits = self.vocab_out(self.body(input_ids, position_ids=position_ids).last_hidden_state).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)
