"""Numeric parity: transformers in one process, the port inside vLLM in another."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.errors import ScaffoldError
from scaffold.proc import run_python

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
    nonfinite: str = ""  # where a side first gave NaN or +inf ("" when both were finite)


@dataclass
class ParityResult:
    prompts: list[PromptResult] = field(default_factory=list)
    vllm_class: str = ""
    hf_class: str = ""
    new_tokens: int = NEW_TOKENS
    tolerance: float = TOLERANCE
    reference: str = ""  # what was compared, when not the float checkpoint in both (a quantized one)

    @property
    def max_delta(self) -> float:
        if self.nonfinite:
            return math.inf
        return max((max(p.max_prompt_delta, p.max_sample_delta) for p in self.prompts), default=float("inf"))

    @property
    def nonfinite(self) -> str:
        """Where a side first gave a value that is no log-probability (NaN, +inf): parity fails on it."""
        return next((f"prompt {i}: {p.nonfinite}" for i, p in enumerate(self.prompts) if p.nonfinite), "")

    def logprob_check(self) -> tuple[bool, str]:
        """The log-probability verdict and its one-line detail."""
        if self.nonfinite:
            return False, f"non-finite log-probabilities: {self.nonfinite}"
        return self.max_delta <= self.tolerance, (f"max |dlogp| {self.max_delta:.2e} over the top-{TOP_K} tokens at "
                                                  f"every position (tolerance {self.tolerance:.2g}"
                                                  + (f"; {self.reference})" if self.reference else ")"))

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


def _run(module: str, request: dict, env: dict, what: str, timeout: int = 900) -> subprocess.CompletedProcess:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(request, f)
    proc = run_python(module, f.name, env=env, capture_output=True, text=True, timeout=timeout)
    os.unlink(f.name)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise ScaffoldError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return proc


def engine_env(stage: Path | None, package: str | None, tensor_parallel_size: int = 1) -> dict:
    """The engine's environment; with no staged package (transformers backend) no plugin is loaded."""
    env = dict(os.environ)
    if stage is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(stage), env.get("PYTHONPATH", "")) if p)
    env["VLLM_PLUGINS"] = package or ""
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if tensor_parallel_size > 1:
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(str(i) for i in range(tensor_parallel_size)))
    return env


def port_engine_vars(spec) -> dict[str, str]:
    """Environment variables an engine serving a port of `spec` needs beside engine_env's (verify, compare and
    bench take them from here): VLLM_MLA_DISABLE=1 for a latent attention with sinks run decompressed through
    vLLM's Attention (latent_sink_decompressed), whose KV cache holds full keys and values; without it vLLM sizes
    an MLA cache for the model type and the port refuses to load."""
    return {"VLLM_MLA_DISABLE": "1"} if spec.latent_sink_decompressed else {}


def _reference_cache(request: dict, checkpoint: Path) -> Path | None:
    """Where a transformers reference for exactly this request and checkpoint state is kept.

    SCAFFOLD_CACHE names the folder; unset, nothing is cached. The key covers the request
    and the size and mtime of every file in the checkpoint, so an edited checkpoint misses.
    """
    root = os.environ.get("SCAFFOLD_CACHE")
    if not root:
        return None
    stamp = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in checkpoint.iterdir() if p.is_file())
    key = hashlib.sha256(json.dumps([request, str(checkpoint.resolve()), stamp]).encode()).hexdigest()[:24]
    return Path(root) / f"hf-{key}.pt"


def hf_reference(checkpoint: Path, prompts, trust_remote_code: bool, workdir: Path, new_tokens=NEW_TOKENS,
                 probe: dict | None = None, attn_implementation: str | None = None, dtype: str = "float32") -> dict:
    """The transformers reference's log-probabilities; attn_implementation: transformers' attention to run it with
    (None: eager); dtype "float64" runs it in double precision (the float32 run's own rounding error)."""
    import torch  # deferred on purpose (seconds to import): `scaffold verify --static-only` never needs it

    request = {"checkpoint": str(checkpoint), "prompts": prompts, "new_tokens": new_tokens,
               "trust_remote_code": trust_remote_code, "probe": probe}
    if attn_implementation is not None:
        request["attn_implementation"] = attn_implementation
    if dtype != "float32":
        request["dtype"] = dtype
    cached = _reference_cache(request, checkpoint)
    if cached is not None and cached.exists():
        return torch.load(cached, weights_only=False)
    out = workdir / f"hf-{dtype}.pt"
    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    _run("scaffold.verify.hf_worker", {**request, "out": str(out)}, env,
         "the transformers reference" + (f" in {dtype}" if dtype != "float32" else ""))
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out, cached)
    return torch.load(out, weights_only=False)


def vllm_run(checkpoint: Path, prompts, stage: Path | None, package: str | None, max_model_len: int, workdir: Path,
             tensor_parallel_size: int = 1, new_tokens=NEW_TOKENS, probe: dict | None = None, *,
             model_impl: str | None = None, trust_remote_code: bool = False, sharding: dict | None = None,
             dtype: str = "float32", block_size: int | None = None, engine_vars: dict | None = None) -> dict:
    """Run the port inside vLLM (`engine_vars`: environment variables the port needs, VLLM_MLA_DISABLE for a latent
    attention run decompressed); model_impl="transformers" (no stage, no package) runs vLLM's transformers
    backend instead. The result carries the engine's log as "engine_log" (the backend's `Fused:` lines).

    sharding: a request for scaffold.verify.tp, run in the engine's process after the engine, which saves
    that proof a process of its own; its outcome is the result's "sharding". The caller passes it at TP 1
    only, where the engine runs in this one process."""
    import torch  # deferred on purpose, as in hf_reference

    out = workdir / f"vllm-tp{tensor_parallel_size}{'-' + model_impl if model_impl else ''}.json"
    request = {"checkpoint": str(checkpoint), "prompts": prompts, "new_tokens": new_tokens, "top_k": TOP_K,
               "tensor_parallel_size": tensor_parallel_size, "max_model_len": max_model_len, "out": str(out),
               "probe": probe, "dtype": dtype}
    if model_impl is not None:
        request["model_impl"] = model_impl
    if trust_remote_code:
        request["trust_remote_code"] = True
    if sharding is not None:
        request["sharding"] = sharding
    if block_size is not None:
        request["block_size"] = block_size
    what = "the vLLM engine with the port" if model_impl is None else f"the vLLM engine (model_impl={model_impl})"
    proc = _run("scaffold.verify.vllm_worker", request,
                {**engine_env(stage, package, tensor_parallel_size), **(engine_vars or {})}, what)
    result = json.loads(out.read_text())
    result["engine_log"] = (proc.stdout or "") + (proc.stderr or "")
    probes = Path(str(out) + ".probes.pt")
    result["probes"] = torch.load(probes, weights_only=False) if probes.exists() else {}
    proof = Path(str(out) + ".sharding.json")
    if proof.exists():
        result["sharding"] = json.loads(proof.read_text())
    return result


def as_candidate(hf: dict, prompts, top_k: int = TOP_K) -> dict:
    """A transformers run shaped as an engine's result (its top-k log-probabilities per position), so that
    `compare` measures one reference against another: transformers in float32 against itself in float64."""
    results = []
    for prompt, run in zip(prompts, hf["results"]):
        rows = [{str(int(k)): float(v) for v, k in zip(*row.topk(top_k))} for row in run["logprobs"]]
        n = len(prompt)  # row t predicts token t + 1: rows n - 1 on are the continuation's
        results.append({"tokens": run["tokens"], "prompt_logprobs": rows[: n - 1], "sample_logprobs": rows[n - 1:]})
    return {"results": results, "model_class": hf["model_class"]}


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
        nonfinite = ""
        rows = [(t, d) for t, d in enumerate(v["prompt_logprobs"])]
        # Sampled positions are comparable while both engines saw the same tokens.
        rows += [(n - 1 + j, d) for j, d in enumerate(v["sample_logprobs"][: match + 1])]
        for t, dist in rows:
            if t >= logprobs.shape[0]:
                continue
            ref = logprobs[t]
            sides = [name for name, bad in (("transformers", _no_logprob(ref.tolist())),
                                            ("the port in vLLM", _no_logprob(dist.values()))) if bad]
            if sides and not nonfinite:
                nonfinite = f"{' and '.join(sides)} gave NaN or +inf at position {t}"
            delta = max(_delta(float(ref[int(k)]), lp) for k, lp in dist.items())
            best_v = max(dist.items(), key=lambda kv: kv[1])[0]
            agree += int(int(best_v) == int(ref.argmax()))
            positions += 1
            if t < n - 1:
                prompt_delta = max(prompt_delta, delta)
            else:
                sample_delta = max(sample_delta, delta)
            if delta > worst:
                worst, worst_pos = delta, t
        result.prompts.append(PromptResult(n, prompt_delta, sample_delta, match, agree, positions, worst_pos,
                                           nonfinite))
    return result


def _no_logprob(values) -> bool:
    """Whether any value is NaN or +inf (-inf is the log-probability of a token that cannot occur)."""
    return any(math.isnan(v) or v == math.inf for v in values)


def _delta(ref: float, got: float) -> float:
    """|ref - got|, where two equal infinities agree and NaN on either side is an infinite difference."""
    if ref == got:
        return 0.0
    delta = abs(ref - got)
    return math.inf if math.isnan(delta) else delta


NOISE_FACTOR = 2.0  # a port this many times the reference's own float32 error, or less, is within float32 noise


@dataclass
class NoiseFloor:
    """How far transformers in float32 is from itself in float64 (the exact computation, as near as a CPU gets),
    against how far the port is from the same float64 run: on a checkpoint whose float32 rounding grows through
    its depth (deep stacks of random weights, near-tie expert choices), parity at TOLERANCE cannot be decided in
    float32, and this says whether the port's difference is that rounding or the port's own."""

    reference: ParityResult  # transformers float32 against transformers float64
    port: ParityResult  # the port against transformers float64

    @property
    def within(self) -> bool:
        floor = self.reference.max_delta
        return floor > self.reference.tolerance and self.port.max_delta <= NOISE_FACTOR * floor

    def _ratio(self) -> str:
        """How many times transformers' own float32 error the port's is: 2.04x and 1.8x are one verdict apart but the
        same evidence, and the reader should see which."""
        floor = self.reference.max_delta
        return f", {self.port.max_delta / floor:.2g}x transformers' own" if 0 < floor < math.inf else ""

    def detail(self) -> str:
        def greedy(r: ParityResult) -> str:
            return f"{sum(p.greedy_match for p in r.prompts)}/{r.new_tokens * len(r.prompts)}"

        line = (f"transformers in float32 is {self.reference.max_delta:.2e} from itself in float64 (greedy "
                f"{greedy(self.reference)} tokens identical); the port is {self.port.max_delta:.2e} from float64 "
                f"(greedy {greedy(self.port)}){self._ratio()}")
        if self.within:
            return (line + f": within {NOISE_FACTOR:g}x the reference's own float32 error, so this checkpoint's "
                           "float32 rounding explains the difference, not the port; parity at "
                           f"{self.reference.tolerance:.2g} needs a better-conditioned (or shallower) checkpoint")
        if self.reference.max_delta <= self.reference.tolerance:
            if self.port.max_delta <= NOISE_FACTOR * self.reference.max_delta:
                # Near the tolerance, two float32 computations of one function land on either side of it: an
                # error of the port's this small and this checkpoint's rounding look the same from here.
                return line + (f": float32 rounding alone takes transformers to "
                               f"{self.reference.max_delta / self.reference.tolerance:.0%} of the tolerance and the "
                               f"port is within {NOISE_FACTOR:g}x of that, so rounding may explain it; a "
                               "checkpoint of another random draw (or shallower) tells it from an error of the port's")
            return line + ": float32 rounding is within the tolerance here, so the difference is the port's"
        return line + f": more than {NOISE_FACTOR:g}x the reference's own float32 error, so the port's own"


def noise_floor(hf32: dict, hf64: dict, vl: dict, prompts) -> NoiseFloor:
    return NoiseFloor(compare(hf64, as_candidate(hf32, prompts), prompts), compare(hf64, vl, prompts))
