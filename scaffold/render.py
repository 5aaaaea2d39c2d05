"""Render a Spec into a plugin package: Jinja2, safe literals, ruff, atomic write.

Everything taken from a checkpoint reaches generated code either as a validated
identifier (spec.validate_identifiers) or through the `py` / `toml` filters,
which only emit literals of plain data. The package is rendered into a
temporary folder beside the destination, formatted, parsed, linted, and only
then moved into place, so an error never leaves a half-written port behind.
"""

from __future__ import annotations

import ast
import keyword
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2

from scaffold import __version__
from scaffold.checkpoint import Checkpoint
from scaffold.errors import OutputError, ScaffoldError
from scaffold.mapping import stacked_modules
from scaffold.spec import IDENTIFIER, Spec, to_toml

PACKAGE_PLACEHOLDER = "__package__"

# config.json keys that are not architecture settings, or that PretrainedConfig handles itself.
CONFIG_KEYS_NOT_REDECLARED = {
    "architectures", "auto_map", "model_type", "transformers_version", "torch_dtype", "dtype", "_name_or_path",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "is_encoder_decoder", "output_hidden_states", "output_attentions", "return_dict",
    "chunk_size_feed_forward", "problem_type", "id2label", "label2id", "num_labels", "torchscript",
    "tokenizer_class", "prefix", "task_specific_params", "add_cross_attention", "tie_encoder_decoder",
    "finetuning_task", "is_decoder", "cross_attention_hidden_size", "quantization_config",
}


def templates_dir() -> Path:
    """The templates/ folder: beside the package in a checkout, inside it when installed."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "templates", here / "templates"):
        if (candidate / "package").is_dir():
            return candidate
    raise ScaffoldError(f"the templates folder is missing from the installation ({here.parent / 'templates'}).")


# ------------------------------------------------------------------ filters
def py_literal(value: Any) -> str:
    """A Python literal for plain data; anything else is refused, never stringified."""
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return repr(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ScaffoldError(f"refusing to render the non-finite number {value!r} into generated code.")
        return repr(value)
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, (list, tuple)):
        inner = ", ".join(py_literal(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(py_literal(v) for v in sorted(value)) + "}" if value else "set()"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{py_literal(k)}: {py_literal(v)}" for k, v in value.items()) + "}"
    raise ScaffoldError(f"refusing to render a value of type {type(value).__name__} into generated code.")


def toml_string(value: Any) -> str:
    text = str(value)
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def config_defaults(config: dict) -> list[tuple[str, Any]]:
    """config.json keys to declare as arguments of a generated config class."""
    out = []
    for key, value in config.items():
        if key in CONFIG_KEYS_NOT_REDECLARED or key.startswith("_"):
            continue
        if not IDENTIFIER.match(key) or keyword.iskeyword(key) or key in ("self", "kwargs"):
            raise ScaffoldError(f"config.json key {key!r} is not a Python identifier; it cannot become a config "
                                "argument.", "config.json")
        py_literal(value)  # refuse what cannot be a literal
        out.append((key, value))
    return out


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["py"] = py_literal
    env.filters["toml"] = toml_string
    return env


@dataclass
class Rendered:
    files: dict[str, str]  # relative path -> text


def render(spec: Spec, ckpt: Checkpoint, *, trust_remote_code: bool = False, review: str = "") -> Rendered:
    env = environment()

    def cfg(field: str) -> str:
        source = spec.source(field)
        return source.expr if source.expr and source.kind != "override" else py_literal(getattr(spec, field))

    context = {
        "spec": spec,
        "cfg": cfg,
        "version": __version__,
        "stacked": stacked_modules(spec),
        "checkpoint_path": str(ckpt.path),
        "checkpoint_name": ckpt.path.name,
        "config_defaults": config_defaults(ckpt.config) if spec.register_config else [],
        "trust_remote_code": trust_remote_code,
    }
    files: dict[str, str] = {}
    root = templates_dir() / "package"
    for template in sorted(root.rglob("*.j2")):
        rel = template.relative_to(root).as_posix()
        if rel.endswith("configuration.py.j2") and not spec.register_config:
            continue
        out_rel = rel[: -len(".j2")].replace(PACKAGE_PLACEHOLDER, spec.package)
        files[out_rel] = env.get_template(f"package/{rel}").render(**context)
    files["scaffold_spec.toml"] = to_toml(spec) + port_table(ckpt, trust_remote_code)
    if review:
        files["REVIEW.md"] = review
    return Rendered(files)


def port_table(ckpt: Checkpoint, trust_remote_code: bool) -> str:
    return (
        "\n# Where this port came from; scaffold verify reads it.\n[port]\n"
        f"checkpoint = {toml_string(ckpt.path)}\n"
        f"scaffold_version = {toml_string(__version__)}\n"
        f"trust_remote_code = {'true' if trust_remote_code else 'false'}\n"
    )


# --------------------------------------------------------- format and check
def format_and_check(folder: Path) -> None:
    """ruff-format the generated Python, then require that it parses and lints clean."""
    py_files = sorted(str(p) for p in folder.rglob("*.py"))
    if not py_files:
        return
    ruff = [sys.executable, "-m", "ruff"]
    subprocess.run([*ruff, "check", "--quiet", "--no-cache", "--isolated", "--select", "I", "--fix", *py_files],
                   capture_output=True, text=True)
    fmt = subprocess.run([*ruff, "format", "--quiet", "--no-cache", "--isolated", *py_files], capture_output=True, text=True)
    if fmt.returncode != 0:
        raise ScaffoldError(f"ruff could not format the generated code: {fmt.stderr.strip() or fmt.stdout.strip()}")
    for path in py_files:
        try:
            ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
        except SyntaxError as exc:  # a generator bug, never the user's fault
            raise ScaffoldError(f"generated file {path} does not parse ({exc}); please report this.") from None
    lint = subprocess.run(
        [*ruff, "check", "--quiet", "--no-cache", "--isolated", *py_files],
        capture_output=True, text=True,
    )
    if lint.returncode != 0:
        raise ScaffoldError(f"generated code fails ruff check; please report this:\n{lint.stdout.strip()}")


def write_package(rendered: Rendered, out: Path, *, force: bool) -> Path:
    """Write atomically: build beside `out`, check, then swap into place."""
    out = Path(out).absolute()
    if out.exists() and not force:
        raise OutputError("the output folder already exists; pass --force to replace it.", out)
    if out.exists() and not out.is_dir():
        raise OutputError("the output path exists and is not a folder.", out)
    parent = out.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=parent))
    except OSError as exc:
        raise OutputError(f"cannot create the output folder ({exc.strerror}).", out) from None
    try:
        for rel, text in rendered.files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        format_and_check(staging)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=parent))
            os.rename(out, old / "previous")
            os.rename(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out
