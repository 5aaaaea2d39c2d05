"""`scaffold verify` for a backend package: the transformers backend inside vLLM against transformers.

The same parity checks as a native port (scaffold.verify.parity: transformers in one
process, vLLM in another, the same prompts and tolerance), run with
`model_impl="transformers"`; the engine log of that same run gives the fusion census.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomllib

from scaffold.analysis import analyze
from scaffold.backend import census as census_mod
from scaffold.backend import tensors as tensor_check
from scaffold.backend.compliance import ExpectedFusion, check
from scaffold.backend.plan import BACKEND_TABLE, installed_versions, known_defects
from scaffold.checkpoint import Checkpoint
from scaffold.detect.forms import read_checkpoint  # names an integer table by what the code does with it
from scaffold.errors import ScaffoldError
from scaffold.verify import parity
from scaffold.verify.parity import ParityResult
from scaffold.verify.port import SPEC_FILE
from scaffold.verify.report import Report

BACKEND_MODULE = "vllm.model_executor.models.transformers"
TENSOR_CHECK = "tensors against the backend"


def backend_settings(port_dir: str | Path) -> dict | None:
    """The [backend] table of a package's scaffold_spec.toml; None for a native port."""
    path = Path(port_dir) / SPEC_FILE
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return None
    table = data.get(BACKEND_TABLE)
    if not isinstance(table, dict):
        return None
    return {**table, "_spec": data.get("spec", {}), "_port": data.get("port", {})}


def is_backend_port(port_dir: str | Path) -> bool:
    return backend_settings(port_dir) is not None


def expected_from(settings: dict) -> list[ExpectedFusion]:
    out = []
    for f in settings.get("fusion", []):
        file, _, line = str(f.get("where", "")).rpartition(":")
        out.append(ExpectedFusion(f["kind"], f["module_class"], f["attr"], f["parent_class"], int(f["instances"]),
                                  f.get("group", ""), file, int(line) if line.isdigit() else 0,
                                  f.get("experts_class", "")))
    return out


@dataclass
class Measured:
    """One engine start of the backend: parity against transformers, fusions fired, load time."""

    parity: ParityResult | None  # None when the engine failed (error)
    census: census_mod.Census
    load_seconds: float
    vllm_class: str
    error: str | None = None


def prompts_and_length(ckpt: Checkpoint) -> tuple[list[list[int]], int]:
    """The parity prompts and max_model_len for a checkpoint, from its config alone."""
    vocab = ckpt.config.get("vocab_size")
    prompts = parity.prompts_for(ckpt, vocab if isinstance(vocab, int) and not isinstance(vocab, bool) else 256)
    max_pos = ckpt.config.get("max_position_embeddings")
    return prompts, min(max_pos if isinstance(max_pos, int) and not isinstance(max_pos, bool) else 256, 256)


def measure(ckpt: Checkpoint, expected: list[ExpectedFusion], trusted: bool, *, hf: dict | None = None,
            tensor_parallel_size: int = 1, workdir: Path | None = None,
            say: Callable[[str], None] = lambda line: None,
            reference_attention: str | None = None) -> tuple[Measured, dict]:
    """Run the backend once (and the transformers reference unless `hf` is given, for the same prompts)."""
    own = workdir is None
    workdir = workdir or Path(tempfile.mkdtemp(prefix="scaffold-backend-"))
    try:
        prompts, max_len = prompts_and_length(ckpt)
        if hf is None:
            say("transformers reference (own process)")
            hf = parity.hf_reference(ckpt.path, prompts, trusted, workdir, attn_implementation=reference_attention)
        say(f"transformers backend inside vLLM (tensor_parallel_size={tensor_parallel_size})")
        try:
            vl = parity.vllm_run(ckpt.path, prompts, None, None, max_len, workdir, tensor_parallel_size,
                                 model_impl="transformers", trust_remote_code=trusted)
        except ScaffoldError as exc:
            lines = [ln for ln in exc.message.splitlines() if ln.strip()]
            error = next((ln for ln in reversed(lines) if "Error:" in ln), lines[-1] if lines else exc.message)
            return Measured(None, census_mod.Census(), 0.0, "", error=error.strip()), hf
        result = parity.compare(hf, vl, prompts)
        return Measured(result, census_mod.take(expected, vl.get("engine_log", "")), float(vl.get("load_seconds", 0)),
                        vl["model_class"]), hf
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def add_measured(report: Report, m: Measured, label: str = "backend") -> None:
    if m.error:
        report.add(f"{label} loads in vLLM", False, m.error)
        return
    result = m.parity
    is_backend = m.vllm_class.startswith(BACKEND_MODULE)
    report.add(f"{label} loaded by vLLM", is_backend,
               f"vLLM instantiated {m.vllm_class} in {m.load_seconds:.1f} s" + (
                   "" if is_backend else ", not the transformers backend"), load_seconds=m.load_seconds)
    ok, detail = result.logprob_check()
    report.add("parity: log-probabilities", ok, detail, max_delta=result.max_delta, nonfinite=result.nonfinite)
    report.add("parity: greedy continuation", result.greedy_ok,
               f"{sum(p.greedy_match for p in result.prompts)}/{result.new_tokens * len(result.prompts)} tokens "
               f"identical over {len(result.prompts)} prompts")
    report.add("fusions fired", m.census.ok, m.census.summary(), census=m.census.to_json())
    report.tables.append(result.table())
    report.tables.append("  fusion census (Fused: lines per module class)\n" + m.census.table())
    report.parity = result


def run(port_dir: str | Path, *, checkpoint: str | Path | None = None, trust_remote_code: bool = False,
        tensor_parallel_size: int = 1, static_only: bool = False,
        progress: Callable[[str], None] | None = None, reference_attention: str | None = None) -> Report:
    say = progress or (lambda line: None)
    settings = backend_settings(port_dir)
    if settings is None:
        raise ScaffoldError(f"not a backend package: {SPEC_FILE} has no [{BACKEND_TABLE}] table.", port_dir)
    port_dir = Path(port_dir).resolve()
    ckpt_path = Path(checkpoint or settings["_port"].get("checkpoint", ""))
    if not (ckpt_path / "config.json").exists():
        raise ScaffoldError(f"the checkpoint {ckpt_path} is not there; pass --checkpoint to say where it is.",
                            port_dir / SPEC_FILE)
    ckpt = read_checkpoint(ckpt_path)
    report = Report(str(port_dir), str(ckpt.path))
    say("static checks")
    comp = check(ckpt)
    report.add("backend compliance", comp.compliant,
               f"{len([r for r in comp.rules if r.ok])} rule(s) met in {', '.join(comp.files)}" if comp.compliant
               else "; ".join(comp.blockers()))
    arch = settings["_spec"].get("architecture")
    report.add("architecture", ckpt.config.get("architectures", [None])[0] == arch,
               f"the checkpoint's architecture is {ckpt.config.get('architectures', [None])[0]} (package: {arch})")
    expected = expected_from(settings)
    now = [e.to_json() for e in comp.expected]
    recorded = [e.to_json() for e in expected]
    if now != recorded:
        report.note("expected fusions", "the modeling source now predicts other fusions than the package records")
    versions = installed_versions()
    drift = {k: (settings.get(f"{k}_version"), v) for k, v in versions.items() if settings.get(f"{k}_version") != v}
    if drift:
        report.note("versions", "recorded vs installed: " + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in drift.items()))
    for defect in known_defects(comp, versions):
        report.note("known backend defect", defect)
    trusted = trust_remote_code or bool(settings.get("trust_remote_code"))
    say("checkpoint tensors against the backend's module tree")
    tensors = tensor_check.check(ckpt, trusted, comp.origin == "remote code")
    # Unchecked for want of consent to run the checkpoint's code is "not run"; unchecked otherwise fails.
    report.add(TENSOR_CHECK, tensors.ok if tensors.checked or trusted else None, tensors.summary(),
               problems=tensors.problems)
    if static_only:
        report.add("parity", None, "not checked: --static-only runs no engine")
        return report
    if not tensors.ok:  # the engine would refuse the checkpoint, or load it into something else
        report.add("parity", None, "not checked: the checkpoint's tensors do not fit the backend's module tree")
        return report
    if comp.origin == "remote code" and not trusted:
        report.add("parity", None, "not run: the backend and the reference run the checkpoint's own code; "
                                   "pass --trust-remote-code to allow it")
        return report
    measured, _ = measure(ckpt, expected, trusted, tensor_parallel_size=tensor_parallel_size, say=say,
                          reference_attention=reference_attention)
    measured.census.spec_notes = spec_notes(ckpt, expected)
    add_measured(report, measured)
    return report


def spec_notes(ckpt: Checkpoint, expected: list[ExpectedFusion]) -> list[str]:
    """Where the spec (when the generator understands the checkpoint) predicts other fusions than the source."""
    try:
        analysis = analyze(ckpt.path)
    except ScaffoldError:
        return []
    return census_mod.cross_check(expected, analysis.spec, analysis.rows)
