"""LabDM modeling code (remote code, loaded with ``trust_remote_code=True``).

A pre-norm decoder (RMSNorm, NeoX-style rotary embeddings, multi-head
attention, a SwiGLU feed-forward), with the module names a lab picks when it
does not start from transformers: ``transformer.tok_emb``,
``transformer.blocks.N.attn.{wq,wk,wv,wo}``, ``transformer.blocks.N.ffn.{w_gate,w_in,w_out}``,
``transformer.norm_f``. There is no KV cache: every call recomputes the sequence.
"""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_labdm import LabDMConfig


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(config, seq_len, device, dtype):
    head = config.d_model // config.n_heads
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, head, 2, device=device, dtype=torch.float32) / head))
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.n_heads = config.n_heads
        self.head = config.d_model // config.n_heads
        self.wq = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wk = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wv = nn.Linear(config.d_model, config.d_model, bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x, cos, sin, pad_mask=None):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, self.n_heads, self.head).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        scores = (q @ k.transpose(-1, -2)) / self.head**0.5
        visible = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()[None, None]
        if pad_mask is not None:  # [batch, seq], 1 = a real token
            visible = visible & pad_mask[:, None, None, :].bool()
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)
        out = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_gate = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w_in = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.w_out = nn.Linear(config.d_ff, config.d_model, bias=False)

    def forward(self, x):
        return self.w_out(F.silu(self.w_gate(x)) * self.w_in(x))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.ffn = FeedForward(config)

    def forward(self, x, cos, sin, pad_mask=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, pad_mask)
        return x + self.ffn(self.ffn_norm(x))


class LabDMPreTrainedModel(PreTrainedModel):
    config_class = LabDMConfig
    base_model_prefix = "transformer"

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.init_std)


class LabDMModel(LabDMPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_f = RMSNorm(config.d_model, config.norm_eps)
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        x = self.tok_emb(input_ids)
        cos, sin = rope_tables(self.config, input_ids.shape[1], x.device, x.dtype)
        for block in self.blocks:
            x = block(x, cos, sin, attention_mask)
        return self.norm_f(x)


class LabDMForCausalLM(LabDMPreTrainedModel, GenerationMixin):
    def __init__(self, config):
        super().__init__(config)
        self.transformer = LabDMModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.transformer.tok_emb

    def set_input_embeddings(self, value):
        self.transformer.tok_emb = value

    def get_output_embeddings(self):
        return self.lm_head

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}  # no KV cache: the whole sequence

    def forward(self, input_ids, attention_mask=None, **kwargs):
        return CausalLMOutputWithPast(logits=self.lm_head(self.transformer(input_ids, attention_mask=attention_mask)))
