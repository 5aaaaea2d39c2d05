"""Prompt log-probabilities of one checkpoint in the real vLLM engine, in a process of its own.

Usage: python engine_logprobs.py REQUEST.json, where the request holds checkpoint, prompts,
dtype, out and, optionally, lora (a PEFT adapter folder served with a LoRARequest). The
environment decides which class serves the checkpoint (a staged port on PYTHONPATH with
VLLM_PLUGINS naming it, or vLLM's own). Writes {"model_class", "logprobs"}: per prompt, per
position after the first, the top-20 token ids and their log-probabilities.
"""

from __future__ import annotations

import json
import sys


def model_class(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def main(request_file: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    request = json.loads(open(request_file).read())
    kwargs = {}
    lora = None
    if request.get("lora"):
        from vllm.lora.request import LoRARequest

        kwargs.update(enable_lora=True, max_lora_rank=8, max_loras=1)
        lora = LoRARequest("adapter", 1, request["lora"])
    llm = LLM(model=request["checkpoint"], skip_tokenizer_init=True, dtype=request["dtype"], enforce_eager=True,
              max_model_len=128, seed=0, max_logprobs=20, enable_prefix_caching=False, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=20, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in request["prompts"]]
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    logprobs = [[{str(k): v.logprob for k, v in d.items()} for d in out.prompt_logprobs[1:]] for out in outputs]
    with open(request["out"], "w") as f:
        json.dump({"model_class": llm.apply_model(model_class)[0], "logprobs": logprobs}, f)


if __name__ == "__main__":
    main(sys.argv[1])
