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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

import tomllib

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
    "gate_up_layout": ("separate", "fused"),
    "qk_norm": ("none", "per_head", "full"),
    "mlp_kind": ("gated", "plain"),
    "norm_kind": ("rms", "layer"),
    "block": ("pre_norm", "post_norm", "sandwich", "parallel"),
}


# The roles a checkpoint module can play, with Llama's names. Top level: the base
# model's prefix, its embedding, layer list and final norm, and the head. Inside a
# decoder layer: the attention and MLP containers, their projections (relative to
# the container), and the norms around each sublayer. The norm roles are
# attn_norm / mlp_norm (before a sublayer) and attn_post_norm / mlp_post_norm
# (after it, before the residual add); a role a checkpoint lacks is left out.
DEFAULT_NAMES = {
    "model": "model",
    "embed_tokens": "embed_tokens",
    "layers": "layers",
    "norm": "norm",
    "lm_head": "lm_head",
    "self_attn": "self_attn",
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "qkv_proj": "qkv_proj",
    "o_proj": "o_proj",
    "q_norm": "q_norm",
    "k_norm": "k_norm",
    "mlp": "mlp",
    "gate_proj": "gate_proj",
    "up_proj": "up_proj",
    "gate_up_proj": "gate_up_proj",
    "down_proj": "down_proj",
    "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
}
# A mixture-of-experts layer keeps its block under the `mlp` role, with the roles
# router (the gating linear), experts (the list of experts), expert_gate_proj /
# expert_up_proj / expert_down_proj (the projections inside one expert) and, where
# the architecture has one, shared_expert and shared_expert_gate.
NAME_ROLES = (
    "model", "embed_tokens", "layers", "norm", "lm_head", "self_attn", "q_proj", "k_proj", "v_proj", "qkv_proj",
    "o_proj", "q_norm", "k_norm", "mlp", "gate_proj", "up_proj", "gate_up_proj", "down_proj", "attn_norm",
    "attn_post_norm", "mlp_norm", "mlp_post_norm", "router", "experts", "expert_gate_proj", "expert_up_proj",
    "expert_down_proj", "shared_expert", "shared_expert_gate",
)
MOE_ROLES = ("router", "experts", "expert_gate_proj", "expert_up_proj", "expert_down_proj")
MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


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

    # Checkpoint module names, by role (see NAME_ROLES). The port names its modules
    # the same way, so most tensors load under their own name.
    names: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_NAMES))

    # Attention.
    qkv_layout: str = "separate"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: str = "none"
    sliding_window: int | None = None
    sliding_window_layers: list[int] = field(default_factory=list)
    attention_scale: float | None = None  # None: head_dim ** -0.5
    attn_logit_softcap: float | None = None

    # Rotary embedding.
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    # Rotary parameters of the sliding-window layers where they differ (Gemma 3's local
    # base); empty when every layer uses rope_parameters.
    sliding_rope_parameters: dict[str, Any] = field(default_factory=dict)
    partial_rotary_factor: float = 1.0
    rope_neox_style: bool = True
    no_rope_layers: list[int] = field(default_factory=list)  # layers without rotary embedding

    # MLP.
    mlp_kind: str = "gated"
    gate_up_layout: str = "separate"
    hidden_act: str = "silu"
    mlp_bias: bool = False
    gate_extra_bias: str | None = None

    # Mixture of experts. num_experts 0 means a dense MLP in every layer; otherwise
    # every layer not in dense_layers routes each token to num_experts_per_tok of
    # num_experts gated experts (vLLM's FusedMoE), plus a shared expert scaled by a
    # sigmoid gate when shared_expert_intermediate_size is not 0.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_renormalize: bool = True  # the top-k routing weights are rescaled to sum to 1
    shared_expert_intermediate_size: int = 0
    dense_layers: list[int] = field(default_factory=list)

    # Norms and block.
    block: str = "pre_norm"
    norm_kind: str = "rms"
    norm_eps: float = 1e-6
    norm_offset: float = 0.0
    norm_bias: bool = False
    residual_multiplier: float | None = None

    # Embeddings and head.
    tie_word_embeddings: bool = False
    lm_head_bias: bool = False
    embedding_multiplier: float | None = None
    logits_scale: float | None = None
    final_logit_softcap: float | None = None

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
    def is_moe(self) -> bool:
        return "experts" in self.names

    @property
    def has_dense_mlp(self) -> bool:
        """Whether some layer has a dense MLP: every model but one whose every layer routes to experts."""
        return not self.is_moe or bool(self.dense_layers)

    @property
    def sparse_layers(self) -> list[int]:
        """Layers whose MLP is a mixture of experts."""
        if not self.is_moe:
            return []
        return [i for i in range(self.num_layers) if i not in set(self.dense_layers)]

    @property
    def layers_with_window(self) -> set[int]:
        return set(self.sliding_window_layers) if self.sliding_window else set()

    # -------------------------------------------------------------- overrides
    def apply_overrides(self, values: dict[str, Any], origin: str) -> None:
        for name, value in values.items():
            if name not in FIELDS:
                raise SpecError(f"unknown spec field {name!r}; known fields: {', '.join(FIELDS)}.", origin)
            problem = field_problem(name, value)
            if problem:
                raise SpecError(problem + ".", origin)
            value = field_value(self, name, value)
            if value == getattr(self, name):
                continue  # the detected value, with its detected source
            self.set(name, value, Source("override", origin))
        validate_identifiers(self, origin)
        validate_names(self, origin)


FIELDS = [f.name for f in dataclasses.fields(Spec) if f.name != "provenance"]


def field_problem(name: str, value: Any) -> str | None:
    """Why `value` cannot be the spec field `name` (of its type, one of its choices), or None."""
    expected = get_type_hints(Spec)[name]
    if not _fits(value, expected):
        return f"field {name!r} must be {getattr(expected, '__name__', expected)}, not {value!r}"
    if name in CHOICES and value not in CHOICES[name]:
        return f"field {name!r} must be one of {CHOICES[name]}, not {value!r}"
    return None


def field_value(spec: Spec, name: str, value: Any) -> Any:
    """`value` as the field holds it: TOML writes 1e6 as a float but 1000000 as an int."""
    return float(value) if isinstance(getattr(spec, name), float) and isinstance(value, int) else value


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
    """Names that become Python identifiers in generated code must be identifiers.

    model_type is not an identifier but is written into docstrings and comments, so
    it must be a plain name too (letters, digits, _ and -).
    """
    for name in ("class_prefix", "package", "config_class", "gate_extra_bias"):
        value = getattr(spec, name)
        if value is None or value == "" and name == "config_class":
            continue
        if not isinstance(value, str) or not IDENTIFIER.match(value) or keyword.iskeyword(value):
            raise SpecError(f"spec field {name!r} = {value!r} is not a valid Python identifier.", origin)
    arch = spec.architecture
    if not isinstance(arch, str) or not IDENTIFIER.match(arch) or keyword.iskeyword(arch):
        raise SpecError(f"architecture {arch!r} is not a valid Python class name.", origin)
    if not isinstance(spec.model_type, str) or not re.match(r"^[A-Za-z0-9_\-]{1,100}$", spec.model_type):
        raise SpecError(f"spec field 'model_type' = {spec.model_type!r} is not a simple name "
                        "(letters, digits, _ and -).", origin)


def validate_names(spec: Spec, origin: str) -> None:
    """Module names become attribute names in generated code: known roles, plain identifiers."""
    names = spec.names
    if not isinstance(names, dict):
        raise SpecError("spec field 'names' must be a table of role = module name.", origin)
    for role, value in names.items():
        if role not in NAME_ROLES:
            raise SpecError(f"spec field 'names' has unknown role {role!r}; known roles: {', '.join(NAME_ROLES)}.",
                            origin)
        if not isinstance(value, str) or not IDENTIFIER.match(value) or keyword.iskeyword(value):
            raise SpecError(f"spec field names.{role} = {value!r} is not a valid Python identifier.", origin)
    for role in ("model", "embed_tokens", "layers", "norm", "lm_head", "self_attn", "o_proj", "qkv_proj", "mlp",
                 "down_proj", "up_proj"):
        if role not in names and not (role == "up_proj" and "gate_up_proj" in names):
            raise SpecError(f"spec field 'names' needs a module name for role {role!r}.", origin)
    if spec.is_moe and spec.num_experts <= 0:
        raise SpecError("the spec names an experts module but num_experts is not positive.", origin)
    if spec.num_experts:
        for role in MOE_ROLES + (("shared_expert", "shared_expert_gate") if spec.shared_expert_intermediate_size
                                 else ()):
            if role not in names:
                raise SpecError(f"spec field 'names' needs a module name for role {role!r} (the model has "
                                f"{spec.num_experts} experts).", origin)


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
_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def toml_string(value: Any) -> str:
    """A TOML basic string holding `value` exactly, whatever characters it has."""
    out = []
    for char in str(value):
        if char in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F or not char.isprintable():
            if 0xD800 <= ord(char) <= 0xDFFF:
                raise SpecError(f"the string {value!r} holds an unpaired surrogate and cannot be written as TOML.")
            out.append(f"\\u{ord(char):04X}" if ord(char) <= 0xFFFF else f"\\U{ord(char):08X}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_comment(text: Any) -> str:
    """One comment line: line breaks and control characters escaped, so nothing after # becomes TOML."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # nan, inf and -inf are TOML floats too
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, (list, tuple)):
        if any(v is None for v in value):
            raise SpecError(f"the list {value!r} holds null, which TOML cannot write.")
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        # TOML has no null: an entry set to None is left out, as a field set to None is.
        items = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items() if v is not None]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    raise SpecError(f"a value of type {type(value).__name__} cannot be written as TOML.")


def _toml_key(key: Any) -> str:
    key = str(key)
    return key if re.match(r"^[A-Za-z0-9_-]+$", key) else toml_string(key)


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
        lines.append(f"# {toml_comment(spec.source(name))}")
        if value is None:
            lines.append(f"# {name} = (none)")
        else:
            lines.append(f"{name} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
