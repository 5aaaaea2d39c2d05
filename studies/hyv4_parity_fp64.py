"""HY-V4 parity against float64: transformers fp32 vs fp64 on the same tokens, the port (vLLM, fp32) against both,
and every probe (scaffold.verify.probes) of the three pairs.

Usage: python studies/hyv4_parity_fp64.py PORT_DIR [--engine]   (PORT_DIR from `scaffold new`; --engine runs the port)"""
import shutil, sys, tempfile
from pathlib import Path
import torch
from transformers import AutoModelForCausalLM
from scaffold.detect.forms import read_checkpoint
from scaffold.verify import parity
from scaffold.verify.port import load_port, stage_install
from scaffold.verify.probes import probes_for, capture, localize

port_dir = sys.argv[1]
engine = "--engine" in sys.argv
port = load_port(port_dir)
ckpt = read_checkpoint(port.checkpoint)
prompts = parity.prompts_for(ckpt, port.spec.vocab_size)
probes = probes_for(port.spec)
longest = max(prompts, key=len)
torch.manual_seed(0)


def reference(dtype, tokens_from=None):
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=dtype, attn_implementation="eager", experts_implementation="eager").eval()
    results = []
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            if tokens_from is None:
                tokens = list(prompt)
                for _ in range(parity.NEW_TOKENS):
                    tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
            else:
                tokens = tokens_from[i]
            logits = model(torch.tensor([tokens[:-1]])).logits[0].double()
            results.append({"tokens": tokens, "logprobs": torch.log_softmax(logits, dim=-1)})
        store = {}
        handles = capture(model, [(p.label, p.hf_module, p.hf_output) for p in probes], store)
        model(torch.tensor([longest]))
        for h in handles:
            h.remove()
    return {"results": results, "model_class": type(model).__name__, "probes": store}


hf32 = reference(torch.float32)
hf64 = reference(torch.float64, [r["tokens"] for r in hf32["results"]])
# fp32 vs fp64 on the same tokens: max |dlogp| over fp32's top-20 and over the whole vocabulary
top, full = 0.0, 0.0
for a, b in zip(hf32["results"], hf64["results"]):
    d = (a["logprobs"] - b["logprobs"]).abs()
    idx = a["logprobs"].topk(parity.TOP_K, dim=-1).indices
    top = max(top, float(d.gather(-1, idx).max()))
    full = max(full, float(d.max()))
print(f"transformers fp32 vs fp64: max |dlogp| top-{parity.TOP_K} {top:.3e}, whole vocabulary {full:.3e}")
out = {"fp32_vs_fp64_top": top, "fp32_vs_fp64_full": full}
errs = dict(localize(hf64["probes"], hf32["probes"], probes)[0])
if engine:
    stage = stage_install(port)
    work = Path(tempfile.mkdtemp(prefix="hyv4-study-"))
    try:
        vl = parity.vllm_run(ckpt.path, prompts, stage, port.spec.package, min(port.spec.max_position, 256), work,
                             probe={"prompt": longest, "points": [(p.label, p.port_module, p.port_output) for p in probes]},
                             engine_vars={"VLLM_MLA_DISABLE": "1"} if port.spec.latent_sink_decompressed else None)
    finally:
        shutil.rmtree(stage.parent, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    for name, ref in (("fp32", hf32), ("fp64", hf64)):
        r = parity.compare(ref, vl, prompts)
        print(f"port vs transformers {name}: max |dlogp| {r.max_delta:.3e}; greedy "
              f"{sum(p.greedy_match for p in r.prompts)}/{r.new_tokens * len(r.prompts)}; per prompt "
              + ", ".join(f"{max(p.max_prompt_delta, p.max_sample_delta):.2e}@{p.worst_position}" for p in r.prompts))
        out[f"port_vs_{name}"] = r.max_delta
    e32 = dict(localize(hf32["probes"], vl["probes"], probes)[0])
    e64 = dict(localize(hf64["probes"], vl["probes"], probes)[0])
    print(f"{'probe':36s} {'hf32-vs-hf64':>12s} {'port-vs-hf32':>12s} {'port-vs-hf64':>12s}")
    for p in probes:
        print(f"{p.label:36s} {errs.get(p.label, float('nan')):12.3e} {e32.get(p.label, float('nan')):12.3e} "
              f"{e64.get(p.label, float('nan')):12.3e}")
else:
    for p in probes:
        print(f"{p.label:36s} {errs.get(p.label, float('nan')):12.3e}")
lg = hf64["probes"].get("logits")
if lg is not None:
    print(f"logits (fp64, longest prompt): max |logit| {float(lg.abs().max()):.2f}, std {float(lg.std()):.2f}; "
          f"per-position spread max-min {float((lg.max(-1).values - lg.min(-1).values).max()):.2f}")
