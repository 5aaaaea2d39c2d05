"""What the generators start from: read -> detect (with the user's spec file pinned first) -> weight table,
as one Analysis."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from scaffold.checkpoint import Checkpoint
from scaffold.detect import forms, settled, understand
from scaffold.errors import UnsupportedArchitecture
from scaffold.mapping import WeightRow, weight_table
from scaffold.settle import settle
from scaffold.spec import FIELDS, Spec, group_heading, load_overrides, validate_identifiers, validate_names


@dataclass
class Analysis:
    ckpt: Checkpoint
    spec: Spec
    rows: list[WeightRow]


def analyze(checkpoint: str | Path, spec_file: str | Path | None = None, ckpt: Checkpoint | None = None,
            run_code: bool = False) -> Analysis:
    """run_code: the reference's code may run to settle what reading it left open (scaffold.settle): the
    user passed --trust-remote-code, or the code is transformers' own."""
    ckpt = ckpt or forms.read_checkpoint(checkpoint)  # `ckpt`: the checkpoint already read, not read twice
    overrides = load_overrides(spec_file) if spec_file is not None else None
    origin = str(spec_file) if spec_file is not None else None
    # The spec file's values are pinned before detection runs: detection checks them against the tensors, and
    # refuses for a field only when neither it nor the file can say what it is.
    spec = settle(understand(ckpt, overrides, origin), ckpt, allowed=run_code or not ckpt.sources)
    return complete(ckpt, spec, spec_file)


def complete(ckpt: Checkpoint, spec: Spec, spec_file: str | Path | None = None) -> Analysis:
    """The Analysis of a spec detected (and settled) from `ckpt` with `spec_file`: its weight table."""
    origin = str(spec_file) if spec_file is not None else None
    spec = settled(spec, ckpt, origin)  # refuses for what is unknown; checks the names (again: cheap)
    if origin is not None:
        validate_identifiers(spec, origin)
        validate_names(spec, origin)
    rows, homeless = weight_table(spec, ckpt)
    if homeless:
        more = f" and {len(homeless) - 3} more" if len(homeless) > 3 else ""
        raise UnsupportedArchitecture(
            f"{len(homeless)} checkpoint tensor(s) have no home in the port: {', '.join(homeless[:3])}{more}.",
            ckpt.path,
            hint="A port that dropped them would compute something else.",
        )
    return Analysis(ckpt, spec, rows)


def partial(checkpoint: str | Path, spec_file: str | Path | None = None,
            run_code: bool = False) -> tuple[Checkpoint, Spec]:
    """What detection understood of `checkpoint`, with the spec file applied, and spec.unknowns saying what it
    could not determine: for `scaffold inspect`, which shows it where `analyze` refuses."""
    ckpt = forms.read_checkpoint(checkpoint)
    overrides = load_overrides(spec_file) if spec_file is not None else None
    spec = understand(ckpt, overrides, str(spec_file) if spec_file is not None else None)
    return ckpt, settle(spec, ckpt, allowed=run_code or not ckpt.sources)


def partial_text(spec: Spec) -> str:
    """The partial spec, field by field with its source, and what stayed unknown with the candidates considered."""
    lines, previous = ["spec (partial: some fields could not be determined)"], None
    for name in FIELDS:
        if heading := group_heading(name, previous):
            lines.append(f" {heading}")
        previous = name
        if name in spec.unknowns:
            lines.append(f"  {name:32} UNKNOWN")
        elif name == "names" and any(f.startswith("names.") for f in spec.unknowns):
            lines.append(f"  {name:32} UNKNOWN (roles below)")
        else:
            lines.append(f"  {name:32} {getattr(spec, name)!r:40} {spec.source(name)}")
    lines.append("unknown")
    for u in spec.unknowns.values():
        lines.append(f"  {u.field}: {u.reason}")
        lines += [f"    considered {c}: {why}" for c, why in u.candidates]
    return "\n".join(lines)


def partial_json(spec: Spec, checkpoint: str | Path) -> dict:
    unknown = set(spec.unknowns) | ({"names"} if any(f.startswith("names.") for f in spec.unknowns) else set())
    return {
        "checkpoint": str(checkpoint),
        "complete": False,
        "spec": {n: getattr(spec, n) for n in FIELDS if n not in unknown},
        "provenance": {n: str(spec.source(n)) for n in FIELDS if n not in unknown},
        "unknowns": [u.to_json() for u in spec.unknowns.values()],
    }
