# Copyright 2026 Osprey AI. Released under the MIT License.
"""Osprey: a GPT-2 style decoder (Conv1D projections, learned absolute positions, pre-LayerNorm)."""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_osprey import OspreyConfig


class Conv1D(nn.Module):
    """A linear layer that stores its weight transposed, [in_features, out_features] (as GPT-2 did)."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.empty(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def new_gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class OspreyAttention(nn.Module):
    def __init__(self, config: OspreyConfig):
        super().__init__()
        self.n_head = config.heads
        self.head_dim = config.width // config.heads
        self.c_attn = Conv1D(3 * config.width, config.width)
        self.c_out = Conv1D(config.width, config.width)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~causal, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_out(y)


class OspreyMLP(nn.Module):
    def __init__(self, config: OspreyConfig):
        super().__init__()
        self.c_up = Conv1D(config.mlp_ratio * config.width, config.width)
        self.c_down = Conv1D(config.width, config.mlp_ratio * config.width)

    def forward(self, x):
        return self.c_down(new_gelu(self.c_up(x)))


class OspreyLayer(nn.Module):
    def __init__(self, config: OspreyConfig):
        super().__init__()
        self.pre_attn = nn.LayerNorm(config.width, eps=config.eps_ln)
        self.attention = OspreyAttention(config)
        self.pre_mlp = nn.LayerNorm(config.width, eps=config.eps_ln)
        self.mlp = OspreyMLP(config)

    def forward(self, x):
        x = x + self.attention(self.pre_attn(x))
        x = x + self.mlp(self.pre_mlp(x))
        return x


class OspreyPreTrainedModel(PreTrainedModel):
    config_class = OspreyConfig
    base_model_prefix = "osprey"
    _no_split_modules = ["OspreyLayer"]

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, Conv1D)):
            module.weight.data.normal_(mean=0.0, std=self.config.init_scale)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.config.init_scale)
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)


class OspreyModel(OspreyPreTrainedModel):
    def __init__(self, config: OspreyConfig):
        super().__init__(config)
        self.token_table = nn.Embedding(config.vocab, config.width)
        self.position_table = nn.Embedding(config.context_length, config.width)
        self.layers = nn.ModuleList([OspreyLayer(config) for _ in range(config.layers)])
        self.out_norm = nn.LayerNorm(config.width, eps=config.eps_ln)
        self.post_init()

    def get_input_embeddings(self):
        return self.token_table

    def set_input_embeddings(self, value):
        self.token_table = value

    def forward(self, input_ids, position_ids=None, **kwargs):
        t = input_ids.size(1)
        if t > self.config.context_length:
            raise ValueError(f"sequence of {t} tokens is longer than the context ({self.config.context_length})")
        if position_ids is None:
            position_ids = torch.arange(t, dtype=torch.long, device=input_ids.device)[None]
        x = self.token_table(input_ids) + self.position_table(position_ids)
        for layer in self.layers:
            x = layer(x)
        return BaseModelOutput(last_hidden_state=self.out_norm(x))


class OspreyLMHeadModel(OspreyPreTrainedModel, GenerationMixin):
    def __init__(self, config: OspreyConfig):
        super().__init__(config)
        self.osprey = OspreyModel(config)
        self.unembed = nn.Linear(config.width, config.vocab, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.osprey.token_table

    def get_output_embeddings(self):
        return self.unembed

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        return {"input_ids": input_ids[:, -self.config.context_length:]}

    def forward(self, input_ids, position_ids=None, labels=None, **kwargs):
        logits = self.unembed(self.osprey(input_ids, position_ids=position_ids).last_hidden_state)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)
