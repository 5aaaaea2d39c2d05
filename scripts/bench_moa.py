#!/usr/bin/env python
"""Speed of the routed attention's expert projections (JetMoE's mixture of attention heads), old form against new.

Usage: python scripts/bench_moa.py [--tokens 1,32,256,512] [--repeats 20]

The old form computed every expert's query rows for every token (a dense einsum over the experts, then a gather of
the chosen) and scattered the weighted outputs into every expert's slot before one einsum over all experts. The new
form (templates/package/__package__/_parts/routed_attention.py.j2's expert_bank, read from the template itself so
that this measures the code the ports run) groups the rows by expert and does one matmul per expert that has any.
Both run here on the same inputs at a jetmoe-8b-like shape (hidden 2048, 8 experts, top 2, 16 KV heads of 128):
the queries, then the output projection of the same attention output (the attention between them is the same in
both forms and left out). Prints each size's times, their ratio (old / new) and the largest difference of the two
outputs. CPU, float32.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

import torch

TEMPLATE = Path(__file__).resolve().parent.parent / "templates/package/__package__/_parts/routed_attention.py.j2"


def template_expert_bank():
    """The template's expert_bank function (plain Python between its def and the fake's)."""
    text = TEMPLATE.read_text()
    source = re.search(r"^def expert_bank\(.*?(?=^def expert_bank_fake)", text, re.S | re.M).group(0)
    namespace = {"torch": torch}
    exec(compile(source, str(TEMPLATE), "exec"), namespace)
    return namespace["expert_bank"]


def old_forward(hidden, chosen, gates, q_bank, o_bank, top_k):
    tokens, kv_size = hidden.shape[0], q_bank.shape[1]
    every = torch.einsum("th,erh->ter", hidden, q_bank)
    q = every.gather(1, chosen.unsqueeze(-1).expand(-1, -1, kv_size))
    attn_output = q  # [tokens, top_k, kv_size]: the attention itself is the same in both forms
    slots = attn_output.new_zeros(tokens, q_bank.shape[0], kv_size)
    slots.scatter_(1, chosen.unsqueeze(-1).expand(-1, -1, kv_size), attn_output * gates.unsqueeze(-1))
    return q, torch.einsum("ter,ehr->th", slots, o_bank)


def new_forward(expert_bank, hidden, chosen, gates, q_bank, o_bank, top_k):
    tokens, kv_size = hidden.shape[0], q_bank.shape[1]
    flat = chosen.reshape(-1)
    q = expert_bank(hidden, flat, q_bank, top_k).view(tokens, top_k, kv_size)
    attn_output = q * gates.unsqueeze(-1)
    out = expert_bank(attn_output.reshape(tokens * top_k, kv_size), flat, o_bank, 1)
    return q, out.view(tokens, top_k, -1).sum(dim=1)


def timed(fn, repeats):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="1,32,256,512")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--kv-size", type=int, default=16 * 128)
    args = parser.parse_args()
    expert_bank = template_expert_bank()
    torch.manual_seed(0)
    q_bank = torch.randn(args.experts, args.kv_size, args.hidden) * args.hidden**-0.5
    o_bank = torch.randn(args.experts, args.hidden, args.kv_size) * args.kv_size**-0.5
    router = torch.randn(args.experts, args.hidden)
    print(f"hidden {args.hidden}, {args.experts} experts, top {args.top_k}, kv_size {args.kv_size}, "
          f"float32, {torch.get_num_threads()} threads; best of {args.repeats}")
    print(f"{'tokens':>7} {'old ms':>9} {'new ms':>9} {'old/new':>8} {'max |dq|':>10} {'max |dout|':>10}")
    with torch.inference_mode():
        for tokens in map(int, args.tokens.split(",")):
            hidden = torch.randn(tokens, args.hidden)
            top_logits, chosen = (hidden @ router.t()).topk(args.top_k, dim=-1)
            gates = torch.softmax(top_logits, dim=-1)
            inputs = (hidden, chosen, gates, q_bank, o_bank, args.top_k)
            q_old, out_old = old_forward(*inputs)
            q_new, out_new = new_forward(expert_bank, *inputs)
            t_old = timed(lambda: old_forward(*inputs), args.repeats)
            t_new = timed(lambda: new_forward(expert_bank, *inputs), args.repeats)
            print(f"{tokens:>7} {t_old * 1e3:>9.2f} {t_new * 1e3:>9.2f} {t_old / t_new:>8.2f} "
                  f"{(q_old - q_new).abs().max().item():>10.2e} {(out_old - out_new).abs().max().item():>10.2e}")


if __name__ == "__main__":
    main()
