# Copyright 2026 Kestrel Labs. Released under the Apache License 2.0.
"""Kestrel: a decoder whose blocks run attention and the feed-forward side by side.

Each block normalizes its input once and feeds the same normalized activations to both
branches; both outputs are added to the residual stream:

    h = x + attn(ln(x)) + ffn(ln(x))
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, CausalLMOutput

from .configuration_kestrel import KestrelConfig


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class KestrelRotary(nn.Module):
    """Rotary position embedding; the frequencies are computed on the fly (no buffers to load)."""

    def __init__(self, head_dim, base):
        super().__init__()
        self.head_dim = head_dim
        self.base = base

    def forward(self, positions, dtype):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        freqs = positions.float()[:, :, None] * inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


class KestrelAttention(nn.Module):
    def __init__(self, config: KestrelConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.n_kv_heads
        self.head_dim = config.d_hidden // config.n_heads
        self.wq = nn.Linear(config.d_hidden, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.d_hidden, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(config.d_hidden, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, config.d_hidden, bias=False)
        self.rotary = KestrelRotary(self.head_dim, config.rotary_base)

    def forward(self, x, positions):
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary(positions, q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, -1))


class KestrelFFN(nn.Module):
    def __init__(self, config: KestrelConfig):
        super().__init__()
        self.w_in = nn.Linear(config.d_hidden, config.d_ffn, bias=config.ffn_bias)
        self.w_out = nn.Linear(config.d_ffn, config.d_hidden, bias=config.ffn_bias)

    def forward(self, x):
        return self.w_out(F.gelu(self.w_in(x), approximate="tanh"))


class KestrelBlock(nn.Module):
    def __init__(self, config: KestrelConfig):
        super().__init__()
        self.ln = nn.LayerNorm(config.d_hidden, eps=config.ln_eps)
        self.attn = KestrelAttention(config)
        self.ffn = KestrelFFN(config)

    def forward(self, x, positions):
        h = self.ln(x)
        return x + self.attn(h, positions) + self.ffn(h)


class KestrelPreTrainedModel(PreTrainedModel):
    config_class = KestrelConfig
    base_model_prefix = "kestrel"
    _no_split_modules = ["KestrelBlock"]
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            module.weight.data.fill_(1.0)
            module.bias.data.zero_()


class KestrelModel(KestrelPreTrainedModel):
    def __init__(self, config: KestrelConfig):
        super().__init__(config)
        self.tok_emb = nn.Embedding(config.n_vocab, config.d_hidden)
        self.blocks = nn.ModuleList([KestrelBlock(config) for _ in range(config.n_blocks)])
        self.final_ln = nn.LayerNorm(config.d_hidden, eps=config.ln_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.tok_emb

    def set_input_embeddings(self, value):
        self.tok_emb = value

    def forward(self, input_ids, position_ids=None, **kwargs):
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)[None].expand_as(input_ids)
        x = self.tok_emb(input_ids)
        for block in self.blocks:
            x = block(x, position_ids)
        return BaseModelOutput(last_hidden_state=self.final_ln(x))


class KestrelForCausalLM(KestrelPreTrainedModel, GenerationMixin):
    def __init__(self, config: KestrelConfig):
        super().__init__(config)
        self.kestrel = KestrelModel(config)
        self.lm_out = nn.Linear(config.d_hidden, config.n_vocab, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.kestrel.tok_emb

    def get_output_embeddings(self):
        return self.lm_out

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        # No KV cache: every step re-reads the whole sequence.
        return {"input_ids": input_ids}

    def forward(self, input_ids: torch.LongTensor, position_ids: Optional[torch.LongTensor] = None,
                labels: Optional[torch.LongTensor] = None, **kwargs):
        hidden = self.kestrel(input_ids, position_ids=position_ids).last_hidden_state
        logits = self.lm_out(hidden).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))
        return CausalLMOutput(loss=loss, logits=logits)
