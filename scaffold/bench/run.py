"""A bench run: stage the port, start the three engines, send them the same rounds, save the report.

What each engine serves:

  port     the generated port, pip-installed into a private staging folder and loaded
           through VLLM_PLUGINS, exactly as `scaffold verify` loads it; a second staged plugin
           registers it under its architecture name even where vLLM has a class of that name;
  native   vLLM's own class for the architecture (a view of the checkpoint whose
           config.json names the transformers class; absent if vLLM has none);
  backend  the transformers modeling backend (model_impl="transformers") on the same view.

The parent sends the same measurement to each engine in turn (the order rotates every
round), so slow phases of a noisy machine fall on all three alike, and repeats the rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import scaffold
from scaffold.bench.engine import Engine, EngineError
from scaffold.bench.report import plot, render_table
from scaffold.bench.settings import IMPLS, Settings, metric_names
from scaffold.bench.stats import PAIRS, ratios, summarize
from scaffold.errors import ScaffoldError
from scaffold.verify.parity import engine_env, port_engine_vars
from scaffold.verify.port import load_port, stage_install

ALIAS_PLUGIN = "scaffold_bench_alias"
# The folder that holds the scaffold package: a worker started from anywhere must import this one.
_SOURCE_ROOT = str(Path(scaffold.__file__).resolve().parent.parent)


# ----------------------------------------------------------------------------- what the engines serve
def hf_class_for(model_type: str) -> str | None:
    """The transformers causal-LM class of `model_type`, which is what vLLM registers natively."""
    # Deferred on purpose: importing transformers takes about a second, and only a run needs it.
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)


def checkpoint_view(checkpoint: Path, architecture: str, root: Path) -> Path:
    """A folder that links every file of `checkpoint` but whose config.json names `architecture`."""
    view = root / f"view-{architecture}"
    view.mkdir(parents=True, exist_ok=True)
    for item in checkpoint.iterdir():
        if item.name != "config.json":
            (view / item.name).symlink_to(item.resolve())
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = [architecture]
    config.pop("auto_map", None)
    (view / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return view


def write_alias_plugin(site: Path, architecture: str, model_class: str) -> None:
    """A second plugin in the staging folder that registers the port under its architecture even
    where vLLM has a class of that name (the port's own plugin then leaves vLLM's class in place)."""
    (site / f"{ALIAS_PLUGIN}.py").write_text(
        '"""Written by `scaffold bench`: serve the port under its architecture name."""\n\n\n'
        "def register() -> None:\n"
        "    from vllm import ModelRegistry\n\n"
        f"    ModelRegistry.register_model({architecture!r}, {model_class!r})\n"
    )
    info = site / f"{ALIAS_PLUGIN}-0.0.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {ALIAS_PLUGIN}\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{ALIAS_PLUGIN} = {ALIAS_PLUGIN}:register\n")


def has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


# ----------------------------------------------------------------------------- the run
def run_bench(port_path: Path, settings: Settings, out_dir: Path, checkpoint: Path | None = None,
              impls: tuple[str, ...] = IMPLS, progress=None) -> dict:
    say = progress or (lambda line: None)
    port = load_port(port_path, checkpoint)
    spec = port.spec
    out_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads((port.checkpoint / "config.json").read_text())
    vocab = int(config.get("vocab_size") or spec.vocab_size)
    work = Path(tempfile.mkdtemp(prefix="scaffold-bench-"))
    metrics = metric_names(settings)
    report = {"port": str(port.path), "checkpoint": str(port.checkpoint), "architecture": spec.architecture,
              "model_type": spec.model_type, "settings": asdict(settings), "metrics": metrics,
              "device": "?", "vllm_version": "?", "implementations": {}, "ratios": {},
              "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}

    base = {"dtype": settings.dtype, "max_model_len": settings.max_model_len, "enforce_eager": settings.enforce_eager,
            "gpu_memory_utilization": settings.gpu_memory_utilization, "max_num_seqs": settings.max_num_seqs,
            "seed": settings.seed, "trust_remote_code": port.trust_remote_code}

    def env_for(stage: Path | None, plugins: str) -> dict:
        env = engine_env(stage, plugins) if stage else engine_env(Path(work), plugins)
        if stage is None:  # no port on the path
            env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
        env["VLLM_PLUGINS"] = plugins
        env["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_gib)
        if settings.multiprocessing:
            env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        if settings.model_runner != "auto":
            env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if settings.model_runner == "v2" else "0"
        env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        env.setdefault("HF_HUB_OFFLINE", "1")
        # The parent runs from anywhere: make sure `python -m scaffold.bench` finds this package.
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env["PYTHONPATH"], _SOURCE_ROOT) if p)
        return env

    plans: dict[str, tuple[dict, dict] | str] = {}
    native_arch = hf_class_for(spec.model_type) if spec.model_type else None
    if "port" in impls:
        say("installing the port into a staging folder")
        stage = stage_install(port, under=work)
        write_alias_plugin(stage, spec.architecture, f"{spec.package}.model:{spec.architecture}")
        plans["port"] = ({**base, "model": str(port.checkpoint), "model_impl": "vllm", "expect": "port",
                          "package": spec.package},
                         {**env_for(stage, f"{spec.package},{ALIAS_PLUGIN}"), **port_engine_vars(spec)})
    view = checkpoint_view(port.checkpoint, native_arch, work) if native_arch else None
    if "native" in impls:
        if view is None:
            plans["native"] = f"transformers has no causal-LM class for model_type {spec.model_type!r}"
        else:
            plans["native"] = ({**base, "model": str(view), "model_impl": "vllm", "expect": "native",
                                "architecture": native_arch}, env_for(None, ""))
    if "backend" in impls:
        plans["backend"] = ({**base, "model": str(view or port.checkpoint), "model_impl": "transformers",
                             "expect": "backend"}, env_for(None, ""))

    engines: dict[str, Engine] = {}
    starting: dict[str, tuple[Engine, dict]] = {}
    json_path = out_dir / "bench.json"

    def save() -> None:
        for impl in IMPLS:
            info = report["implementations"].get(impl)
            if info and info.get("available"):
                info["summary"] = {m: summarize(v) for m, v in info["rounds"].items()}
        for a, b in PAIRS:
            report["ratios"][f"{a}/{b}"] = ratios(report["implementations"], a, b, metrics)
        tmp = json_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        tmp.replace(json_path)

    try:
        # On a GPU the engines start one after the other (each measures the free memory it may take);
        # on a CPU they start together and wait for each other less.
        together = not has_gpu()

        def wait_ready(impl: str) -> None:
            engine, request = starting.pop(impl)
            try:
                ready = engine.receive(timeout=3600)
            except EngineError as exc:
                engine.close()
                if impl != "port":  # measure the others; say why this one is missing
                    report["implementations"][impl] = {"available": False, "reason": exc.message}
                    say(f"{impl}: not measured: {exc.message}")
                    return
                raise
            engine.ready = True
            engines[impl] = engine
            report["device"], report["vllm_version"] = ready["device"], ready["vllm_version"]
            report["implementations"][impl] = {"available": True, "model_class": ready["model_class"],
                                               "load_s": ready["load_s"], "model": request["model"],
                                               "model_runner": ready.get("model_runner"),
                                               "rounds": {m: [] for m in metrics}}
            say(f"{impl}: {ready['model_class']} ready in {ready['load_s']:.1f} s "
                f"(model runner {ready.get('model_runner')})")

        for impl in IMPLS:
            plan = plans.get(impl)
            if plan is None:
                continue
            if isinstance(plan, str):
                report["implementations"][impl] = {"available": False, "reason": plan}
                say(f"{impl}: not measured: {plan}")
                continue
            request, env = plan
            say(f"starting the {impl} engine (log: {out_dir / (impl + '.log')})")
            starting[impl] = (Engine(impl, request, env, out_dir / f"{impl}.log", work), request)
            if not together:
                wait_ready(impl)
        for impl in list(starting):
            wait_ready(impl)
        if not engines:
            raise ScaffoldError("no engine could be started.", port.path)

        live = [i for i in IMPLS if i in engines]
        steps_per_round = len(live) * (len(settings.mixes) + len(settings.concurrencies))
        total = steps_per_round * (settings.repeats + 1)
        step = 0

        def measure(impl: str, command: dict, label: str, warmup: bool) -> dict:
            nonlocal step
            step += 1
            result = engines[impl].call(command)
            shown = (f"{result['total_tok_s']:.1f} tok/s" if "total_tok_s" in result
                     else f"TTFT {result['ttft_ms']:.1f} ms, ITL {result['itl_ms']:.2f} ms")
            say(f"[{step:>3}/{total}] {'warm-up' if warmup else 'round'} {label}: {impl:<8} {shown}")
            return result

        for r in range(-1, settings.repeats):  # round -1 warms every engine up on every measurement
            warmup = r < 0
            order = live[r % len(live):] + live[: r % len(live)] if not warmup else live
            label_round = "" if warmup else f"{r + 1}/{settings.repeats}"
            for k, mix in enumerate(settings.mixes):
                n = max(1, mix.num_prompts // 4) if warmup else mix.num_prompts
                command = {"op": "throughput", "prompt_len": mix.prompt_len, "output_len": mix.output_len,
                           "num_prompts": n, "seed": 1000 * (r + 2) + k, "vocab": vocab}
                for impl in order:
                    result = measure(impl, command, f"{label_round} {mix.name}", warmup)
                    if not warmup:
                        report["implementations"][impl]["rounds"][f"{mix.name} tok/s"].append(result["total_tok_s"])
            for c in settings.concurrencies:
                command = {"op": "latency", "prompt_len": settings.latency_prompt_len,
                           "output_len": settings.latency_output_len, "concurrency": c,
                           "batches": 1 if warmup else settings.latency_batches,
                           "seed": 1000 * (r + 2) + 100 + c, "vocab": vocab}
                for impl in order:
                    result = measure(impl, command, f"{label_round} latency c={c}", warmup)
                    if not warmup:
                        rounds = report["implementations"][impl]["rounds"]
                        rounds[f"TTFT c={c} ms"].append(result["ttft_ms"])
                        rounds[f"ITL c={c} ms"].append(result["itl_ms"])
            if not warmup:
                save()
    finally:
        for engine in [*engines.values(), *(e for e, _ in starting.values())]:
            engine.close()
        shutil.rmtree(work, ignore_errors=True)
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    save()
    (out_dir / "bench.txt").write_text(render_table(report) + "\n")
    plot(report, out_dir / "bench.png")
    return report

