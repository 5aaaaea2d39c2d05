"""The transformers reference, run in a process of its own.

Usage: python -m scaffold.verify.hf_worker REQUEST.json

Loads the original model in float32 (or the request's "dtype": float64 measures float32's own rounding
error; run inside wide.kept_float64(), so the code's float32 upcasts do not round it) with eager attention (or the request's
"attn_implementation": transformers 5.19's eager Falcon adds its ALiBi bias twice), decodes greedily from
each prompt without a KV cache, then saves the log-probabilities of every
position of prompt + continuation. Kept apart from vLLM: building vLLM's
transformers backend rewrites transformers' classes in its process.
"""

from __future__ import annotations

import json
import sys

from scaffold.verify.probes import capture
from scaffold.verify.wide import wide_or_not


def main(request_file: str) -> None:
    # Heavy, deferred on purpose: the parent imports this package without them; only the worker process runs main.
    import torch
    from transformers import AutoModelForCausalLM

    request = json.loads(open(request_file).read())
    torch.manual_seed(0)
    dtype = getattr(torch, request.get("dtype") or "float32")
    kwargs = dict(dtype=dtype, trust_remote_code=request["trust_remote_code"])
    if dtype == torch.float64:  # transformers' grouped-matmul experts take no float64
        kwargs["experts_implementation"] = "eager"
    wide = torch.float64 if dtype == torch.float64 else torch.float32  # the log-softmax's precision
    try:
        model = AutoModelForCausalLM.from_pretrained(
            request["checkpoint"], attn_implementation=request.get("attn_implementation") or "eager", **kwargs)
    except (ValueError, TypeError):  # remote code that does not take attn_implementation
        kwargs.pop("experts_implementation", None)
        model = AutoModelForCausalLM.from_pretrained(request["checkpoint"], **kwargs)
    model.eval()
    results = []
    with torch.no_grad(), wide_or_not(dtype):
        for prompt in request["prompts"]:
            tokens = list(prompt)
            for _ in range(request["new_tokens"]):
                logits = model(torch.tensor([tokens])).logits[0, -1]
                tokens.append(int(logits.argmax()))
            logits = model(torch.tensor([tokens[:-1]])).logits[0].to(wide)
            results.append({"tokens": tokens, "logprobs": torch.log_softmax(logits, dim=-1).to(wide)})
    captured: dict = {}
    probe = request.get("probe")
    if probe:
        handles = capture(model, [tuple(p) for p in probe["points"]], captured)
        with torch.no_grad(), wide_or_not(dtype):
            model(torch.tensor([probe["prompt"]]))
        for handle in handles:
            handle.remove()
    torch.save({"results": results, "model_class": type(model).__name__, "probes": captured}, request["out"])


if __name__ == "__main__":
    main(sys.argv[1])
