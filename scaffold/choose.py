"""`scaffold new --impl`: which generator takes a checkpoint, the native one or vLLM's transformers backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scaffold.analysis import Analysis, analyze
from scaffold.backend.plan import BackendPlan, plan
from scaffold.detect import forms, policy
from scaffold.errors import ScaffoldError, UnsupportedArchitecture

IMPLS = ("auto", "native", "transformers")


@dataclass
class Choice:
    """Which implementation `scaffold new` emits, and why."""

    impl: str  # "native" or "transformers"
    reason: str
    analysis: Analysis | None = None  # set for "native"
    backend: BackendPlan | None = None  # set for "transformers"
    native_error: ScaffoldError | None = None  # why the native generator refused, when it was tried


def choose(checkpoint: str | Path, spec_file: str | Path | None = None, impl: str = "auto",
           trust_remote_code: bool = False) -> Choice:
    """auto: a native port when the spec can express the architecture, else vLLM's transformers backend when
    the model's code is compliant, the backend is not known wrong for it, and every checkpoint tensor was
    checked to land on a parameter of the module tree the backend builds (and every parameter to be filled;
    scaffold.backend.tensors); otherwise an error naming what blocks each path."""
    if impl not in IMPLS:
        raise ScaffoldError(f"--impl must be one of {', '.join(IMPLS)}, not {impl!r}.")
    ckpt = forms.read_checkpoint(checkpoint)  # an unreadable checkpoint is reported as such, on every path
    native_error: ScaffoldError | None = None
    if impl != "transformers":
        try:
            analysis = analyze(checkpoint, spec_file, ckpt, run_code=trust_remote_code)
            return Choice("native", "the spec expresses the architecture", analysis=analysis)
        except ScaffoldError as exc:
            # With a --spec file, detection checked its values against the checkpoint: a refusal (a fault in the
            # file, or a value the tensors contradict) is the user's to fix, never answered by a package that
            # ignores the file.
            if impl == "native" or spec_file is not None:
                raise
            native_error = exc
    # What no port expresses is refused on every path, as the native one did (detection runs the same check);
    # its message says where the backend may serve it.
    policy.check(ckpt)
    backend = plan(ckpt, trust_remote_code)
    blockers = backend.blockers(include_defects=impl == "auto")
    if not blockers:
        # The problem alone: its hint (try the backend) is what this choice just did.
        reason = (f"the native generator cannot express it: {native_error.problem.rstrip('.')}" if native_error
                  else "asked for with --impl transformers")
        return Choice("transformers", reason, backend=backend, native_error=native_error)
    if impl == "transformers":
        raise UnsupportedArchitecture("the transformers backend cannot serve this checkpoint: "
                                      + "; ".join(blockers) + ".", ckpt.config_file)
    raise UnsupportedArchitecture(
        f"neither implementation can take this checkpoint. Native port: {native_error.text.rstrip('.')}. "
        f"Transformers backend: {'; '.join(blockers)}.", ckpt.config_file)
