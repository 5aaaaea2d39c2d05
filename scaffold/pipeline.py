"""The compiler passes end to end: read -> detect -> override -> render -> write."""

from __future__ import annotations

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


def analyze(checkpoint: str | Path, spec_file: str | Path | None = None) -> Analysis:
    ckpt = read_checkpoint(checkpoint)
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
    rendered = render(analysis.spec, analysis.ckpt, trust_remote_code=trust_remote_code, review=review)
    return write_package(rendered, Path(out), force=force)
