"""`scaffold verify`: static checks, then the port inside vLLM against transformers."""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from scaffold.detect import detect
from scaffold.detect.chunks import block_size_for
from scaffold.detect.forms import read_checkpoint  # names an integer table by what the code does with it
from scaffold.detect.identity import transformers_model_types
from scaffold.errors import ScaffoldError
from scaffold.proc import run_python
from scaffold.review import VERIFY_MARKER
from scaffold.text import markdown_fence
from scaffold.verify import (  # backend: packages served by vLLM's transformers backend
    backend,
    dequantize,
    parity,
    static,
)
from scaffold.verify import twin as twins
from scaffold.verify.parity import engine_env
from scaffold.verify.port import Port, load_port, stage_install
from scaffold.verify.probes import FEEDS, MODULE_NOISE_FACTOR, first_nonfinite, localize, probes_for
from scaffold.verify.report import FAIL, PASS, SKIP, Check, Report
from scaffold.verify.static import run_static


def _error_line(message: str) -> str:
    """The line of an engine failure that says what went wrong."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error:" in line or "Exception:" in line:
            return re.sub(r"^\[rank\d+\]:\s*", "", line)
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
    tensor_parallel_proof: bool = True,
    progress: Callable[[str], None] | None = None,
    twin: bool = False,
    reference_attention: str | None = None,
) -> Report:
    """Verify the port at `port_dir`.

    reference_attention: the attention implementation transformers runs the reference with (None: eager).

    twin=True: for a checkpoint too large for this machine. The static checks read the
    real checkpoint's headers only; the tensor-parallel proof and parity run on a
    shrunk random twin of it (scaffold.verify.twin).
    """
    say = progress or (lambda line: None)
    if backend.is_backend_port(port_dir):
        if twin:
            raise ScaffoldError("--twin verifies generated native ports; this port serves the checkpoint through "
                                "vLLM's transformers backend, which has no model code of its own to run on a twin.",
                                port_dir)
        return backend.run(port_dir, checkpoint=checkpoint, trust_remote_code=trust_remote_code,
                           tensor_parallel_size=tensor_parallel_size, static_only=static_only, progress=progress,
                           reference_attention=reference_attention)
    port = load_port(port_dir, checkpoint)
    ckpt = read_checkpoint(port.checkpoint)
    report = Report(str(port.path), str(ckpt.path))
    if twin:
        twins.check_buildable(ckpt, trust_remote_code or port.trust_remote_code)
        say("static checks (the checkpoint's headers only)")
        with _headers_only(report):
            drift = run_static(report, port, ckpt)
    else:
        say("static checks")
        drift = run_static(report, port, ckpt)
    say("installing the port into a private folder")
    stage = stage_install(port)
    try:
        if twin:
            return _on_twin(report, port, ckpt, stage, drift, trust_remote_code, tensor_parallel_size, static_only,
                            tensor_parallel_proof, say, reference_attention)
        live_tp = 1 if static_only else tensor_parallel_size
        sharding = _Sharding.plan(report, port, ckpt, stage, live_tp=live_tp) if tensor_parallel_proof else None
        if static_only:
            _Sharding.finish(sharding, say)
            report.add("parity", None, "not run (--static-only)")
            return report
        return _parity(report, port, ckpt, stage, drift, trust_remote_code, tensor_parallel_size, say, sharding,
                       reference_attention)
    finally:
        shutil.rmtree(stage.parent, ignore_errors=True)


@contextmanager
def _headers_only(report: Report):
    """run_static without reading tensor data: the one check that reads data (a tied head stored beside the
    embedding, compared value by value) is reported as not compared.

    To be replaced by a parameter of static.run_static / check_tied (a data-reading switch) when static.py is
    next changed; until then the comparison is swapped out for the duration of the block."""
    first = len(report.checks)
    compare = static._tensors_equal
    static._tensors_equal = lambda ckpt, a, b: None  # the check reports None as skipped
    try:
        yield
    finally:
        static._tensors_equal = compare
    for check in report.checks[first:]:
        check.data["on"] = "checkpoint"
        if check.name == "tied embeddings" and check.status == SKIP:
            check.detail = ("the port ties lm_head to embed_tokens and the checkpoint also stores lm_head.weight; "
                            "their values were not compared (--twin reads no tensor data of the checkpoint)")


def _on_twin(report: Report, port: Port, ckpt, stage: Path, drift: list[str], trust_remote_code: bool,
             tensor_parallel_size: int, static_only: bool, tensor_parallel_proof: bool, say,
             reference_attention: str | None = None) -> Report:
    """Build the twin of the port's checkpoint and run the TP proof and parity on it."""
    trusted = trust_remote_code or port.trust_remote_code
    folder, kept = twins.twin_dir(ckpt)
    first = len(report.checks)
    try:
        say(f"building the twin ({'cached in ' + str(folder) if kept else 'temporary'})")
        twins.build_twin(ckpt, folder, trust_remote_code=trusted)
        twin_ckpt = read_checkpoint(folder)
        try:
            real_detected = detect(ckpt)
        except ScaffoldError:
            real_detected = None
        try:
            twin_detected = detect(twin_ckpt)
        except ScaffoldError as exc:
            report.add("twin", False, f"the twin built from {ckpt.config_file} is not understood as the checkpoint "
                                      f"is: {exc.message}")
            return report
        spec, unexpected = twins.twin_spec(port.spec, real_detected, twin_detected)
        summary = twins.info(folder)["summary"]
        report.note("twin", summary + "; the checks after this line ran on the twin", path=str(folder),
                    changes=twins.info(folder)["changes"])
        if unexpected:
            report.note("twin spec", "the twin also differs from the checkpoint in " + ", ".join(
                f"{name} ({getattr(real_detected, name)!r} -> {getattr(twin_detected, name)!r})"
                for name in unexpected))
        problems, compared = twins.layout_problems(port.spec, ckpt, twin_ckpt, spec)
        if problems:
            report.add("twin layout", False, "the twin does not store the tensors the checkpoint stores for its "
                       f"first {spec.num_layers} layers ({'; '.join(problems)}), so it cannot stand for it")
            report.add("parity", None, "not run: the twin does not stand for the checkpoint")
            return report
        report.add("twin layout", True, f"the twin stores the same {compared} tensor names as the checkpoint's "
                                        f"first {spec.num_layers} layers")
        twin_port = Port(port.path, spec, twin_ckpt.path, port.trust_remote_code)
        sharding = None
        if tensor_parallel_proof:
            sharding = _Sharding.plan(report, twin_port, twin_ckpt, stage, real_spec=port.spec,
                                      live_tp=1 if static_only else tensor_parallel_size)
        if static_only:
            _Sharding.finish(sharding, say)
            report.add("parity", None, "not run (--static-only)")
            return report
        return _parity(report, twin_port, twin_ckpt, stage, drift, trust_remote_code, tensor_parallel_size, say,
                       sharding, reference_attention)
    finally:
        for check in report.checks[first:]:
            check.data.setdefault("on", "twin")
            if check.name not in ("twin", "twin spec", "twin layout") and check.status != SKIP:
                check.detail = f"on the twin: {check.detail}"
        if not kept:
            shutil.rmtree(folder.parent, ignore_errors=True)


def tp_problem(spec, tp: int) -> str | None:
    """Why vLLM cannot shard the port over `tp` ranks, or None: it splits each layer's query heads and MLP rows
    evenly, and its KV heads evenly or replicates them (fewer KV heads than ranks, a divisor of them)."""
    if tp <= 1 or spec.qkv_layout == "latent":
        return None
    for layer in range(spec.num_layers):
        heads, kv = spec.heads_of(layer), spec.kv_heads_of(layer)
        width = spec.layer_intermediate_sizes[layer] if spec.layer_intermediate_sizes else spec.intermediate_size
        if heads % tp:
            return f"layer {layer}'s {heads} query heads do not divide into {tp} ranks"
        if kv >= tp and kv % tp or kv < tp and tp % kv:
            return (f"layer {layer}'s {kv} KV heads neither divide into {tp} ranks nor replicate evenly on them "
                    "(vLLM's QKVParallelLinear needs one or the other)")
        if spec.has_dense_mlp and width % tp:
            return f"layer {layer}'s MLP of {width} rows does not divide into {tp} ranks"
    return None


def _servable_at_real_sizes(check, spec, tp_sizes=(2, 4, 8)) -> None:
    """The twin proves the sharding at its own sizes; whether the real sizes divide is arithmetic on headers."""
    if check.status == SKIP:
        return
    heads, kv, inter = spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    every = set(spec.layer_num_heads) or {heads}  # each layer's own query heads, where they differ
    kvs = set(spec.layer_num_kv_heads) or {kv}  # and KV heads
    widths = set(spec.layer_intermediate_sizes) or {inter}  # each layer's own MLP width, where they differ
    # Differential attention pairs head i with head i + H/2: each rank computes H / (2 TP) pairs.
    pairs = 2 if spec.diff_lambdas else 1
    divides = [tp for tp in tp_sizes if not (any(h % (tp * pairs) for h in every)
                                             or any(k < tp and tp % k or k >= tp and k % tp for k in kvs)
                                             or any(w % tp for w in widths) or spec.diff_lambdas and kv % tp)]
    others = [tp for tp in tp_sizes if tp not in divides]
    rows = "/".join(map(str, sorted(widths)))
    check.detail += (f"; at the checkpoint's sizes ({heads} query heads, {kv} KV heads, {rows} MLP rows) "
                     f"TP={', '.join(map(str, divides)) or 'none'} divide"
                     + (f", TP={', '.join(map(str, others))} do not" if others else ""))
    check.data["servable_at_checkpoint_sizes"] = divides


def _parity(report: Report, port: Port, ckpt, stage: Path, drift: list[str], trust_remote_code: bool,
            tensor_parallel_size: int, say, sharding: _Sharding | None = None,
            reference_attention: str | None = None) -> Report:
    try:
        return _compare_engines(report, port, ckpt, stage, drift, trust_remote_code, tensor_parallel_size, say,
                                sharding if tensor_parallel_size == 1 else None, reference_attention)
    finally:
        _Sharding.finish(sharding, say)  # where the engine did not run it


def _compare_engines(report: Report, port: Port, ckpt, stage: Path, drift: list[str], trust_remote_code: bool,
                     tensor_parallel_size: int, say, sharding: _Sharding | None,
                     reference_attention: str | None = None) -> Report:
    trusted = trust_remote_code or port.trust_remote_code
    if (unsplit := tp_problem(port.spec, tensor_parallel_size)) is not None:
        # vLLM would fail in a worker process with a bare assertion; say which count does not divide instead.
        report.add("port loads in vLLM", False, f"not run at tensor_parallel_size={tensor_parallel_size}: {unsplit}")
        return report
    if needs_remote_code(port, ckpt) and not trusted:
        files = ", ".join(sorted(ckpt.sources))
        report.add("parity", None, f"not run: the transformers reference needs the checkpoint's own code ({files}); "
                                   "pass --trust-remote-code to allow running it")
        return report

    workdir = Path(tempfile.mkdtemp(prefix="scaffold-verify-"))
    try:
        prompts = parity.prompts_for(ckpt, port.spec.vocab_size)
        max_len = min(port.spec.max_position, 256)
        quantized = dequantize.scheme(ckpt.config)
        reference = ckpt.path
        if quantized:
            say(f"dequantizing the {quantized} checkpoint to float32 for the transformers reference")
            reference = dequantize.write_dequantized(ckpt, workdir / "dequantized")
        probes = probes_for(port.spec)
        longest = max(prompts, key=len)
        hf_probe = {"prompt": longest, "points": [(p.label, p.hf_module, p.hf_output) for p in probes]}
        # The two processes are independent: run them side by side when two copies of the
        # model fit in memory with room to spare (most of each is start-up, on one core).
        together = _fits_twice(ckpt)
        with ThreadPoolExecutor(max_workers=1) as pool:
            say("transformers reference (own process)" + (", beside the engine" if together else ""))
            if together:
                hf_job = pool.submit(parity.hf_reference, reference, prompts, trusted, workdir, probe=hf_probe,
                                     attn_implementation=reference_attention)
            else:
                hf = parity.hf_reference(reference, prompts, trusted, workdir, probe=hf_probe,
                                         attn_implementation=reference_attention)
            say(f"port inside vLLM (tensor_parallel_size={tensor_parallel_size})"
                + (", then tensor-parallel sharding on simulated ranks" if sharding else ""))
            try:
                vl = parity.vllm_run(ckpt.path, prompts, stage, port.spec.package, max_len, workdir,
                                     tensor_parallel_size, probe={
                                         "prompt": longest,
                                         "points": [(p.label, p.port_module, p.port_output) for p in probes]},
                                     sharding=sharding.request if sharding else None,
                                     dtype=dequantize.engine_dtype(quantized) if quantized else "float32",
                                     block_size=block_size_for(port.spec.attention_chunk_size),
                                     engine_vars=parity.port_engine_vars(port.spec))
            except ScaffoldError as exc:
                if together:
                    hf_job.result()  # a failing reference is reported first, as when run one after the other
                report.add("port loads in vLLM", False, _error_line(exc.message))
                return report
            if together:
                hf = hf_job.result()
        if sharding and "sharding" in vl:
            sharding.record(vl["sharding"].get("results"), vl["sharding"].get("error"))
        result = parity.compare(hf, vl, prompts)
        if quantized:
            result.tolerance = dequantize.TOLERANCES[quantized]
            result.reference = (f"transformers in float32 on the dequantized {quantized} weights, the port in "
                                f"{dequantize.engine_dtype(quantized)} on the quantized checkpoint")
        floor = None
        if not quantized and not (result.logprob_check()[0] and result.greedy_ok):
            say("transformers reference in float64 (how far float32 rounding alone moves it)")
            floor = _noise_floor(reference, prompts, trusted, workdir, hf_probe, reference_attention, hf, vl)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    expected_class = f"{port.spec.package}.model.{port.spec.architecture}"
    report.add("port loaded by vLLM", result.vllm_class == expected_class,
               f"vLLM instantiated {result.vllm_class}" + ("" if result.vllm_class == expected_class
                                                           else f", not the port {expected_class}")
               + (f" (tensor_parallel_size={tensor_parallel_size})" if tensor_parallel_size > 1 else ""))
    ok, detail = result.logprob_check()
    report.add("parity: log-probabilities", ok, detail, max_delta=result.max_delta, nonfinite=result.nonfinite)
    greedy = (f"{sum(p.greedy_match for p in result.prompts)}/{result.new_tokens * len(result.prompts)} tokens "
              f"identical over {len(result.prompts)} prompts")
    if quantized and not result.greedy_ok:
        # Different arithmetic (quantized kernels against float32 on the dequantized weights) may flip a near
        # tie; the log-probabilities, compared while both continuations agree, carry the verdict.
        report.add("parity: greedy continuation", None, f"{greedy}; not required of a quantized port, whose kernels "
                                                        "may flip a near tie")
    else:
        report.add("parity: greedy continuation", result.greedy_ok, greedy)
    noise = {}
    if floor is not None:
        if isinstance(floor, str):
            report.note("float32 noise floor", f"not measured: {floor}")
        else:
            floor, probes64 = floor
            report.note("float32 noise floor", floor.detail(), within=floor.within,
                        reference_delta=floor.reference.max_delta, port_delta=floor.port.max_delta)
            # transformers' float32 module outputs against its float64 ones: the rounding each module carries
            noise = dict(localize(probes64, hf.get("probes", {}), probes)[0])
    report.tables.append(result.table())
    report.parity = result
    if not (ok and (result.greedy_ok or quantized)):
        _localize(report, hf.get("probes", {}), vl.get("probes", {}), probes, drift, noise)
    return report


def _noise_floor(reference: Path, prompts, trusted: bool, workdir: Path, hf_probe: dict,
                 reference_attention: str | None, hf: dict, vl: dict):
    """(NoiseFloor, the float64 run's module outputs), or why the float64 reference did not run (remote code that
    casts to float32 inside, say)."""
    try:
        hf64 = parity.hf_reference(reference, prompts, trusted, workdir, probe=hf_probe,
                                   attn_implementation=reference_attention, dtype="float64")
    except ScaffoldError as exc:
        return _error_line(exc.message)
    return parity.noise_floor(hf, hf64, vl, prompts), hf64.get("probes", {})


def _fits_twice(ckpt) -> bool:
    """Whether the transformers reference and the engine, each holding the model in float32, fit in
    a third of the memory available now."""
    fp32_bytes = sum(4 * math.prod(info.shape) for info in ckpt.tensors.values())
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return False
    return 2 * fp32_bytes < available / 3


def record_in_review(port_dir: str | Path, report: Report) -> None:
    """Replace the verify section of the port's REVIEW.md with this report."""
    review = Path(port_dir) / "REVIEW.md"
    if not review.exists():
        return
    text = review.read_text(encoding="utf-8")
    head = text.split(VERIFY_MARKER, 1)[0]
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = f"{VERIFY_MARKER}\n\nLatest `scaffold verify`, {stamp}:\n\n{markdown_fence(report.render())}\n"
    review.write_text(head + body, encoding="utf-8")


class _Sharding:
    """The tensor-parallel proof (scaffold.verify.tp) for one port: planned where it belongs in the report,
    run inside the parity engine's process when there is one (it imports vLLM too), else in its own."""

    CHECK = "tensor-parallel sharding"

    def __init__(self, report: Report, position: int, request: dict, stage: Path, package: str, real_spec=None):
        self.report, self.position, self.request = report, position, request
        self.stage, self.package, self.real_spec = stage, package, real_spec
        self.done = False

    @classmethod
    def plan(cls, report: Report, port: Port, ckpt, stage: Path, tp_sizes=(2, 4, 8), real_spec=None,
             live_tp: int = 1):
        """The request for layer 0's tensors, or None after reporting why the proof does not apply.
        `live_tp`: the tensor-parallel size the parity engine runs at (over 1, the sharding is measured live)."""
        spec = port.spec
        live = (f"the parity below ran sharded over {live_tp} ranks" if live_tp > 1
                else "run verify --tp N to check sharded parity live")
        if dequantize.scheme(ckpt.config):
            report.add(cls.CHECK, None, "not simulated: the checkpoint is quantized, and the simulated ranks shard "
                                        f"float weights; {live}")
            return None
        if spec.is_moe:
            report.add(cls.CHECK, None, f"not simulated: the experts are sharded by vLLM's FusedMoE loader; {live}")
            return None
        layer0 = {n: str(ckpt.path / info.file) for n, info in ckpt.tensors.items()
                  if n.startswith("model.layers.0.") and n.rsplit(".", 2)[-2] in
                  ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj") and n.endswith(".weight")}
        if spec.qkv_layout == "separate" and spec.value_dim != spec.head_dim:
            report.add(cls.CHECK, None, f"not simulated: value heads {spec.v_head_dim} wide, q and k heads "
                                        f"{spec.head_dim} (the simulated ranks cut v by head_dim); {live}")
            return None
        if spec.qkv_layout != "separate" or spec.mlp_kind != "gated" or len(layer0) != 5:
            report.add(cls.CHECK, None, "not simulated: the checkpoint does not store q, k, v, gate and up "
                                        "separately")
            return None
        request = {"model_class": f"{spec.package}.model:{spec.architecture}", "num_heads": spec.heads_of(0),
                   "num_kv_heads": spec.kv_heads_of(0), "head_dim": spec.head_dim, "hidden_size": spec.hidden_size,
                   "intermediate_size": spec.intermediate_size, "tensors": layer0, "tp_sizes": list(tp_sizes),
                   "query_heads": spec.heads_of(0) * spec.query_rows // (spec.num_heads * spec.head_dim),
                   # Differential attention: each rank computes the head pairs (i, i + H/2) of its o_proj columns.
                   "paired_heads": bool(spec.diff_lambdas)}
        return cls(report, len(report.checks), request, stage, spec.package, real_spec)

    def record(self, results: list[dict] | None, error: str | None = None) -> None:
        """Put the check in its planned place."""
        if error is not None:
            check = Check(self.CHECK, FAIL, _error_line(error))
        else:
            wrong = [r for r in results if r["status"] == "wrong"]
            detail = "; ".join(f"TP={r['tp']}: {r['status']} ({r['detail']})" for r in results)
            check = Check(self.CHECK, FAIL if wrong else PASS, detail, {"results": results})
        if self.real_spec is not None:
            _servable_at_real_sizes(check, self.real_spec)
        self.report.checks.insert(self.position, check)
        self.done = True

    @staticmethod
    def finish(sharding: _Sharding | None, say) -> None:
        """Run the proof in a process of its own, unless it already ran (or does not apply)."""
        if sharding is None or sharding.done:
            return
        say("tensor-parallel sharding, simulated ranks")
        with tempfile.TemporaryDirectory() as tmp:
            request = {**sharding.request, "out": str(Path(tmp) / "tp.json")}
            (Path(tmp) / "req.json").write_text(json.dumps(request))
            proc = run_python("scaffold.verify.tp", Path(tmp) / "req.json",
                              env=engine_env(sharding.stage, sharding.package), capture_output=True, text=True,
                              check=False)
            if proc.returncode != 0:
                sharding.record(None, proc.stderr or proc.stdout)
                return
            sharding.record(json.loads(Path(request["out"]).read_text()))


def _localize(report: Report, hf: dict, port: dict, probes, drift: list[str], noise: dict | None = None) -> None:
    """`noise`: per probe, transformers' own float32 error (against float64); a module within MODULE_NOISE_FACTOR of it
    has not diverged."""
    if not hf or not port:
        report.add("divergence", None, "not localized: module outputs were not captured (tensor parallel run)")
        return
    bad = first_nonfinite(hf, port, probes)
    if bad is not None:
        probe, sides = bad
        report.add("divergence", False, f"first module output holding NaN or an infinity: {probe.label}, from "
                                        f"{sides}; spec fields feeding it: {', '.join(FEEDS[probe.kind])}",
                   module=probe.label, nonfinite=sides, fields=FEEDS[probe.kind])
        return
    errors, first = localize(hf, port, probes, noise)
    if first is None:
        report.add("divergence", False, "every module output agrees to 1e-3"
                   + (f" or within {MODULE_NOISE_FACTOR:g}x transformers' own float32 error there (against float64)"
                      if noise else "") + "; the difference is in sampling or in positions past the probed prompt")
        if noise:
            report.tables.append(_module_table(errors, None, noise))
        return
    rel = dict(errors)[first.label]
    feeds = FEEDS[first.kind]
    suspects = [d for d in drift if d.split(":", 1)[0] in feeds]
    cause = ("; likely cause: " + "; ".join(suspects)) if suspects else ""
    report.add("divergence", False,
               f"first diverging module: {first.label} (relative error {rel:.2e}); spec fields feeding it: "
               f"{', '.join(feeds)}{cause}", module=first.label, relative_error=rel, fields=feeds,
               suspects=suspects)
    report.tables.append(_module_table(errors, first.label, noise))


def _module_table(errors: list[tuple[str, float]], first: str | None, noise: dict) -> str:
    width = max(len(label) for label, _ in errors)
    head = "  module outputs, port vs transformers (relative error, longest prompt)"
    if noise:
        head += "; beside it transformers float32 vs float64"
    return "\n".join([head] + [
        f"  {label:<{width}}  {err:9.2e}" + (f"  {noise[label]:9.2e}" if label in noise else "")
        + ("  <- first divergence" if label == first else "") for label, err in errors])
