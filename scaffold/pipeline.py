"""The compiler passes end to end: read -> detect -> override -> render -> write."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from scaffold.checkpoint import Checkpoint, read_checkpoint
from scaffold.detect import detect
from scaffold.errors import UnsupportedArchitecture
from scaffold.mapping import WeightRow, weight_table
from scaffold.spec import Spec, load_overrides


@dataclass
class Analysis:
    ckpt: Checkpoint
    spec: Spec
    rows: list[WeightRow]


def analyze(checkpoint: str | Path, spec_file: str | Path | None = None, ckpt: Checkpoint | None = None) -> Analysis:
    ckpt = ckpt or read_checkpoint(checkpoint)  # `ckpt`: the checkpoint already read, not read twice
    spec = detect(ckpt)
    if spec_file is not None:
        spec.apply_overrides(load_overrides(spec_file), str(spec_file))
    rows, homeless = weight_table(spec, ckpt)
    if homeless:
        more = f" and {len(homeless) - 3} more" if len(homeless) > 3 else ""
        raise UnsupportedArchitecture(
            f"{len(homeless)} checkpoint tensor(s) have no home in the port: {', '.join(homeless[:3])}{more}. "
            "A port that dropped them would compute something else.",
            ckpt.path,
        )
    return Analysis(ckpt, spec, rows)


def generate(analysis: Analysis, out: str | Path, *, force: bool = False, trust_remote_code: bool = False) -> Path:
    from scaffold.render import render, write_package
    from scaffold.review import review_markdown

    review = review_markdown(analysis)
    rendered = render(analysis.spec, analysis.ckpt, trust_remote_code=trust_remote_code, review=review,
                      table=(analysis.rows, []))
    return write_package(rendered, Path(out), force=force)


IMPLS = ("auto", "native", "transformers")


@dataclass
class Choice:
    """Which implementation `scaffold new` emits, and why."""

    impl: str  # "native" or "transformers"
    reason: str
    analysis: Analysis | None = None
    backend: object | None = None  # scaffold.backend.plan.BackendPlan


def choose(checkpoint: str | Path, spec_file: str | Path | None = None, impl: str = "auto",
           trust_remote_code: bool = False) -> Choice:
    """auto: a native port when the spec can express the architecture, else vLLM's transformers backend when
    the model's code is compliant, the backend is not known wrong for it, and every checkpoint tensor was
    checked to land on a parameter of the module tree the backend builds (and every parameter to be filled;
    scaffold.backend.tensors); otherwise an error naming what blocks each path."""
    from scaffold.backend.plan import plan
    from scaffold.errors import ScaffoldError

    if impl not in IMPLS:
        raise ScaffoldError(f"--impl must be one of {', '.join(IMPLS)}, not {impl!r}.")
    native_error: ScaffoldError | None = None
    if impl != "transformers":
        ckpt = read_checkpoint(checkpoint)  # an unreadable checkpoint is reported as such, on every path
        try:
            return Choice("native", "the spec expresses the architecture", analysis=analyze(checkpoint, spec_file, ckpt))
        except ScaffoldError as exc:
            # A fault in the user's --spec file is theirs to fix, never answered by a package that ignores the file.
            if impl == "native" or (spec_file is not None and exc.path == str(spec_file)):
                raise
            native_error = exc
    else:
        ckpt = read_checkpoint(checkpoint)
    backend = plan(ckpt, trust_remote_code)
    blockers = backend.blockers(include_defects=impl == "auto")
    if not blockers:
        first = re.split(r"\.\s+(?=[A-Z]|vLLM)", native_error.problem)[0].rstrip(".") if native_error else ""
        reason = f"the native generator cannot express it: {first}" if native_error \
            else "asked for with --impl transformers"
        return Choice("transformers", reason, backend=backend)
    if impl == "transformers":
        raise UnsupportedArchitecture("the transformers backend cannot serve this checkpoint: "
                                      + "; ".join(blockers) + ".", ckpt.config_file)
    raise UnsupportedArchitecture(
        f"neither implementation can take this checkpoint. Native port: {native_error.problem.rstrip('.')}. "
        f"Transformers backend: {'; '.join(blockers)}.", ckpt.config_file)
