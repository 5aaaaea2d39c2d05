# Copyright 2026 Plover Systems. Released under the Apache License 2.0.
"""Plover: a pre-norm decoder with ALiBi attention biases and muP multipliers (no rotary)."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_plover import PloverConfig


class PloverRMSNorm(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        variance = hidden_states.float().pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states


def alibi_slopes(n_heads):
    """The ALiBi paper's geometric slopes (with its interpolation for head counts that are not powers of 2)."""

    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n_heads).is_integer():
        return power_of_2(n_heads)
    closest = 2 ** math.floor(math.log2(n_heads))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n_heads - closest]


class PloverAttention(nn.Module):
    def __init__(self, config: PloverConfig):
        super().__init__()
        self.n_heads = config.attn_heads
        self.head_dim = config.embed_dim // config.attn_heads
        self.scale = config.mup_attn_mult
        self.proj_q = nn.Linear(config.embed_dim, config.embed_dim, bias=False)
        self.proj_k = nn.Linear(config.embed_dim, config.embed_dim, bias=False)
        self.proj_v = nn.Linear(config.embed_dim, config.embed_dim, bias=False)
        self.proj_o = nn.Linear(config.embed_dim, config.embed_dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.proj_q(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.proj_k(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.proj_v(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        # ALiBi: each head penalizes distance linearly, with its own slope
        slopes = torch.tensor(alibi_slopes(self.n_heads), dtype=scores.dtype, device=x.device)
        pos = torch.arange(t, device=x.device)
        distance = (pos[None, :] - pos[:, None]).to(scores.dtype)  # key - query: <= 0 where attended
        scores = scores + slopes[:, None, None] * distance[None]
        scores = scores.masked_fill(pos[None, :] > pos[:, None], torch.finfo(scores.dtype).min)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, -1)
        return self.proj_o(out)


class PloverMLP(nn.Module):
    def __init__(self, config: PloverConfig):
        super().__init__()
        self.fc_gate = nn.Linear(config.embed_dim, config.mlp_dim, bias=False)
        self.fc_up = nn.Linear(config.embed_dim, config.mlp_dim, bias=False)
        self.fc_down = nn.Linear(config.mlp_dim, config.embed_dim, bias=False)

    def forward(self, x):
        return self.fc_down(F.silu(self.fc_gate(x)) * self.fc_up(x))


class PloverBlock(nn.Module):
    def __init__(self, config: PloverConfig):
        super().__init__()
        self.res_mult = config.mup_res_mult
        self.norm_a = PloverRMSNorm(config.embed_dim, config.norm_epsilon)
        self.attn = PloverAttention(config)
        self.norm_m = PloverRMSNorm(config.embed_dim, config.norm_epsilon)
        self.mlp = PloverMLP(config)

    def forward(self, x):
        x = x + self.attn(self.norm_a(x)) * self.res_mult
        x = x + self.mlp(self.norm_m(x)) * self.res_mult
        return x


class PloverPreTrainedModel(PreTrainedModel):
    config_class = PloverConfig
    base_model_prefix = "transformer"
    _no_split_modules = ["PloverBlock"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(mean=0.0, std=self.config.init_std)
        elif isinstance(module, PloverRMSNorm):
            module.weight.data.fill_(1.0)


class PloverModel(PloverPreTrainedModel):
    def __init__(self, config: PloverConfig):
        super().__init__(config)
        self.wtok = nn.Embedding(config.vocab_sz, config.embed_dim)
        self.stack = nn.ModuleList([PloverBlock(config) for _ in range(config.num_blocks)])
        self.norm_out = PloverRMSNorm(config.embed_dim, config.norm_epsilon)
        self.post_init()

    def get_input_embeddings(self):
        return self.wtok

    def set_input_embeddings(self, value):
        self.wtok = value

    def forward(self, input_ids, **kwargs):
        x = self.wtok(input_ids) * self.config.mup_emb_mult
        for block in self.stack:
            x = block(x)
        return BaseModelOutput(last_hidden_state=self.norm_out(x))


class PloverForCausalLM(PloverPreTrainedModel, GenerationMixin):
    def __init__(self, config: PloverConfig):
        super().__init__(config)
        self.transformer = PloverModel(config)
        self.output = nn.Linear(config.embed_dim, config.vocab_sz, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.wtok

    def get_output_embeddings(self):
        return self.output

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids}

    def forward(self, input_ids, labels=None, **kwargs):
        hidden = self.transformer(input_ids).last_hidden_state
        logits = self.output(hidden) / self.config.mup_logit_div
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return CausalLMOutput(loss=loss, logits=logits)
