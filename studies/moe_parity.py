"""Port against vLLM's own class inside one vLLM install: greedy outputs and top-k log-probabilities.

`scaffold verify` compares a port with transformers in float32 on a CPU; this compares the port
with vLLM's native class of the same model_type on the same checkpoint, in whatever vLLM and on
whatever device this runs (made for the H200 with vLLM 0.24.0, bf16). Both engines get the same
random prompts; each runs in a process of its own, one after the other.

    python3 studies/moe_parity.py PORT --checkpoint CKPT -o OUT [--dtype bfloat16]

Reported (stdout and OUT/parity-DTYPE.json):
- prompt positions (teacher forcing, identical contexts): max and mean |delta logprob| over the
  token ids in both engines' top-k, and how often the two top-1 tokens agree;
- generated tokens (greedy): how many sequences are identical, the first divergence of the
  others (with the native engine's logprob gap between the two tokens chosen there), and the
  same |delta logprob| over the positions up to and including the first divergence (their
  contexts are identical).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent  # studies/; its parent holds the scaffold package


def _worker(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    started = time.perf_counter()
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from scaffold.bench import model_class_name

    kwargs = {"gpu_memory_utilization": request["gpu_memory_utilization"]} if torch.cuda.is_available() else {}
    llm = LLM(
        model=request["model"],
        skip_tokenizer_init=True,
        dtype=request["dtype"],
        max_model_len=request["max_model_len"],
        enforce_eager=request["enforce_eager"],
        model_impl="vllm",
        seed=0,
        max_logprobs=request["top_k"],
        **kwargs,
    )
    model_class = llm.apply_model(model_class_name)[0]
    load_s = time.perf_counter() - started
    params = SamplingParams(
        temperature=0.0,
        max_tokens=request["new_tokens"],
        ignore_eos=True,
        detokenize=False,
        logprobs=request["top_k"],
        prompt_logprobs=request["top_k"],
    )
    t0 = time.perf_counter()
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in request["prompts"]], params, use_tqdm=False)
    gen_s = time.perf_counter() - t0

    def table(positions):
        return [None if pos is None else {str(k): v.logprob for k, v in pos.items()} for pos in positions]

    result = {
        "model_class": model_class,
        "vllm_version": vllm.__version__,
        "load_s": load_s,
        "generate_s": gen_s,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "model_runner": ("v2" if getattr(llm.llm_engine.vllm_config, "use_v2_model_runner", False) else "v1"),
        "outputs": [
            {
                "tokens": list(o.outputs[0].token_ids),
                "logprobs": table(o.outputs[0].logprobs),
                "prompt_logprobs": table(o.prompt_logprobs),
            }
            for o in outputs
        ],
    }
    Path(request["result"]).write_text(json.dumps(result))


def _deltas(a: dict, b: dict) -> tuple[list[float], bool]:
    common = set(a) & set(b)
    top_a, top_b = max(a, key=a.get), max(b, key=b.get)
    return [abs(a[k] - b[k]) for k in common], top_a == top_b


def compare(port: dict, native: dict) -> dict:
    prompt_d, prompt_top1, gen_d, gen_top1 = [], [], [], []
    identical, divergences, matched, total = 0, [], 0, 0
    for i, (p, n) in enumerate(zip(port["outputs"], native["outputs"])):
        for a, b in zip(p["prompt_logprobs"], n["prompt_logprobs"]):
            if a is None or b is None:
                continue
            d, same = _deltas(a, b)
            prompt_d += d
            prompt_top1.append(same)
        tp, tn = p["tokens"], n["tokens"]
        first = next((j for j, (x, y) in enumerate(zip(tp, tn)) if x != y), None)
        total += len(tn)
        if first is None:
            identical += 1
            matched += len(tn)
            last = len(tn) - 1
        else:
            matched += first
            last = first
            lp = n["logprobs"][first]
            gap = lp[str(tn[first])] - lp[str(tp[first])] if str(tp[first]) in lp else None
            divergences.append(
                {
                    "prompt": i,
                    "position": first,
                    "native_token": tn[first],
                    "port_token": tp[first],
                    "native_logprob_gap": gap,
                }
            )
        for j in range(last + 1):
            d, same = _deltas(p["logprobs"][j], n["logprobs"][j])
            gen_d += d
            gen_top1.append(same)

    def stats(values):
        return {"max": max(values), "mean": sum(values) / len(values), "n": len(values)} if values else None

    return {
        "prompt_positions": {
            "abs_delta_logprob": stats(prompt_d),
            "top1_agreement": sum(prompt_top1) / max(1, len(prompt_top1)),
        },
        "greedy": {
            "identical_sequences": identical,
            "sequences": len(native["outputs"]),
            "tokens_before_divergence": matched,
            "tokens": total,
            "divergences": divergences,
            "abs_delta_logprob_up_to_divergence": stats(gen_d),
            "top1_agreement_up_to_divergence": sum(gen_top1) / max(1, len(gen_top1)),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=Path)
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("-o", "--out-dir", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--top-k", type=int, default=20)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    parser.add_argument("--compiled", action="store_true", help="torch.compile + CUDA graphs (default: eager)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds per engine")
    args = parser.parse_args()

    from scaffold.bench import ALIAS_PLUGIN, checkpoint_view, hf_class_for, write_alias_plugin
    from scaffold.verify.parity import engine_env
    from scaffold.verify.port import load_port, stage_install

    port = load_port(args.port, args.checkpoint)
    spec = port.spec
    args.out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="moe-parity-"))
    stage = stage_install(port)
    write_alias_plugin(stage, spec.architecture, f"{spec.package}.model:{spec.architecture}")
    native_arch = hf_class_for(spec.model_type)
    view = checkpoint_view(port.checkpoint, native_arch, work)
    vocab = json.loads((port.checkpoint / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    prompts = [[rng.randrange(vocab) for _ in range(args.prompt_len)] for _ in range(args.prompts)]
    base = {
        "dtype": args.dtype,
        "max_model_len": args.prompt_len + args.new_tokens + 64,
        "enforce_eager": not args.compiled,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "top_k": args.top_k,
        "new_tokens": args.new_tokens,
        "prompts": prompts,
    }
    results = {}
    for impl, model, expect in (
        ("port", port.checkpoint, f"{spec.package}."),
        ("native", view, "vllm.model_executor.models."),
    ):
        env = engine_env(stage, f"{spec.package},{ALIAS_PLUGIN}") if impl == "port" else engine_env(None, "")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), str(HERE.parent)) if p)
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        env.setdefault("HF_HUB_OFFLINE", "1")
        request = {**base, "model": str(model), "result": str(work / f"{impl}.json")}
        (work / f"{impl}-request.json").write_text(json.dumps(request))
        log = args.out_dir / f"{impl}-{args.dtype}.log"
        t0 = time.perf_counter()
        with open(log, "w") as f:
            proc = subprocess.run(
                [sys.executable, __file__, "--worker", str(work / f"{impl}-request.json")],
                check=False,
                env=env,
                stdout=f,
                stderr=subprocess.STDOUT,
                timeout=args.timeout,
            )
        if proc.returncode != 0:
            tail = log.read_text().splitlines()[-25:]
            print("\n".join(tail))
            raise SystemExit(f"{impl} engine failed (exit {proc.returncode}); log: {log}")
        results[impl] = json.loads((work / f"{impl}.json").read_text())
        cls = results[impl]["model_class"]
        if not cls.startswith(expect) or (impl == "native" and ".transformers" in cls):
            raise SystemExit(f"the {impl} engine served {cls}")
        print(
            f"{impl}: {cls} (runner {results[impl]['model_runner']}), load {results[impl]['load_s']:.1f} s, "
            f"generate {results[impl]['generate_s']:.2f} s, wall {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "vllm_version": results["port"]["vllm_version"],
        "device": results["port"]["device"],
        "checkpoint": str(port.checkpoint),
        "architecture": spec.architecture,
        "native_architecture": native_arch,
        "settings": {k: v for k, v in base.items() if k != "prompts"}
        | {"prompt_len": args.prompt_len, "num_prompts": args.prompts},
        "model_class": {k: v["model_class"] for k, v in results.items()},
        "model_runner": {k: v["model_runner"] for k, v in results.items()},
        **compare(results["port"], results["native"]),
    }
    (args.out_dir / f"parity-{args.dtype}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(
        json.dumps(
            {k: report[k] for k in ("vllm_version", "device", "model_runner", "prompt_positions", "greedy")}, indent=1
        )
    )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        main()
