"""`scaffold bench PORT`: the port against vLLM's own implementation and the transformers backend.

Three engines serve the same checkpoint with the same dtype and settings, each in a
process of its own, all alive at once:

  port     the generated port, pip-installed into a private staging folder and loaded
           through VLLM_PLUGINS, exactly as `scaffold verify` loads it;
  native   vLLM's own class for the architecture (a view of the checkpoint whose
           config.json names the transformers class; absent if vLLM has none);
  backend  the transformers modeling backend (model_impl="transformers").

The parent sends the same measurement to each engine in turn (the order rotates every
round), so slow phases of a noisy machine fall on all three alike, and repeats the
rounds. Reported: the median and the spread over rounds, and the ratios of the paired
rounds. Metrics: offline throughput (prompt + generated tokens per second) for a
prefill-heavy and a decode-heavy mix, and latency at low concurrency (time to first token
and inter-token latency, 1 and 4 requests at once) measured step by step in vLLM's own
engine loop.

The engine side of this module runs as `python -m scaffold.bench --worker REQUEST.json`.
"""

from __future__ import annotations

import json
import math
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from scaffold.errors import ScaffoldError
from scaffold.text import echo
from scaffold.proc import python_command

IMPLS = ("port", "native", "backend")
ALIAS_PLUGIN = "scaffold_bench_alias"


# ----------------------------------------------------------------------------- settings
@dataclass
class Mix:
    name: str
    prompt_len: int
    output_len: int
    num_prompts: int


@dataclass
class Settings:
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    enforce_eager: bool = False
    repeats: int = 3
    mixes: list[Mix] = field(default_factory=list)
    latency_prompt_len: int = 128
    latency_output_len: int = 64
    concurrencies: tuple[int, ...] = (1, 4)
    latency_batches: int = 2  # batches of `concurrency` requests per round
    multiprocessing: bool = False  # vLLM's engine core in a process of its own
    gpu_memory_utilization: float = 0.28  # per engine: three are alive at once
    kv_cache_gib: int = 2  # per engine, CPU only
    max_num_seqs: int | None = None
    model_runner: str = "auto"  # vLLM's choice, or "v1" / "v2" for every engine
    seed: int = 0


def parse_mix(name: str, text: str, num_prompts: int) -> Mix:
    try:
        prompt_len, output_len = (int(x) for x in text.split(":"))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not IN:OUT (prompt and generated tokens, e.g. 512:16)") from None
    return Mix(name, prompt_len, output_len, num_prompts)


def metric_names(settings: Settings) -> list[str]:
    names = [f"{m.name} tok/s" for m in settings.mixes]
    for c in settings.concurrencies:
        names += [f"TTFT c={c} ms", f"ITL c={c} ms"]
    return names


def higher_is_better(metric: str) -> bool:
    return metric.endswith("tok/s")


# ----------------------------------------------------------------------------- checkpoint views
def hf_class_for(model_type: str) -> str | None:
    """The transformers causal-LM class of `model_type`, which is what vLLM registers natively."""
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


# ----------------------------------------------------------------------------- engines (parent side)
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


# ----------------------------------------------------------------------------- statistics and output
def summarize(values: list[float]) -> dict:
    if not values:
        return {}
    median = statistics.median(values)
    return {"median": median, "min": min(values), "max": max(values),
            "spread": (max(values) - min(values)) / median if median else 0.0, "n": len(values)}


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free confidence interval for the median of `values`: the order statistics
    x(k) and x(n+1-k) for the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k), is at
    least `level`. Returns (low, high, coverage); with fewer than six values no k reaches 95%,
    so it is the full range with the coverage that range has (e.g. 75% for three rounds)."""
    ordered = sorted(values)
    n = len(ordered)

    def coverage(k: int) -> float:  # P(x(k) <= median <= x(n+1-k))
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= level:
        k += 1
    return ordered[k - 1], ordered[n - k], coverage(k)


def paired(results: dict, a: str, b: str, metric: str) -> list[float]:
    """The per-round ratios a/b of one metric, each of two values measured side by side in the
    same round; none where either implementation was not measured."""
    va = results.get(a, {}).get("rounds", {}).get(metric, [])
    vb = results.get(b, {}).get("rounds", {}).get(metric, [])
    return [x / y for x, y in zip(va, vb) if y > 0]


def ratios(results: dict, a: str, b: str, metrics: list[str]) -> dict:
    """Per metric: the median over rounds of a/b (`paired`), with the range and a confidence
    interval for that median (`median_interval`)."""
    out = {}
    for metric in metrics:
        values = paired(results, a, b, metric)
        if values:
            low, high, level = median_interval(values)
            out[metric] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                           "ci_low": low, "ci_high": high, "ci_level": level}
    return out


def verdict(pair: str, ratio: dict, higher_better: bool) -> str | None:
    """Which of the pair A/B is faster where the paired rounds tell them apart (the ratio's
    interval excludes 1), else None."""
    a, b = pair.split("/")
    if ratio["ci_low"] > 1:
        return f"{a if higher_better else b} faster"
    if ratio["ci_high"] < 1:
        return f"{b if higher_better else a} faster"
    return None


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 1000 else f"{value:.4g}"


def render_table(report: dict) -> str:
    metrics = report["metrics"]
    impls = [i for i in IMPLS if report["implementations"].get(i, {}).get("available")]
    head = f"{'metric':<24}" + "".join(f"{i + ' (median, spread)':>28}" for i in impls)
    pairs = [(a, b) for a, b in (("port", "native"), ("port", "backend")) if a in impls and b in impls]
    head += "".join(f"{a + '/' + b + ' [interval]':>26}" for a, b in pairs)
    lines = [head, "-" * len(head)]
    for metric in metrics:
        row = f"{metric:<24}"
        for impl in impls:
            s = report["implementations"][impl]["summary"].get(metric)
            row += f"{_fmt(s['median']):>16} ±{100 * s['spread'] / 2:>5.1f}%    " if s else f"{'-':>28}"
        for a, b in pairs:
            r = report["ratios"][f"{a}/{b}"].get(metric)
            shown = f"{r['median']:.3f} [{r['ci_low']:.3f}-{r['ci_high']:.3f}]" if r else "-"
            row += f"{shown:>26}"
        lines.append(row)
    lines.append("spread: half the range over rounds, as a share of the median; ratios: median of the "
                 "paired per-round ratios (throughput: > 1 means the port is faster; latency: < 1 means it is).")
    levels = {r["ci_level"] for pair in report["ratios"].values() for r in pair.values()}
    if levels:
        lines.append(f"[interval]: a {100 * min(levels):.0f}% confidence interval for that median (order "
                     "statistics of the paired rounds); where it holds 1, the rounds do not tell the two apart.")
    told = [f"{pair} {metric}: {found}" for pair, by_metric in report["ratios"].items()
            for metric, r in by_metric.items() if (found := verdict(pair, r, higher_is_better(metric)))]
    lines.append("told apart at that level: " + ("; ".join(told) if told else "none"))
    runners = {report["implementations"][i].get("model_runner") for i in impls}
    if len(runners) > 1:
        lines.append(f"WARNING: the engines ran different vLLM model runners ({', '.join(map(str, runners))}); "
                     "pass --model-runner v1 or v2 to compare the models alone.")
    for impl in IMPLS:
        info = report["implementations"].get(impl, {})
        if info.get("available"):
            lines.append(f"{impl}: {info['model_class']} (model runner {info.get('model_runner')}, "
                         f"engine ready in {info['load_s']:.1f} s)")
        else:
            lines.append(f"{impl}: not measured: {info.get('reason', 'left out by --only')}")
    return "\n".join(lines)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    impls = [i for i in IMPLS if report["implementations"].get(i, {}).get("available")]
    metrics = report["metrics"]
    groups = [("throughput (tokens/s, higher is better)", [m for m in metrics if higher_is_better(m)]),
              ("time to first token (ms)", [m for m in metrics if m.startswith("TTFT")]),
              ("inter-token latency (ms)", [m for m in metrics if m.startswith("ITL")])]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    colors = {"port": "tab:blue", "native": "tab:orange", "backend": "tab:green"}
    width = 0.8 / max(1, len(impls))
    for ax, (title, names) in zip(axes, groups):
        for k, impl in enumerate(impls):
            summary = report["implementations"][impl]["summary"]
            med = [summary.get(m, {}).get("median", 0.0) for m in names]
            low = [med[j] - summary.get(m, {}).get("min", med[j]) for j, m in enumerate(names)]
            high = [summary.get(m, {}).get("max", med[j]) - med[j] for j, m in enumerate(names)]
            xs = [j + (k - (len(impls) - 1) / 2) * width for j in range(len(names))]
            ax.bar(xs, med, width, yerr=[low, high], capsize=3, label=impl, color=colors[impl])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([m.rsplit(" ", 1)[0] for m in names], fontsize=8)
        ax.set_title(title, fontsize=10)
    axes[0].legend()
    s = report["settings"]
    fig.suptitle(f"{report['architecture']} on {report['device']} (vLLM {report['vllm_version']}, {s['dtype']}, "
                 f"{s['repeats']} interleaved rounds; bars: median, whiskers: min-max)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------------------- the run
def run_bench(port_path: Path, settings: Settings, out_dir: Path, checkpoint: Path | None = None,
              impls: tuple[str, ...] = IMPLS, progress=None) -> dict:
    from scaffold.verify.parity import engine_env
    from scaffold.verify.port import load_port, stage_install

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
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env["PYTHONPATH"], here) if p)
        return env

    plans: dict[str, tuple[dict, dict] | str] = {}
    native_arch = hf_class_for(spec.model_type) if spec.model_type else None
    if "port" in impls:
        say("installing the port into a staging folder")
        stage = stage_install(port)
        write_alias_plugin(stage, spec.architecture, f"{spec.package}.model:{spec.architecture}")
        plans["port"] = ({**base, "model": str(port.checkpoint), "model_impl": "vllm", "expect": "port",
                          "package": spec.package},
                         env_for(stage, f"{spec.package},{ALIAS_PLUGIN}"))
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
        for a, b in (("port", "native"), ("port", "backend"), ("native", "backend")):
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


# ----------------------------------------------------------------------------- the command
@click.command()
@click.argument("port", type=click.Path(path_type=Path))
@click.option("--checkpoint", type=click.Path(path_type=Path),
              help="Checkpoint to serve (default: the one the port was generated from).")
@click.option("-o", "--out-dir", type=click.Path(path_type=Path), default=Path("bench-results"), show_default=True,
              help="Folder for bench.json, bench.txt, bench.png and the engines' logs.")
@click.option("--quick", is_flag=True, help="A smoke test: tiny workloads, two rounds, eager mode.")
@click.option("--repeats", type=int, help="Interleaved rounds (default 3; --quick: 2).")
@click.option("--prompts", "num_prompts", type=int, help="Prompts per throughput run (default 32; --quick: 4).")
@click.option("--prefill", "prefill", help="Prefill-heavy mix, IN:OUT tokens (default 512:16; --quick: 64:4).")
@click.option("--decode", "decode", help="Decode-heavy mix, IN:OUT tokens (default 32:128; --quick: 8:24).")
@click.option("--latency", "latency", help="Latency requests, IN:OUT tokens (default 128:64; --quick: 16:8).")
@click.option("--dtype", default="bfloat16", show_default=True)
@click.option("--max-model-len", type=int, help="Default: the longest request, rounded up.")
@click.option("--max-num-seqs", type=int, help="vLLM's max_num_seqs (default: vLLM's).")
@click.option("--eager/--compiled", default=None, help="enforce_eager (default: compiled; --quick: eager).")
@click.option("--multiprocessing/--in-process", "multiprocessing", default=None,
              help="vLLM's engine core in its own process (default: on a GPU yes, on a CPU no).")
@click.option("--gpu-memory-utilization", type=float, default=0.28, show_default=True,
              help="Per engine (three engines share the GPU).")
@click.option("--kv-cache-gib", type=int, default=2, show_default=True, help="Per engine, CPU only.")
@click.option("--model-runner", type=click.Choice(["auto", "v1", "v2"]), default="auto", show_default=True,
              help="vLLM's model runner for every engine (VLLM_USE_V2_MODEL_RUNNER); auto: vLLM's choice, which "
              "in vLLM 0.24 is V2 only for an allowlist of architecture names that a port's name is not on.")
@click.option("--only", "only", multiple=True, type=click.Choice(IMPLS), help="Measure these implementations only.")
def bench(port: Path, checkpoint: Path | None, out_dir: Path, quick: bool, repeats: int | None,
          num_prompts: int | None, prefill: str | None, decode: str | None, latency: str | None, dtype: str,
          max_model_len: int | None, max_num_seqs: int | None, eager: bool | None, multiprocessing: bool | None,
          gpu_memory_utilization: float, kv_cache_gib: int, model_runner: str, only: tuple[str, ...]) -> None:
    """Measure PORT against vLLM's native implementation and the transformers backend, side by side."""
    n = num_prompts or (4 if quick else 32)
    settings = Settings(
        dtype=dtype,
        enforce_eager=quick if eager is None else eager,
        repeats=repeats or (2 if quick else 3),
        mixes=[parse_mix("prefill-heavy", prefill or ("64:4" if quick else "512:16"), n),
               parse_mix("decode-heavy", decode or ("8:24" if quick else "32:128"), n)],
        multiprocessing=has_gpu() if multiprocessing is None else multiprocessing,
        gpu_memory_utilization=gpu_memory_utilization,
        kv_cache_gib=kv_cache_gib,
        max_num_seqs=max_num_seqs,
        model_runner=model_runner,
    )
    lat = parse_mix("latency", latency or ("16:8" if quick else "128:64"), 1)
    settings.latency_prompt_len, settings.latency_output_len = lat.prompt_len, lat.output_len
    if quick:
        settings.latency_batches = 1
    longest = max([m.prompt_len + m.output_len for m in settings.mixes] + [lat.prompt_len + lat.output_len])
    settings.max_model_len = max_model_len or -(-longest // 256) * 256
    started = time.monotonic()
    report = run_bench(port, settings, out_dir, checkpoint, only or IMPLS,
                       progress=lambda line: echo(f"[{time.monotonic() - started:7.1f}s] {line}", err=True))
    echo(render_table(report))
    echo(f"wrote {out_dir / 'bench.json'}, {out_dir / 'bench.txt'} and {out_dir / 'bench.png'}")


# ----------------------------------------------------------------------------- engine side
def _model_class(model) -> str:
    return f"{type(model).__module__}.{type(model).__qualname__}"


def _prompts(seed: int, n: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def _worker(request_file: str) -> None:
    request = json.loads(Path(request_file).read_text())
    out = os.fdopen(request["result_fd"], "w")

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    try:
        started = time.perf_counter()
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
        model_class = llm.apply_model(_model_class)[0]
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
                prompts = [TokensPrompt(prompt_token_ids=p) for p in
                           _prompts(command["seed"], command["num_prompts"], command["prompt_len"], command["vocab"])]
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
                    prompts = _prompts(command["seed"] + b, command["concurrency"], command["prompt_len"],
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
        import traceback

        traceback.print_exc()
        reply({"error": f"{type(exc).__name__}: {exc}"})
        sys.exit(1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        bench()
