"""A generated port on disk: its spec, its checkpoint, and a private install of it."""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import tomllib

from scaffold.errors import ScaffoldError
from scaffold.proc import run_python
from scaffold.spec import FIELDS, Source, Spec, field_problem, field_value, validate_identifiers, validate_names

SPEC_FILE = "scaffold_spec.toml"


@dataclass
class Port:
    path: Path
    spec: Spec
    checkpoint: Path
    trust_remote_code: bool

    @property
    def model_file(self) -> Path:
        return self.path / self.spec.package / "model.py"


def load_port(path: str | Path, checkpoint: str | Path | None = None) -> Port:
    path = Path(path).resolve()
    spec_file = path / SPEC_FILE
    if not spec_file.exists():
        raise ScaffoldError(f"not a generated port: {SPEC_FILE} is missing.", path)
    try:
        data = tomllib.loads(spec_file.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ScaffoldError(f"{SPEC_FILE} is not valid TOML ({exc}).", spec_file) from None
    values = data.get("spec")
    if not isinstance(values, dict):
        raise ScaffoldError(f"{SPEC_FILE} has no [spec] table; regenerate the port with scaffold new.", spec_file)
    spec = Spec()
    for name, value in values.items():
        if name not in FIELDS:  # a field an older or newer scaffold wrote: not read
            continue
        problem = field_problem(name, value)
        if problem:
            raise ScaffoldError(f"the port's spec is not one scaffold could have written: {problem}. Correct "
                                "it, or regenerate the port with scaffold new (--spec FILE to override fields).",
                                spec_file)
        setattr(spec, name, field_value(name, value))
        spec.provenance[name] = Source("port", SPEC_FILE)
    validate_identifiers(spec, str(spec_file))
    validate_names(spec, str(spec_file))
    meta = data.get("port", {})
    ckpt = Path(checkpoint or meta.get("checkpoint", ""))
    if not (ckpt / "config.json").exists():
        raise ScaffoldError(
            f"the checkpoint {ckpt} is not there; pass --checkpoint to say where it is.", spec_file
        )
    return Port(path, spec, ckpt.resolve(), bool(meta.get("trust_remote_code", False)))


def stage_install(port: Port, under: Path | None = None) -> Path:
    """pip-install the port into a private folder; the caller puts it on PYTHONPATH.

    vLLM then finds the port through its entry point, exactly as after `pip install`,
    and the code verified is the code in the port folder, not an older install.
    The folder is made in `under` (a work folder the caller removes), else in the temp
    directory, where the caller removes the returned path's parent.
    """
    stage = Path(tempfile.mkdtemp(prefix="scaffold-stage-", dir=under))
    source = stage / "src"
    shutil.copytree(port.path, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    result = run_python(
        "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
        "--no-compile", "--disable-pip-version-check", "--target", stage / "site", source,
        capture_output=True, text=True,
    )
    if result.returncode != 0:
        raise ScaffoldError(f"the port does not install: {result.stderr.strip()[-2000:]}", port.path)
    return stage / "site"
