"""HY-V4 tiny checkpoints (the catalogue's config, then smaller q_lora_rank / head widths): transformers fp32 vs fp64
and the attention scores' size. Usage: python studies/hyv4_size_sweep.py [VARIANT ...]"""
import sys, tempfile
from pathlib import Path
import torch
import transformers.models.hy_v4.modeling_hy_v4 as m
from scaffold.tiny import build_tiny
from scaffold.detect.forms import read_checkpoint
from scaffold.verify import parity

CAT = {"num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
       "n_group": 1, "topk_group": 1, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
variants = {
    "catalogue": {},
    "q_lora_rank 96": {"q_lora_rank": 96},
    "qk_nope 32, v 32": {"qk_nope_head_dim": 32, "v_head_dim": 32},
    "q_lora 96, qk_nope 32, v 32": {"q_lora_rank": 96, "qk_nope_head_dim": 32, "v_head_dim": 32},
}
only = sys.argv[1:] or list(variants)
scores = []
orig = m.eager_attention_forward
def recording(module, query, key, value, attention_mask, scaling, **kw):
    s = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        s = s + attention_mask
    s = s.masked_fill(~torch.isfinite(s) | (s < -1e30), float("nan"))
    scores.append((float(s.nan_to_num(0).abs().max()), float(torch.nanmean(s.abs()))))
    return orig(module, query, key, value, attention_mask, scaling, **kw)
m.eager_attention_forward = recording

for name in only:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = build_tiny("hy_v4", Path(tmp) / "ckpt", overrides={**CAT, **variants[name]})
        prompts = parity.prompts_for(read_checkpoint(ckpt), 256)
        res = {}
        for dt in (torch.float32, torch.float64):
            model = m.HYV4ForCausalLM.from_pretrained(ckpt, dtype=dt, attn_implementation="eager",
                                                      experts_implementation="eager").eval()
            out = []
            scores.clear()
            with torch.no_grad():
                for i, p in enumerate(prompts):
                    toks = p if dt == torch.float32 else res[torch.float32][i][0]
                    if dt == torch.float32:
                        toks = list(p)
                        for _ in range(parity.NEW_TOKENS):
                            toks.append(int(model(torch.tensor([toks])).logits[0, -1].argmax()))
                    lp = torch.log_softmax(model(torch.tensor([toks[:-1]])).logits[0].double(), -1)
                    out.append((toks, lp))
            res[dt] = out
            if dt == torch.float64:
                smax = max(s[0] for s in scores); smean = sum(s[1] for s in scores) / len(scores)
        top = 0.0
        for (t, a), (_, b) in zip(res[torch.float32], res[torch.float64]):
            idx = a.topk(20, -1).indices
            top = max(top, float((a - b).abs().gather(-1, idx).max()))
        print(f"{name:32s} fp32 vs fp64 max |dlogp| top-20 {top:.2e}; attention scores (scaled, fp64) "
              f"max |s| {smax:.1f}, mean |s| {smean:.2f}", flush=True)
