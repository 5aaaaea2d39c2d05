"""The architecture spec: the typed description between reading and rendering.

Detection (scaffold.detect) fills a Spec and records where every value came from;
templates only read it; a user may override any field from a TOML file. The spec
actually used is written into every generated package as `scaffold_spec.toml`, so
the port can be regenerated with `scaffold new CKPT --spec scaffold_spec.toml`.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from scaffold.errors import SpecError

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Source:
    """Where one spec value came from.

    kind is one of: config (a config.json key), tensor (a tensor's presence or
    shape), code (a default in the checkpoint's modeling source), derived
    (computed from other fields), default (the architecture convention assumed
    when nothing says otherwise), override (the user's spec file).
    `expr` is the Python expression over `config` that the generated model uses
    to read the value at run time; None means the value is written as a literal.
    """

    kind: str
    detail: str
    expr: str | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


# Choices of the enumerated fields, checked on overrides.
CHOICES = {
    "qkv_layout": ("separate", "fused", "interleaved"),
    "qk_norm": ("none", "per_head", "full"),
    "mlp_kind": ("gated", "plain"),
    "norm_kind": ("rms", "layer"),
    "block": ("pre_norm", "post_norm", "sandwich", "parallel"),
}


@dataclass
class Spec:
    # Identity.
    architecture: str = ""
    model_type: str = ""
    class_prefix: str = ""
    package: str = ""
    register_config: bool = False
    config_class: str = ""

    # Sizes.
    hidden_size: int = 0
    num_layers: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    vocab_size: int = 0
    max_position: int = 2048

    # Attention.
    qkv_layout: str = "separate"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"
    sliding_window: int | None = None
    sliding_window_layers: list[int] = field(default_factory=list)

    # Rotary embedding.
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    partial_rotary_factor: float = 1.0
    rope_neox_style: bool = True

    # MLP.
    mlp_kind: str = "gated"
    hidden_act: str = "silu"
    mlp_bias: bool = False
    gate_extra_bias: str | None = None

    # Norms and block.
    block: str = "pre_norm"
    norm_kind: str = "rms"
    norm_eps: float = 1e-6
    norm_offset: float = 0.0

    # Embeddings and head.
    tie_word_embeddings: bool = False
    lm_head_bias: bool = False

    # Checkpoint facts the port does not compute with, kept for the checks.
    dtype: str = "float32"
    tokenizer_vocab_size: int | None = None

    provenance: dict[str, Source] = field(default_factory=dict, repr=False, compare=False)

    # ----------------------------------------------------------------- access
    def set(self, name: str, value: Any, source: Source) -> None:
        if name not in FIELDS:
            raise KeyError(name)
        setattr(self, name, value)
        self.provenance[name] = source

    def source(self, name: str) -> Source:
        return self.provenance.get(name, Source("default", "architecture convention"))

    def to_dict(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in FIELDS}

    @property
    def layers_with_window(self) -> set[int]:
        return set(self.sliding_window_layers) if self.sliding_window else set()

    # -------------------------------------------------------------- overrides
    def apply_overrides(self, values: dict[str, Any], origin: str) -> None:
        hints = get_type_hints(Spec)
        for name, value in values.items():
            if name not in FIELDS:
                raise SpecError(f"unknown spec field {name!r}; known fields: {', '.join(FIELDS)}.", origin)
            expected = hints[name]
            if not _fits(value, expected):
                raise SpecError(f"field {name!r} must be {expected}, not {value!r}.", origin)
            if name in CHOICES and value not in CHOICES[name]:
                raise SpecError(f"field {name!r} must be one of {CHOICES[name]}, not {value!r}.", origin)
            if isinstance(getattr(self, name), float) and isinstance(value, int):
                value = float(value)
            if value == getattr(self, name):
                continue  # the detected value, with its detected source
            self.set(name, value, Source("override", origin))
        validate_identifiers(self, origin)


FIELDS = [f.name for f in dataclasses.fields(Spec) if f.name != "provenance"]


def _fits(value: Any, expected: Any) -> bool:
    text = str(expected)
    if value is None:
        return "None" in text
    if isinstance(value, bool):
        return "bool" in text
    if isinstance(value, int):
        return "int" in text or "float" in text
    if isinstance(value, float):
        return "float" in text
    if isinstance(value, str):
        return "str" in text
    if isinstance(value, list):
        return "list" in text
    if isinstance(value, dict):
        return "dict" in text
    return False


def validate_identifiers(spec: Spec, origin: str) -> None:
    """Names that become Python identifiers in generated code must be identifiers."""
    for name in ("class_prefix", "package", "config_class", "gate_extra_bias"):
        value = getattr(spec, name)
        if value is None or value == "" and name == "config_class":
            continue
        if not isinstance(value, str) or not IDENTIFIER.match(value) or keyword.iskeyword(value):
            raise SpecError(f"spec field {name!r} = {value!r} is not a valid Python identifier.", origin)
    if not IDENTIFIER.match(spec.architecture or ""):
        raise SpecError(f"architecture {spec.architecture!r} is not a valid Python class name.", origin)


def load_overrides(path: str | Path) -> dict[str, Any]:
    """Read a spec TOML file: top-level keys, or the keys of its [spec] table."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError("the spec file does not exist.", path) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"the spec file is not valid TOML ({exc}).", path) from None
    values = data.get("spec", data)
    if not isinstance(values, dict):
        raise SpecError("the [spec] table must be a table of field = value.", path)
    return values


# ------------------------------------------------------------------ TOML out
def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.encode("unicode_escape").decode("ascii").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(value)


def _toml_key(key: str) -> str:
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else _toml_value(key)


def to_toml(spec: Spec) -> str:
    """The spec as TOML, each value with a comment saying where it came from."""
    lines = [
        "# The architecture spec this port was generated from.",
        "# Regenerate with: scaffold new CHECKPOINT --spec scaffold_spec.toml --force",
        "# A field left out (None) keeps its detected value.",
        "[spec]",
    ]
    for name in FIELDS:
        value = getattr(spec, name)
        lines.append(f"# {spec.source(name)}")
        if value is None:
            lines.append(f"# {name} = (none)")
        else:
            lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
