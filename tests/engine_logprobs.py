"""Prompt log-probabilities of one checkpoint in the real vLLM engine, in a process of its own.

Usage: python engine_logprobs.py REQUEST.json, where the request holds checkpoint, prompts,
dtype, out and, optionally, lora (a PEFT adapter folder served with a LoRARequest) and
pipeline_parallel_size (stages in worker processes, the model compiled: vLLM 0.32's CPU runner
allocates the buffers a later stage receives its inputs in only in the compiled mode's warm-up run,
and with enforce_eager a second stage fails at its first forward, vLLM's own classes too). The
environment decides which class serves the checkpoint (a staged port on PYTHONPATH with
VLLM_PLUGINS naming it, or vLLM's own). Writes {"model_class", "logprobs"}: per prompt, per
position after the first, the top-20 token ids and their log-probabilities.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PROMPTS = [[1, 5, 9, 22, 40, 7, 3, 80, 11], [2, 100, 17, 4, 4, 250, 31, 66, 12, 9, 140, 3]]


def logprobs(checkpoint: Path, workdir: Path, *, port: Path | None = None, dtype: str = "float32",
             lora: Path | None = None, prompts: list[list[int]] = PROMPTS, pipeline_parallel_size: int = 1,
             check: bool = True, trust_remote_code: bool = False) -> dict | subprocess.CompletedProcess:
    """Run the engine on `checkpoint` in a child process: through the port at `port` (staged as
    verify stages it), or through vLLM's own class when port is None. check=False returns the
    finished process instead of raising when the engine fails. trust_remote_code: the checkpoint's config class is
    its own code (a lab checkpoint's auto_map)."""
    from scaffold.verify.parity import engine_env
    from scaffold.verify.port import load_port, stage_install

    workdir.mkdir(parents=True, exist_ok=True)
    stage = package = None
    if port is not None:
        loaded = load_port(port, checkpoint)
        stage, package = stage_install(loaded), loaded.spec.package
    out = workdir / "logprobs.json"
    out.unlink(missing_ok=True)
    request = {"checkpoint": str(checkpoint), "prompts": prompts, "dtype": dtype, "out": str(out)}
    if lora is not None:
        request["lora"] = str(lora)
    if pipeline_parallel_size > 1:
        request["pipeline_parallel_size"] = pipeline_parallel_size
    if trust_remote_code:
        request["trust_remote_code"] = True
    (workdir / "request.json").write_text(json.dumps(request))
    proc = subprocess.run([sys.executable, __file__, str(workdir / "request.json")], cwd=workdir,
                          env=engine_env(stage, package, pipeline_parallel_size), capture_output=True, text=True,
                          timeout=600)
    if not check:
        return proc
    if proc.returncode != 0:
        raise AssertionError(f"the engine failed on {checkpoint}:\n{proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def max_delta(a: dict, b: dict) -> float:
    """Largest |log-probability difference| over each position's top-20 tokens of either side; the
    top-20 sets must be the same tokens."""
    worst = 0.0
    for pa, pb in zip(a["logprobs"], b["logprobs"], strict=True):
        for da, db in zip(pa, pb, strict=True):
            assert set(da) == set(db), f"top-20 tokens differ: {sorted(set(da) ^ set(db))}"
            worst = max(worst, max(abs(da[k] - db[k]) for k in da))
    return worst


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
    stages = request.get("pipeline_parallel_size", 1)
    if stages > 1:
        kwargs.update(pipeline_parallel_size=stages, distributed_executor_backend="mp")
    if request.get("trust_remote_code"):
        kwargs.update(trust_remote_code=True)
    llm = LLM(model=request["checkpoint"], skip_tokenizer_init=True, dtype=request["dtype"], enforce_eager=stages == 1,
              max_model_len=128, seed=0, max_logprobs=20, enable_prefix_caching=False, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=20, detokenize=False)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in request["prompts"]]
    outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    logprobs = [[{str(k): v.logprob for k, v in d.items()} for d in out.prompt_logprobs[1:]] for out in outputs]
    with open(request["out"], "w") as f:
        json.dump({"model_class": llm.apply_model(model_class)[0], "logprobs": logprobs}, f)


if __name__ == "__main__":
    main(sys.argv[1])
