"""`scaffold compare CKPT`: the native port and the transformers backend side by side on one checkpoint.

One transformers reference (its own process) serves both. Each implementation that can
take the checkpoint runs in its own vLLM engine process: the native port generated into
a temporary folder and installed privately (as `scaffold verify` does), and vLLM's
transformers backend (`model_impl="transformers"`), whose `Fused:` lines are counted
against what the modeling source predicts. Reported per implementation: parity against
transformers (max |dlogp| over the top-20 tokens, greedy agreement), fusions fired,
and engine load time.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from scaffold.analysis import analyze
from scaffold.backend.plan import plan
from scaffold.detect import policy
from scaffold.detect.chunks import block_size_for
from scaffold.detect.forms import read_checkpoint  # names an integer table by what the code does with it
from scaffold.errors import ScaffoldError
from scaffold.pipeline import generate
from scaffold.text import echo
from scaffold.verify import parity
from scaffold.verify.backend import measure, prompts_and_length
from scaffold.verify.port import load_port, stage_install


@dataclass
class Side:
    impl: str  # native | transformers
    available: bool
    reason: str = ""  # why not available, or the failure
    vllm_class: str = ""
    max_delta: float | None = None
    tolerance: float | None = None
    greedy: str = ""
    greedy_ok: bool | None = None
    fusions: str = ""
    fusions_ok: bool | None = None
    load_seconds: float | None = None
    census: dict = field(default_factory=dict)

    @property
    def parity_ok(self) -> bool | None:
        if self.max_delta is None:
            return None
        return self.max_delta <= self.tolerance and bool(self.greedy_ok)

    def to_json(self) -> dict:
        return {"impl": self.impl, "available": self.available, "reason": self.reason, "vllm_class": self.vllm_class,
                "max_delta": self.max_delta, "tolerance": self.tolerance, "greedy": self.greedy,
                "parity_ok": self.parity_ok, "fusions": self.fusions, "fusions_ok": self.fusions_ok,
                "load_seconds": self.load_seconds, "census": self.census}


def _fill(side: Side, result, vllm_class: str, load_seconds: float) -> None:
    side.vllm_class = vllm_class
    side.max_delta = result.max_delta
    side.tolerance = result.tolerance
    side.greedy_ok = result.greedy_ok
    side.greedy = f"{sum(p.greedy_match for p in result.prompts)}/{result.new_tokens * len(result.prompts)}"
    side.load_seconds = load_seconds


def compare(checkpoint: str | Path, *, trust_remote_code: bool = False, progress=None) -> list[Side]:
    say = progress or (lambda line: None)
    ckpt = read_checkpoint(checkpoint)
    policy.check(ckpt)  # as `scaffold new` refuses it, on both paths
    if ckpt.sources and not trust_remote_code and "auto_map" in ckpt.config:
        raise ScaffoldError("the checkpoint ships its own code, which both the transformers reference and the "
                            "backend run; pass --trust-remote-code to allow it.", ckpt.config_file)
    native, backend = Side("native", False), Side("transformers", False)
    try:
        analyze(checkpoint)
    except ScaffoldError as exc:
        native.reason = f"no native port: {exc.text}"
        can_native = False
    else:
        can_native = True
    bplan = plan(ckpt, trust_remote_code)
    blockers = bplan.blockers(include_defects=False)
    if blockers:
        backend.reason = "refused: " + "; ".join(blockers)
    if not can_native and blockers:
        return [native, backend]

    prompts, max_len = prompts_and_length(ckpt)
    workdir = Path(tempfile.mkdtemp(prefix="scaffold-compare-"))
    try:
        say("transformers reference (own process)")
        hf = parity.hf_reference(ckpt.path, prompts, trust_remote_code, workdir)
        if can_native:
            native.available = True
            try:
                say("generating and installing the native port")
                view = renamed_view(ckpt, workdir / "native-view")
                analysis = analyze(view)
                port_dir = generate(analysis, workdir / "port", trust_remote_code=trust_remote_code)
                stage = stage_install(load_port(port_dir), under=workdir)
                say("native port inside vLLM")
                vl = parity.vllm_run(view, prompts, stage, analysis.spec.package, max_len, workdir,
                                     engine_vars=parity.port_engine_vars(analysis.spec),
                                     block_size=block_size_for(analysis.spec.attention_chunk_size))
                _fill(native, parity.compare(hf, vl, prompts), vl["model_class"], float(vl.get("load_seconds", 0)))
                expected = f"{analysis.spec.package}.model.{analysis.spec.architecture}"
                if vl["model_class"] != expected:
                    native.reason = f"vLLM instantiated {vl['model_class']}, not the port {expected}"
                native.fusions = "by construction (the generated model is written with vLLM's fused layers)"
            except ScaffoldError as exc:
                native.reason = exc.message.strip().splitlines()[-1]
        if not blockers:
            backend.available = True
            measured, _ = measure(ckpt, bplan.compliance.expected, trust_remote_code, hf=hf, workdir=workdir,
                                  say=say)
            if measured.error:
                backend.reason = measured.error
            else:
                _fill(backend, measured.parity, measured.vllm_class, measured.load_seconds)
                backend.fusions = measured.census.summary()
                backend.fusions_ok = measured.census.ok
                backend.census = measured.census.to_json()
            if bplan.defects:
                backend.reason = "known defect: " + "; ".join(bplan.defects)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return [native, backend]


def renamed_view(ckpt, folder: Path) -> Path:
    """The checkpoint under an architecture name vLLM has no class for, so only the port can serve it.

    Files are hard-linked (copied across file systems); config.json is rewritten.
    """
    folder.mkdir(parents=True)
    for item in ckpt.path.iterdir():
        if item.is_file() and item.name != "config.json":
            try:
                os.link(item, folder / item.name)
            except OSError:
                shutil.copy2(item, folder / item.name)
    config = dict(ckpt.config)
    config["architectures"] = ["Scaffold" + config["architectures"][0]]
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def render(sides: list[Side], checkpoint: str) -> str:
    lines = [f"compare {checkpoint}", ""]
    for s in sides:
        lines.append(f"{s.impl}")
        if not s.available:
            lines += [f"  not run: {s.reason}", ""]
            continue
        if s.max_delta is None:
            lines += [f"  FAILED to run: {s.reason}", ""]
            continue
        verdict = "pass" if s.parity_ok else "FAIL"
        lines += [
            f"  vLLM class     {s.vllm_class}",
            (f"  parity         {verdict}: max |dlogp| {s.max_delta:.2e} (tolerance {s.tolerance:.0e}), "
             f"greedy {s.greedy} tokens identical"),
            f"  fusions        {s.fusions}"
            + ("" if s.fusions_ok is None else f" ({'ok' if s.fusions_ok else 'MISSING'})"),
            f"  load time      {s.load_seconds:.1f} s",
        ]
        if s.reason:
            lines.append(f"  note           {s.reason}")
        lines.append("")
    return "\n".join(lines)


@click.command("compare")
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--trust-remote-code", is_flag=True, help="Allow the checkpoint's own code to run.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_command(checkpoint: Path, trust_remote_code: bool, as_json: bool) -> None:
    """Run CHECKPOINT as a native port and through vLLM's transformers backend, side by side."""
    started = time.perf_counter()
    sides = compare(checkpoint, trust_remote_code=trust_remote_code,
                    progress=None if as_json else lambda line: echo(line, err=True))
    if as_json:
        echo(json.dumps({"checkpoint": str(checkpoint), "seconds": time.perf_counter() - started,
                               "implementations": [s.to_json() for s in sides]}, indent=2))
    else:
        echo(render(sides, str(checkpoint)))
    if not any(s.parity_ok for s in sides):
        sys.exit(1)
