"""`scaffold verify`: static checks, then the port inside vLLM against transformers."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from scaffold.checkpoint import read_checkpoint
from scaffold.detect.identity import transformers_model_types
from scaffold.errors import ScaffoldError
from scaffold.mapping import weight_table
from scaffold.verify.port import Port, load_port, stage_install
from scaffold.verify.probes import FEEDS, localize, probes_for
from scaffold.verify.report import Report
from scaffold.verify.static import run_static


def _error_line(message: str) -> str:
    """The line of an engine failure that says what went wrong."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error:" in line or "Exception:" in line:
            return line
    return lines[-1] if lines else message


def needs_remote_code(port: Port, ckpt) -> bool:
    """transformers can only build the reference from the checkpoint's own code."""
    return bool(ckpt.sources) and port.spec.model_type not in transformers_model_types()


def run(
    port_dir: str | Path,
    *,
    checkpoint: str | Path | None = None,
    trust_remote_code: bool = False,
    tensor_parallel_size: int = 1,
    static_only: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Report:
    say = progress or (lambda line: None)
    from scaffold.backend import verify as backend  # a package serving the checkpoint through vLLM's backend

    if backend.is_backend_port(port_dir):
        return backend.run(port_dir, checkpoint=checkpoint, trust_remote_code=trust_remote_code,
                           tensor_parallel_size=tensor_parallel_size, static_only=static_only, progress=progress)
    port = load_port(port_dir, checkpoint)
    ckpt = read_checkpoint(port.checkpoint)
    report = Report(str(port.path), str(ckpt.path))
    say("static checks")
    drift = run_static(report, port, ckpt)
    if static_only:
        report.add("parity", None, "not run (--static-only)")
        return report
    trusted = trust_remote_code or port.trust_remote_code
    if needs_remote_code(port, ckpt) and not trusted:
        files = ", ".join(sorted(ckpt.sources))
        report.add("parity", None, f"not run: the transformers reference needs the checkpoint's own code ({files}); "
                                   "pass --trust-remote-code to allow running it")
        return report

    from scaffold.verify import parity

    workdir = Path(tempfile.mkdtemp(prefix="scaffold-verify-"))
    try:
        say("installing the port into a private folder")
        stage = stage_install(port)
        prompts = parity.prompts_for(ckpt, port.spec.vocab_size)
        max_len = min(port.spec.max_position, 256)
        rows, _ = weight_table(port.spec, ckpt)
        probes = probes_for(rows, port.spec.num_layers)
        longest = max(prompts, key=len)
        say("transformers reference (own process)")
        hf = parity.hf_reference(ckpt.path, prompts, trusted, workdir, probe={
            "prompt": longest, "points": [(p.label, p.hf_module, "first") for p in probes]})
        say(f"port inside vLLM (tensor_parallel_size={tensor_parallel_size})")
        try:
            vl = parity.vllm_run(ckpt.path, prompts, stage, port.spec.package, max_len, workdir,
                                 tensor_parallel_size, probe={
                                     "prompt": longest,
                                     "points": [(p.label, p.port_module, p.port_output) for p in probes]})
        except ScaffoldError as exc:
            report.add("port loads in vLLM", False, _error_line(exc.message))
            return report
        result = parity.compare(hf, vl, prompts)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    expected_class = f"{port.spec.package}.model.{port.spec.architecture}"
    report.add("port loaded by vLLM", result.vllm_class == expected_class,
               f"vLLM instantiated {result.vllm_class}" + ("" if result.vllm_class == expected_class
                                                           else f", not the port {expected_class}"))
    ok = result.max_delta <= result.tolerance
    report.add("parity: log-probabilities", ok,
               f"max |dlogp| {result.max_delta:.2e} over the top-{parity.TOP_K} tokens at every position "
               f"(tolerance {result.tolerance:.0e})", max_delta=result.max_delta)
    report.add("parity: greedy continuation", result.greedy_ok,
               f"{sum(p.greedy_match for p in result.prompts)}/{result.new_tokens * len(result.prompts)} tokens "
               f"identical over {len(result.prompts)} prompts")
    report.tables.append(result.table())
    report.parity = result
    if not (ok and result.greedy_ok):
        _localize(report, hf.get("probes", {}), vl.get("probes", {}), probes, drift)
    return report


def _localize(report: Report, hf: dict, port: dict, probes, drift: list[str]) -> None:
    if not hf or not port:
        report.add("divergence", None, "not localized: module outputs were not captured (tensor parallel run)")
        return
    errors, first = localize(hf, port, probes)
    if first is None:
        report.add("divergence", False, "every module output agrees to 1e-3; the difference is in sampling or "
                                        "in positions past the probed prompt")
        return
    rel = dict(errors)[first.label]
    feeds = FEEDS[first.kind]
    suspects = [d for d in drift if d.split(":", 1)[0] in feeds]
    cause = ("; likely cause: " + "; ".join(suspects)) if suspects else ""
    report.add("divergence", False,
               f"first diverging module: {first.label} (relative error {rel:.2e}); spec fields feeding it: "
               f"{', '.join(feeds)}{cause}", module=first.label, relative_error=rel, fields=feeds,
               suspects=suspects)
    width = max(len(label) for label, _ in errors)
    report.tables.append("\n".join(["  module outputs, port vs transformers (relative error, longest prompt)"] + [
        f"  {label:<{width}}  {err:9.2e}{'  <- first divergence' if label == first.label else ''}"
        for label, err in errors]))
