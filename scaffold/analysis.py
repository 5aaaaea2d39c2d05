"""What the generators start from: read -> detect -> override -> weight table, as one Analysis."""

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


def analyze(checkpoint: str | Path, spec_file: str | Path | None = None, ckpt: Checkpoint | None = None) -> Analysis:
    ckpt = ckpt or read_checkpoint(checkpoint)  # `ckpt`: the checkpoint already read, not read twice
    spec = detect(ckpt)
    if spec_file is not None:
        spec.apply_overrides(load_overrides(spec_file), str(spec_file))
    rows, homeless = weight_table(spec, ckpt)
    if homeless:
        more = f" and {len(homeless) - 3} more" if len(homeless) > 3 else ""
        raise UnsupportedArchitecture(
            f"{len(homeless)} checkpoint tensor(s) have no home in the port: {', '.join(homeless[:3])}{more}.",
            ckpt.path,
            hint="A port that dropped them would compute something else.",
        )
    return Analysis(ckpt, spec, rows)
