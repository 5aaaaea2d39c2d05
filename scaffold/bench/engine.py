"""The engines: one vLLM engine per worker process, driven over a pipe by the parent.

Parent side: `Engine` starts `python -m scaffold.bench --worker REQUEST.json` (isolated, through
scaffold.proc), sends one JSON command per line on the worker's stdin and reads one JSON reply
per line from a pipe of its own (the worker's stdout and stderr are vLLM's log, kept in a file).

Worker side: `worker` builds the engine the request describes, checks that it serves the
expected class, answers {"ready": ...} and then serves the commands `throughput`, `latency`
and `quit`.
"""

from __future__ import annotations

import json
import os
import random
import select
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from scaffold.errors import ScaffoldError
from scaffold.proc import python_command


# ----------------------------------------------------------------------------- parent side
class EngineError(ScaffoldError):
    pass


class Engine:
    """One engine in a worker process: commands go to its stdin, results come back on a pipe."""

    def __init__(self, impl: str, request: dict, env: dict, log: Path, work: Path):
        self.impl, self.log = impl, log
        self.read_fd, write_fd = os.pipe()
        request = {**request, "result_fd": write_fd}
        self.request_file = work / f"{impl}.request.json"
        self.request_file.write_text(json.dumps(request))
        self._logf = open(log, "w")  # noqa: SIM115 (open while the engine runs)
        cwd = work / f"{impl}.cwd"  # an empty folder of its own to start in (scaffold.proc says why)
        cwd.mkdir()
        self.proc = subprocess.Popen(
            python_command("scaffold.bench", "--worker", self.request_file, env=env), cwd=cwd,
            stdin=subprocess.PIPE, stdout=self._logf, stderr=subprocess.STDOUT, env=env, pass_fds=(write_fd,),
            text=True, start_new_session=True,
        )
        os.close(write_fd)
        self._buffer = b""
        self.ready = False

    def receive(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineError(f"the {self.impl} engine gave no answer within {timeout:.0f} s; its log: {self.log}")
            ready, _, _ = select.select([self.read_fd], [], [], min(left, 5.0))
            if ready:
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    raise EngineError(f"the {self.impl} engine exited (code {self.proc.wait()}):\n{self.tail()}")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        reply = json.loads(line)
        if "error" in reply:
            raise EngineError(f"the {self.impl} engine failed: {reply['error']}")
        return reply

    def call(self, command: dict, timeout: float = 3600) -> dict:
        try:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise EngineError(f"the {self.impl} engine exited (code {self.proc.wait()}):\n{self.tail()}") from None
        return self.receive(timeout)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None and not self.ready:
            os.killpg(self.proc.pid, 9)
            self.proc.wait()
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=60)
            except (BrokenPipeError, subprocess.TimeoutExpired, OSError):
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        os.close(self.read_fd)
        self._logf.close()


# ----------------------------------------------------------------------------- worker side
def model_class_name(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def random_prompts(seed: int, n: int, length: int, vocab: int) -> list[list[int]]:
    """`n` prompts of `length` random token ids: new for every seed, the same in every engine."""
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def worker(request_file: str) -> None:
    """Serve the engine `request_file` describes until the parent says quit (or stdin closes)."""
    request = json.loads(Path(request_file).read_text())
    out = os.fdopen(request["result_fd"], "w")

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        started = time.perf_counter()
        # Deferred on purpose: the parent imports this module too, and must not pay for torch and vLLM.
        import torch
        import vllm
        from vllm import LLM, ModelRegistry, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if request["expect"] == "native" and request["architecture"] not in ModelRegistry.get_supported_archs():
            raise RuntimeError(f"vLLM {vllm.__version__} has no native class for {request['architecture']}")
        kwargs = {}
        if request.get("max_num_seqs"):
            kwargs["max_num_seqs"] = request["max_num_seqs"]
        if torch.cuda.is_available():
            kwargs["gpu_memory_utilization"] = request["gpu_memory_utilization"]
        llm = LLM(model=request["model"], skip_tokenizer_init=True, dtype=request["dtype"],
                  max_model_len=request["max_model_len"], enforce_eager=request["enforce_eager"],
                  model_impl=request["model_impl"], seed=request["seed"],
                  trust_remote_code=request["trust_remote_code"], **kwargs)
        model_class = llm.apply_model(model_class_name)[0]
        expected = {"port": f"{request.get('package')}.", "native": "vllm.model_executor.models.",
                    "backend": "vllm.model_executor.models.transformers"}[request["expect"]]
        if not model_class.startswith(expected) or (request["expect"] == "native" and ".transformers" in model_class):
            raise RuntimeError(f"the engine serves {model_class}, not the {request['expect']} implementation")
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU ({os.cpu_count()} cores)"
        v2 = getattr(getattr(llm.llm_engine, "vllm_config", None), "use_v2_model_runner", None)
        reply({"ready": True, "model_class": model_class, "load_s": time.perf_counter() - started,
               "model_runner": None if v2 is None else ("v2" if v2 else "v1"),
               "device": device, "vllm_version": vllm.__version__})
        engine = llm.llm_engine
        serial = 0
        for line in sys.stdin:
            command = json.loads(line)
            op = command["op"]
            if op == "quit":
                break
            if op == "throughput":
                ids = random_prompts(command["seed"], command["num_prompts"], command["prompt_len"], command["vocab"])
                prompts = [TokensPrompt(prompt_token_ids=p) for p in ids]
                # No per-request seed: vLLM's V1 runner rewinds a seeded request's generator with the
                # CUDA-only Generator.set_offset when its prefill is chunked, which kills a CPU engine
                # ("CPU Generator does not use offset"). The engines' common `seed` keeps sampling
                # reproducible instead.
                params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=command["output_len"],
                                        ignore_eos=True, detokenize=False)
                t0 = time.perf_counter()
                outputs = llm.generate(prompts, params, use_tqdm=False)
                elapsed = time.perf_counter() - t0
                prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
                output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
                reply({"elapsed_s": elapsed, "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
                       "total_tok_s": (prompt_tokens + output_tokens) / elapsed,
                       "output_tok_s": output_tokens / elapsed})
            elif op == "latency":
                params = SamplingParams(temperature=0.0, max_tokens=command["output_len"], ignore_eos=True,
                                        detokenize=False, output_kind=RequestOutputKind.DELTA)
                ttfts, gaps = [], []
                for b in range(command["batches"]):
                    prompts = random_prompts(command["seed"] + b, command["concurrency"], command["prompt_len"],
                                       command["vocab"])
                    sent, last, counts, alias = {}, {}, {}, {}
                    for p in prompts:
                        serial += 1
                        rid = f"lat-{serial}"
                        sent[rid] = time.perf_counter()
                        internal = engine.add_request(rid, TokensPrompt(prompt_token_ids=p), params)
                        alias[rid] = alias[internal or rid] = rid
                        counts[rid] = 0
                    while engine.has_unfinished_requests():
                        for o in engine.step():
                            now = time.perf_counter()
                            k = len(o.outputs[0].token_ids) if o.outputs else 0
                            rid = alias.get(o.request_id)
                            if not k or rid is None:
                                continue
                            if counts[rid] == 0:
                                ttfts.append(now - sent[rid])
                            else:  # k tokens since the last delivery: k gaps of equal share
                                gaps.extend([(now - last[rid]) / k] * k)
                            counts[rid] += k
                            last[rid] = now
                    if any(c != command["output_len"] for c in counts.values()):
                        raise RuntimeError(f"latency requests generated {sorted(counts.values())} tokens, "
                                           f"expected {command['output_len']} each")
                reply({"ttft_ms": 1000 * statistics.median(ttfts), "itl_ms": 1000 * statistics.median(gaps),
                       "ttft_all_ms": [1000 * t for t in ttfts], "requests": len(ttfts)})
            else:
                raise RuntimeError(f"unknown command {op!r}")
    except Exception as exc:  # noqa: BLE001 (reported to the parent, which shows it with the log's tail)
        traceback.print_exc()
        reply({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)

