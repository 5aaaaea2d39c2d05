"""The native generator: an Analysis rendered into a vLLM model package (its peer for vLLM's
transformers backend is scaffold.backend.generator; scaffold.choose picks between them)."""

from __future__ import annotations

from pathlib import Path

from scaffold.analysis import Analysis
from scaffold.render import render, write_package
from scaffold.review import review_markdown


def generate(analysis: Analysis, out: str | Path, *, force: bool = False, trust_remote_code: bool = False) -> Path:
    review = review_markdown(analysis)
    rendered = render(analysis.spec, analysis.ckpt, trust_remote_code=trust_remote_code, review=review,
                      table=(analysis.rows, []))
    return write_package(rendered, Path(out), force=force)
