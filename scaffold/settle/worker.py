"""Run one module of the reference for scaffold.settle, in a process of its own.

Usage: python -m scaffold.settle.worker REQUEST.json

Builds the causal LM from the checkpoint's config on the meta device (no memory for its weights),
materializes only the module the request names, gives it seeded random weights, runs it on a random
input, and computes each candidate reading of the field from the same weights. Writes the relative
error of each candidate (and the module's class) to the request's `out`.
"""

from __future__ import annotations

import json
import math
import sys


def _relative(a, b) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-30))


def main(request_file: str) -> None:
    # Heavy, deferred on purpose: only this worker process imports torch and transformers.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.activations import ACT2FN

    with open(request_file, encoding="utf-8") as f:
        request = json.load(f)
    trust = request["trust_remote_code"]
    config = AutoConfig.from_pretrained(request["checkpoint"], trust_remote_code=trust)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust, dtype=torch.float32)
    module = model.get_submodule(request["module"])
    module.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in module.parameters():
            fan_in = param.shape[-1] if param.dim() > 1 else 1
            param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(fan_in))
        for buffer in module.buffers():
            buffer.copy_(torch.randn(buffer.shape, generator=generator))
        x = torch.randn(2, 5, request["hidden_size"], generator=generator)
        reference = module(x)
        reference = reference[0] if isinstance(reference, tuple) else reference
        errors = {}
        if request["field"] == "gate_up_order":
            fused, down = module.get_submodule(request["fused"]), module.get_submodule(request["down"])
            act = ACT2FN[request["act"]]
            h = fused(x)
            width = request["intermediate_size"]
            first, second = h[..., :width], h[..., width:]
            errors["gate_first"] = _relative(down(act(first) * second), reference)
            errors["up_first"] = _relative(down(act(second) * first), reference)
    with open(request["out"], "w", encoding="utf-8") as f:
        json.dump({"class": type(module).__name__, "errors": errors}, f)


if __name__ == "__main__":
    main(sys.argv[1])
