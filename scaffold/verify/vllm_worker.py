"""The port inside a real vLLM engine, run in a process of its own.

Usage: python -m scaffold.verify.vllm_worker REQUEST.json

The parent sets PYTHONPATH to a staging folder where the port is installed and
VLLM_PLUGINS to its entry point, so vLLM loads the port the way `vllm serve`
would. Writes prompt and sample log-probabilities (top-k at every position),
the greedy continuation, and the class vLLM instantiated.
"""

from __future__ import annotations

import json
import sys
import time
import traceback

from scaffold.verify.probes import capture
from scaffold.verify.tp import prove

CAPTURED: dict = {}
HANDLES: list = []


def model_class(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def add_probes(points):
    def apply(model):
        HANDLES.extend(capture(model, points, CAPTURED))

    return apply


def remove_probes(model) -> None:
    for handle in HANDLES:
        handle.remove()


def main(request_file: str) -> None:
    # Heavy, deferred on purpose: vLLM is imported by the worker process only, never by the parent.
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    request = json.loads(open(request_file).read())
    tp = request["tensor_parallel_size"]
    kwargs = {}
    if tp > 1:
        kwargs["distributed_executor_backend"] = "mp"
    if request.get("model_impl"):  # optional: "transformers" serves through vLLM's transformers backend
        kwargs["model_impl"] = request["model_impl"]
    if request.get("trust_remote_code"):
        kwargs["trust_remote_code"] = True
    if request.get("block_size"):  # chunked attention: the chunk a multiple of the KV-cache block
        kwargs["block_size"] = request["block_size"]
    started = time.perf_counter()
    llm = LLM(
        model=request["checkpoint"],
        skip_tokenizer_init=True,
        dtype=request.get("dtype", "float32"),
        enforce_eager=True,
        max_model_len=request["max_model_len"],
        tensor_parallel_size=tp,
        seed=0,
        max_logprobs=request["top_k"],
        enable_prefix_caching=False,
        **kwargs,
    )
    load_seconds = time.perf_counter() - started
    params = SamplingParams(
        temperature=0.0,
        max_tokens=request["new_tokens"],
        prompt_logprobs=request["top_k"],
        logprobs=request["top_k"],
        detokenize=False,
        ignore_eos=True,
    )
    prompts = [TokensPrompt(prompt_token_ids=p) for p in request["prompts"]]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    results = []
    for out in outputs:
        sample = out.outputs[0]
        results.append(
            {
                # prompt_logprobs[0] is None: nothing predicts the first token.
                "prompt_logprobs": [
                    {str(k): v.logprob for k, v in d.items()} for d in out.prompt_logprobs[1:]
                ],
                "tokens": list(out.prompt_token_ids) + list(sample.token_ids),
                "sample_logprobs": [{str(k): v.logprob for k, v in d.items()} for d in sample.logprobs],
            }
        )
    classes = llm.apply_model(model_class)
    with open(request["out"], "w") as f:
        json.dump({"results": results, "model_class": classes[0], "load_seconds": load_seconds}, f)

    probe = request.get("probe")
    if probe and tp == 1:
        import torch  # only to save the probes; vLLM has imported it already

        llm.apply_model(add_probes([tuple(p) for p in probe["points"]]))
        llm.generate([TokensPrompt(prompt_token_ids=probe["prompt"])],
                     SamplingParams(temperature=0.0, max_tokens=1, detokenize=False), use_tqdm=False)
        llm.apply_model(remove_probes)
        torch.save(CAPTURED, request["out"] + ".probes.pt")

    if request.get("sharding"):
        prove_sharding(request["sharding"], request["out"] + ".sharding.json")


def prove_sharding(request: dict, out: str) -> None:
    """The tensor-parallel proof (scaffold.verify.tp) in this process, which has vLLM imported already."""
    try:
        outcome = {"results": prove(request)}
    except Exception:  # reported as the check's failure, as the proof's own process would be
        outcome = {"error": traceback.format_exc()}
    with open(out, "w") as f:
        json.dump(outcome, f)


if __name__ == "__main__":
    main(sys.argv[1])
