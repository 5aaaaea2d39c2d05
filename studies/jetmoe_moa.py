"""JetMoE's mixture of attention heads (MoA), computed the way a vLLM port would, against transformers' own module.

The design check the port (the routed_attention partial) was written from. transformers' JetMoeAttention (float32, eager, real module with random weights)
is run on random hidden states; beside it, the same weights go through the computation a generated vLLM model
would run, in plain torch:

- the router: logits of a replicated linear (float), top-k, softmax over the k chosen (JetMoeTopKGating's order);
- the queries (the MoA's map): for each expert, the tokens that chose it times that expert's input_linear rows
  (a loop over experts, each a dense matmul over its tokens: what FusedMoE cannot do, since it always applies the
  activation and the second projection), placed at the slot the token chose it in;
- keys and values: kv_proj's two halves, shared by the k slots;
- the heads: transformers views the queries [tokens, k, kv heads, head_dim] and tiles the keys with
  `repeat(1, top_k, 1, 1)`, so query head j * kv_heads + h reads KV head h; vLLM's attention reads KV head
  i // (heads / kv_heads) for query head i (grouped, repeat_interleave), so the port permutes its queries to
  [tokens, kv heads, k, head_dim] before the attention and its output back after it;
- rotary (NeoX, rotate_half) on every query head and on the keys, at the token positions;
- the output (the MoA's reduce): each slot's head outputs through its expert's output_linear, weighted by the
  gate, summed, plus the bias.

Under tensor parallelism (simulated): rank r keeps KV heads [r * kv / tp, (r + 1) * kv / tp), the rows of every
expert's input_linear and of kv_proj's two halves for those heads, and the columns of every expert's
output_linear for them; the router is replicated; the ranks' outputs are summed (all-reduce) and the bias added
once.

    python studies/jetmoe_moa.py [--tokens 37] [--tp 2]

Prints the max |difference| of the port's form against transformers' output, at TP 1 and under the simulated TP.
"""

from __future__ import annotations

import argparse

import torch
from transformers import JetMoeConfig
from transformers.models.jetmoe.modeling_jetmoe import JetMoeAttention, JetMoeRotaryEmbedding


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def neox_rope(x: torch.Tensor, positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """[tokens, heads, head_dim] rotated as vLLM's RotaryEmbedding (is_neox_style) does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    freqs = positions[:, None].float() * inv_freq
    cos, sin = torch.cat((freqs, freqs), -1).cos()[:, None, :], torch.cat((freqs, freqs), -1).sin()[:, None, :]
    return x * cos + rotate_half(x) * sin


def grouped_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """vLLM's attention for one sequence: query head i reads KV head i // (heads / kv_heads); causal."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def port_moa(x, positions, w, cfg, kv_heads: range, permute: bool = True) -> torch.Tensor:
    """One rank's share of the MoA's output (before the all-reduce and the bias), for the KV heads it holds."""
    k_top, d, kv_all = cfg.num_experts_per_tok, cfg.kv_channels, cfg.num_key_value_heads
    rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in kv_heads])
    n, heads = x.shape[0], len(kv_heads)
    logits = (x @ w["router"].T).float()
    top_logits, chosen = logits.topk(k_top, dim=-1)
    gates = top_logits.softmax(-1).to(x.dtype)
    # The map: one dense matmul per expert over the (token, slot) pairs that chose it.
    q = x.new_zeros(n, k_top, heads * d)
    for e in range(cfg.num_local_experts):
        tok, slot = (chosen == e).nonzero(as_tuple=True)
        if tok.numel():
            q[tok, slot] = x[tok] @ w["q"][e][rows].T
    kv = x @ w["kv"].T
    key, value = kv[:, :kv_all * d][:, rows], kv[:, kv_all * d:][:, rows]
    # [tokens, k, kv, d] -> [tokens, kv, k, d]: head h * k + j reads KV head h, as vLLM's grouped attention does.
    q = q.view(n, k_top, heads, d).transpose(1, 2) if permute else q.view(n, k_top, heads, d)
    q = q.reshape(n, heads * k_top, d)
    q = neox_rope(q, positions, d, cfg.rope_parameters["rope_theta"])
    key = neox_rope(key.view(n, heads, d), positions, d, cfg.rope_parameters["rope_theta"])
    o = grouped_causal_attention(q, key, value.view(n, heads, d), d ** -0.5)
    o = o.view(n, heads, k_top, d).transpose(1, 2) if permute else o.view(n, k_top, heads, d)
    o = o.reshape(n, k_top, heads * d)
    # The reduce: each slot through its expert's output columns for these heads, weighted by its gate.
    out = x.new_zeros(n, x.shape[1])
    for e in range(cfg.num_local_experts):
        tok, slot = (chosen == e).nonzero(as_tuple=True)
        if tok.numel():
            out.index_add_(0, tok, (o[tok, slot] @ w["o"][e][:, rows].T) * gates[tok, slot, None])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=37)
    parser.add_argument("--tp", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    cfg = JetMoeConfig(hidden_size=128, kv_channels=32, num_key_value_heads=4, num_local_experts=6,
                       num_experts_per_tok=2, intermediate_size=64, num_hidden_layers=1, vocab_size=64)
    cfg._attn_implementation = "eager"
    attn = JetMoeAttention(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.1)
    x = torch.randn(1, args.tokens, cfg.hidden_size)
    positions = torch.arange(args.tokens)
    cos, sin = JetMoeRotaryEmbedding(cfg)(x, positions[None])
    mask = torch.full((args.tokens, args.tokens), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        reference = attn(x, attention_mask=mask, position_embeddings=(cos, sin))[0][0]
        w = {"router": attn.experts.router.layer.weight, "q": attn.experts.input_linear.weight,
             "o": attn.experts.output_linear.weight, "kv": attn.kv_proj.weight}
        kv = cfg.num_key_value_heads
        whole = port_moa(x[0], positions, w, cfg, range(kv)) + attn.experts.bias
        per_rank = kv // args.tp
        ranks = sum(port_moa(x[0], positions, w, cfg, range(r * per_rank, (r + 1) * per_rank))
                    for r in range(args.tp)) + attn.experts.bias
        # Control: the queries handed to vLLM's grouped attention in transformers' order (no permutation).
        unpermuted = port_moa(x[0], positions, w, cfg, range(kv), permute=False) + attn.experts.bias
    print(f"heads: {cfg.num_attention_heads} query heads = top_k {cfg.num_experts_per_tok} x {kv} KV heads, "
          f"head_dim {cfg.kv_channels}; {args.tokens} tokens; output |max| {reference.abs().max():.3f}")
    print(f"TP 1: max |port - transformers| = {(whole - reference).abs().max():.3e}")
    print(f"control, queries not permuted: max |port - transformers| = {(unpermuted - reference).abs().max():.3e}")
    print(f"TP {args.tp} (simulated, KV heads split): max |port - transformers| = {(ranks - reference).abs().max():.3e}")


if __name__ == "__main__":
    main()
