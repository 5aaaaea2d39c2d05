"""The float64 HY-V4 model with one kind of sublayer computed in float32: which one carries the fp32 error.
Usage: python studies/hyv4_fp32_by_sublayer.py CHECKPOINT"""
import copy, sys
import torch
import transformers.models.hy_v4.modeling_hy_v4 as m
from scaffold.detect.forms import read_checkpoint
from scaffold.verify import parity

ckpt = sys.argv[1]
prompts = parity.prompts_for(read_checkpoint(ckpt), 256)
load = lambda dt: m.HYV4ForCausalLM.from_pretrained(ckpt, dtype=dt, attn_implementation="eager",
                                                    experts_implementation="eager").eval()
model32 = load(torch.float32)

def cast(x, dt):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.to(dt)
    if isinstance(x, (tuple, list)):
        return type(x)(cast(v, dt) for v in x)
    return x

class In32(torch.nn.Module):
    def __init__(self, mod):
        super().__init__()
        self.inner = copy.deepcopy(mod).float()
    def forward(self, *args, **kw):
        out = self.inner(*cast(args, torch.float32), **{k: cast(v, torch.float32) for k, v in kw.items()})
        return cast(out, torch.float64)

tokens = []
with torch.no_grad():
    for p in prompts:
        t = list(p)
        for _ in range(parity.NEW_TOKENS):
            t.append(int(model32(torch.tensor([t])).logits[0, -1].argmax()))
        tokens.append(t)
def run(model):
    with torch.no_grad():
        return [torch.log_softmax(model(torch.tensor([t[:-1]])).logits[0].double(), -1) for t in tokens]
ref = run(load(torch.float64))
def delta(lps):
    return max(float((a - b).abs().gather(-1, a.topk(20, -1).indices).max()) for a, b in zip(lps, ref))
print(f"all fp32                  {delta(run(model32)):.2e}")
for what in ("self_attn", "mlp", "attn_hc", "ffn_hc"):
    model = load(torch.float64)
    for layer in model.model.layers:
        setattr(layer, what, In32(getattr(layer, what)))
    print(f"fp64, {what:10s} in fp32  {delta(run(model)):.2e}")
