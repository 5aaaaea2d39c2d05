"""The transformers-backend generator: a package that serves a checkpoint through vLLM's transformers backend.

A peer of the native generator (scaffold.pipeline): both start from what lies below them (the checkpoint,
scaffold.backend.plan's verdict) and write through scaffold.render's machinery; neither imports the other.
"""

from __future__ import annotations

from pathlib import Path

from scaffold import __version__, tomlio
from scaffold.backend.plan import BACKEND_TABLE, BackendPlan, package_name, serve_command
from scaffold.errors import UnsupportedArchitecture
from scaffold.render import Rendered, display_name, render_tree, write_package
from scaffold.review import backend_review_markdown


def spec_toml(p: BackendPlan, package: str, reason: str) -> str:
    """scaffold_spec.toml of a backend package: identity, the launch settings, the expected fusions."""
    cfg = p.ckpt.config
    spec = {"architecture": cfg["architectures"][0], "model_type": str(cfg.get("model_type", "")), "package": package}
    for key, name in (("vocab_size", "vocab_size"), ("max_position_embeddings", "max_position")):
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            spec[name] = cfg[key]
    backend = {"model_impl": "transformers", "trust_remote_code": p.needs_remote_code, "reason": reason,
               "source": p.compliance.origin, "model_class": p.compliance.model_class or "",
               **{f"{k}_version": v for k, v in sorted(p.versions.items())}}
    backend_table = tomlio.table(backend)
    if p.compliance.expected:
        backend_table.add("fusion", tomlio.array_of_tables([e.to_json() for e in p.compliance.expected]))
    port = {"checkpoint": str(p.ckpt.path), "scaffold_version": __version__, "trust_remote_code": p.needs_remote_code}
    return tomlio.document(
        ["A package that serves this checkpoint through vLLM's transformers backend (no model code).",
         "scaffold verify reads [backend] and [port]."],
        {"spec": tomlio.table(spec), BACKEND_TABLE: backend_table,
         "port": tomlio.table(port, note="Where this package came from; scaffold verify reads it.")})


def generate(p: BackendPlan, out: str | Path | None, *, force: bool = False, reason: str = "") -> Path:
    """Write the backend package (templates/backend, through scaffold.render's machinery)."""
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
    files["REVIEW.md"] = backend_review_markdown(p, package, context["reason"])
    return write_package(Rendered(files, protect=[p.ckpt.path]), Path(out or package), force=force)
