"""The float64 reference stays float64: eager attention's `softmax(..., dtype=torch.float32)` and RMSNorm's
`.to(torch.float32)` upcast in half precision but round a float64 run to float32, the very error verify's noise
floor measures (CodeShell's 3-layer tied checkpoint: 1.94e-05 of its "float64" reference's distance was its float32
softmax). Inside scaffold.verify.wide.kept_float64() a float64 tensor is never cast down; other casts are kept."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaffold.tiny import build_tiny
from scaffold.verify import parity
from scaffold.verify.wide import kept_float64


class UpcastingBlock(nn.Module):
    """Lab module of the form: attention probabilities softmaxed "in float32", an RMSNorm computed "in float32"."""

    def forward(self, q, k, x):
        probs = nn.functional.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1, dtype=torch.float32).to(q.dtype)
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return probs, h.to(x.dtype), x.float().log_softmax(-1, dtype=torch.float32), x.type(torch.float32)


def _exact(q, k, x):
    probs = (q @ k.transpose(-1, -2) / 8.0).softmax(-1)
    return probs, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6), x.log_softmax(-1), x


def test_float64_is_kept_through_the_code_s_float32_upcasts():
    g = torch.Generator().manual_seed(0)
    q, k, x = (torch.randn(7, 64, generator=g, dtype=torch.float64) * 3 for _ in range(3))
    block, exact = UpcastingBlock(), _exact(q, k, x)
    rounded = block(q, k, x)
    # the first two cast back up to float64: the float32 rounding hides inside
    assert [r.dtype for r in rounded] == [torch.float64, torch.float64, torch.float32, torch.float32]
    assert min((r.double() - e).abs().max().item() for r, e in zip(rounded, exact)) > 1e-10
    with kept_float64():
        wide = block(q, k, x)
    for w, e in zip(wide, exact):
        assert w.dtype == torch.float64 and (w - e).abs().max().item() < 1e-13


def test_other_casts_are_left_as_written():
    with kept_float64():
        assert torch.arange(4).to(torch.float32).dtype == torch.float32  # integers (positions, rotary angles)
        assert torch.ones(3, dtype=torch.float32).double().dtype == torch.float64
        assert torch.ones(3, dtype=torch.float64).to(torch.int64).dtype == torch.int64
        assert torch.ones(3, dtype=torch.float64).to(torch.float16).dtype == torch.float16
        assert torch.ones(3).softmax(-1, dtype=torch.float64).dtype == torch.float64


@pytest.mark.slow
def test_the_float64_reference_is_float64_in_eager_attention(tmp_path):
    """transformers' eager Llama softmaxes in float32 and its RMSNorm casts to float32; sdpa softmaxes in the
    input's dtype. In a float64 reference the two attentions agree to float64's rounding only when no float32
    cast happens in either."""
    ckpt = build_tiny("llama", tmp_path / "llama", architecture="WideForCausalLM")
    prompts = [[3, 14, 15, 92, 65], [35, 89, 79, 32, 38, 46, 26, 43]]
    eager = parity.hf_reference(ckpt, prompts, False, tmp_path, dtype="float64")
    sdpa = parity.hf_reference(ckpt, prompts, False, tmp_path, dtype="float64", attn_implementation="sdpa")
    for a, b in zip(eager["results"], sdpa["results"]):
        assert a["tokens"] == b["tokens"]
        assert (a["logprobs"].double() - b["logprobs"].double()).abs().max().item() < 1e-12
        assert a["logprobs"].dtype == torch.float64  # kept as computed, not rounded to float32 when saved
