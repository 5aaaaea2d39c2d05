"""Numeric parity: transformers in one process, the port inside vLLM in another."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.errors import ScaffoldError

TOP_K = 20
NEW_TOKENS = 16
TOLERANCE = 1e-4
PROMPT_LENGTHS = (6, 13, 24, 37)


def prompts_for(ckpt: Checkpoint, vocab_size: int) -> list[list[int]]:
    """Deterministic prompts of token ids the tokenizer can produce (or the embedding, without one)."""
    limit = min(vocab_size, ckpt.tokenizer.vocab_size or vocab_size)
    rng = random.Random(1234)
    return [[rng.randrange(limit) for _ in range(n)] for n in PROMPT_LENGTHS]


@dataclass
class PromptResult:
    length: int
    max_prompt_delta: float
    max_sample_delta: float
    greedy_match: int  # leading continuation tokens that agree
    top1_agree: int
    positions: int
    worst_position: int  # absolute position of the largest delta


@dataclass
class ParityResult:
    prompts: list[PromptResult] = field(default_factory=list)
    vllm_class: str = ""
    hf_class: str = ""
    new_tokens: int = NEW_TOKENS
    tolerance: float = TOLERANCE

    @property
    def max_delta(self) -> float:
        return max((max(p.max_prompt_delta, p.max_sample_delta) for p in self.prompts), default=float("inf"))

    @property
    def greedy_ok(self) -> bool:
        return all(p.greedy_match == self.new_tokens for p in self.prompts)

    def table(self) -> str:
        lines = ["  prompt  tokens  max|dlogp| prompt  max|dlogp| sampled  top-1 agree  greedy match",
                 "  ------  ------  -----------------  ------------------  -----------  ------------"]
        for i, p in enumerate(self.prompts):
            lines.append(f"  {i:>6}  {p.length:>6}  {p.max_prompt_delta:>17.2e}  {p.max_sample_delta:>18.2e}  "
                         f"{p.top1_agree:>5}/{p.positions:<5}  {p.greedy_match:>5}/{self.new_tokens}")
        return "\n".join(lines)


def _run(module: str, request: dict, env: dict, what: str, timeout: int = 900) -> None:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    proc = subprocess.run([sys.executable, "-m", module, f.name], env=env, capture_output=True, text=True,
                          timeout=timeout)
    os.unlink(f.name)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ScaffoldError(f"{what} failed (exit {proc.returncode}):\n{tail}")


def engine_env(stage: Path, package: str, tensor_parallel_size: int = 1) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(stage), env.get("PYTHONPATH", "")) if p)
    env["VLLM_PLUGINS"] = package
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if tensor_parallel_size > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tensor_parallel_size)))
    return env


def hf_reference(checkpoint: Path, prompts, trust_remote_code: bool, workdir: Path, new_tokens=NEW_TOKENS) -> dict:
    import torch

    out = workdir / "hf.pt"
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    _run("scaffold.verify.hf_worker",
         {"checkpoint": str(checkpoint), "prompts": prompts, "new_tokens": new_tokens,
          "trust_remote_code": trust_remote_code, "out": str(out)}, env, "the transformers reference")
    return torch.load(out, weights_only=False)


def vllm_run(checkpoint: Path, prompts, stage: Path, package: str, max_model_len: int, workdir: Path,
             tensor_parallel_size: int = 1, new_tokens=NEW_TOKENS) -> dict:
    out = workdir / f"vllm-tp{tensor_parallel_size}.json"
    _run("scaffold.verify.vllm_worker",
         {"checkpoint": str(checkpoint), "prompts": prompts, "new_tokens": new_tokens, "top_k": TOP_K,
          "tensor_parallel_size": tensor_parallel_size, "max_model_len": max_model_len, "out": str(out)},
         engine_env(stage, package, tensor_parallel_size), "the vLLM engine with the port")
    return json.loads(out.read_text())


def compare(hf: dict, vl: dict, prompts, new_tokens=NEW_TOKENS) -> ParityResult:
    result = ParityResult(vllm_class=vl["model_class"], hf_class=hf["model_class"], new_tokens=new_tokens)
    for prompt, h, v in zip(prompts, hf["results"], vl["results"]):
        n = len(prompt)
        hf_tokens, vl_tokens = h["tokens"], v["tokens"]
        match = 0
        for a, b in zip(hf_tokens[n:], vl_tokens[n:]):
            if a != b:
                break
            match += 1
        logprobs = h["logprobs"]  # row t predicts token t + 1 of hf_tokens
        worst, worst_pos, prompt_delta, sample_delta, agree, positions = 0.0, 0, 0.0, 0.0, 0, 0
        rows = [(t, d) for t, d in enumerate(v["prompt_logprobs"])]
        # Sampled positions are comparable while both engines saw the same tokens.
        rows += [(n - 1 + j, d) for j, d in enumerate(v["sample_logprobs"][: match + 1])]
        for t, dist in rows:
            if t >= logprobs.shape[0]:
                continue
            ref = logprobs[t]
            delta = max(abs(float(ref[int(k)]) - lp) for k, lp in dist.items())
            best_v = max(dist.items(), key=lambda kv: kv[1])[0]
            agree += int(int(best_v) == int(ref.argmax()))
            positions += 1
            if t < n - 1:
                prompt_delta = max(prompt_delta, delta)
            else:
                sample_delta = max(sample_delta, delta)
            if delta > worst:
                worst, worst_pos = delta, t
        result.prompts.append(PromptResult(n, prompt_delta, sample_delta, match, agree, positions, worst_pos))
    return result
