"""`scaffold verify`: static checks, then the port inside vLLM against transformers."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from scaffold.checkpoint import read_checkpoint
from scaffold.detect.identity import transformers_model_types
from scaffold.verify.port import Port, load_port, stage_install
from scaffold.verify.report import Report
from scaffold.verify.static import run_static


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
    port = load_port(port_dir, checkpoint)
    ckpt = read_checkpoint(port.checkpoint)
    report = Report(str(port.path), str(ckpt.path))
    say("static checks")
    run_static(report, port, ckpt)
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
        say("transformers reference (own process)")
        hf = parity.hf_reference(ckpt.path, prompts, trusted, workdir)
        say(f"port inside vLLM (tensor_parallel_size={tensor_parallel_size})")
        vl = parity.vllm_run(ckpt.path, prompts, stage, port.spec.package, max_len, workdir, tensor_parallel_size)
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
    return report
