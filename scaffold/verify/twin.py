"""`scaffold verify --twin`: a shrunk random checkpoint with the real checkpoint's spec.

A checkpoint too large for the machine can still be verified. Its config.json is
shrunk by a table of size keys (layers, widths, heads, experts, vocabulary, context),
with no per-model branches; every other key (rope parameters, norm epsilons, biases,
ties, activation, soft-caps, multipliers, `architectures`, `auto_map`) is kept as it
is, so the port's plugin serves the twin exactly as it would serve the real thing.
Random weights are then made with transformers from that config, the way
`scaffold.tiny` makes its checkpoints (deterministic seed, norm weights 1 + noise,
non-zero biases), and saved as safetensors beside the shrunk config.json.

Layers: the twin keeps the first L layers of the real model, where L is the smallest
prefix that holds every distinct per-layer pattern the config describes (`layer_types`,
`no_rope_layers`, `mlp_only_layers`, periods like `decoder_sparse_step`, thresholds
like `first_k_dense_replace`), and at least MIN_LAYERS. A prefix, because a port
writes per-layer facts (sliding-window layers, layers without rotary) as literal
layer indices: layer i of the twin must be what layer i of the real model is.

Nothing here reads the real checkpoint's tensor data: only its config.json, and its
Python sources and tokenizer files when the twin needs them.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaffold.checkpoint import INTEGER_DTYPES, Checkpoint
from scaffold.detect.forms import read_checkpoint  # reads a hash routing's integer table, as verify does
from scaffold.detect.identity import transformers_model_types
from scaffold.errors import ScaffoldError
from scaffold.mapping import natural, weight_table
from scaffold.spec import FIELDS
from scaffold.tiny import randomize

FORMAT = 2  # bump when the twin a config gives changes (it keys the cache)
SEED = 0
STD = 0.08
MIN_LAYERS = 3
HIDDEN = 128
HEAD_DIMS = (32, 64, 128)  # the CPU attention backend rejects head_dim 16
MAX_HEADS = 8  # query heads, when the GQA ratio allows
MAX_HEADS_HIGH_RATIO = 16  # when one KV head serves more than MAX_HEADS query heads
INTERMEDIATE = 256
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
MOE_INTERMEDIATE = 64
VOCAB = 512
MAX_POSITION = 4096
SLIDING_WINDOW = 8  # shorter than verify's prompts, so the window matters
INFO_FILE = "scaffold_twin.json"

# Size keys, by role; the first present (non-null) key of a role is the one shrunk.
KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "rotary_dim": ("rotary_dim",),
    "intermediate": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok",),
    "moe_intermediate": ("moe_intermediate_size",),
    "shared_intermediate": ("shared_expert_intermediate_size",),
    "vocab": ("vocab_size",),
    "max_position": ("max_position_embeddings", "n_positions"),
    "sliding_window": ("sliding_window",),
}
# Per-layer lists (one entry per layer), lists of layer indices, periods and thresholds.
PER_LAYER_KEYS = ("layer_types", "no_rope_layers")
LAYER_INDEX_KEYS = ("mlp_only_layers",)
PERIOD_KEYS = ("decoder_sparse_step", "interleave_moe_layer_step", "moe_layer_freq", "sliding_window_pattern",
               "full_attention_interval", "global_attn_every_n_layers", "no_rope_layer_interval")
THRESHOLD_KEYS = ("first_k_dense_replace", "max_window_layers")
ROPE_TYPES_WITHOUT_MAX_POSITION = ("default", "linear", "llama3")


@dataclass
class TwinPlan:
    """The shrunk config and what changed, key by key: {key: [real, twin]}."""

    config: dict
    changes: dict[str, list] = field(default_factory=dict)
    layers: int = 0
    real_layers: int = 0
    why_layers: str = ""
    keep_tokenizer: bool = False

    def summary(self, built_from: str | Path) -> str:
        c = self.changes

        def size(role: str, label: str) -> str | None:
            key = _key(self.config, role)
            if key is None:
                return None
            now = self.config[key]
            return f"{label} {now}" + (f" (real {c[key][0]})" if key in c else "")

        heads, kv = _key(self.config, "heads"), _key(self.config, "kv_heads")
        parts = [f"{self.layers} of {self.real_layers} layers ({self.why_layers})", size("hidden", "hidden")]
        if heads:
            real = f"{c[heads][0] if heads in c else self.config[heads]}"
            now = f"{self.config[heads]}"
            if kv:
                real += f":{c[kv][0] if kv in c else self.config[kv]}"
                now += f":{self.config[kv]}"
            parts.append(f"heads {now}" + (f" (real {real})" if real != now else ""))
        parts += [size("head_dim", "head_dim"), size("intermediate", "intermediate"),
                  size("experts", "experts"), size("experts_per_token", "experts per token"),
                  size("moe_intermediate", "expert intermediate"), size("vocab", "vocab"),
                  size("max_position", "max positions"), size("sliding_window", "sliding window")]
        return ", ".join(p for p in parts if p) + f"; built from {Path(built_from)}"


def _key(config: dict, role: str) -> str | None:
    return next((k for k in KEYS[role] if config.get(k) is not None), None)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(config: dict, role: str) -> tuple[str | None, int | None]:
    key = _key(config, role)
    if key is None or not _int(config[key]) or config[key] <= 0:
        return None, None
    return key, config[key]


def _rope_type(config: dict) -> str:
    for name in ("rope_parameters", "rope_scaling"):
        params = config.get(name)
        if isinstance(params, dict):
            return str(params.get("rope_type", params.get("type", "default")))
    return "default"


def _rotary_fraction(config: dict) -> float:
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else {}
    for value in (config.get("partial_rotary_factor"), config.get("rotary_pct"), params.get("partial_rotary_factor")):
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1:
            return float(value)
    return 1.0


def _layer_count(config: dict, n: int) -> tuple[int, str, dict, dict]:
    """The twin's layer count: the shortest prefix holding every distinct per-layer pattern."""
    per_layer = {k: v for k, v in config.items()
                 if isinstance(v, list) and len(v) == n and (k in PER_LAYER_KEYS or "layer" in k.lower())
                 and k not in LAYER_INDEX_KEYS}
    index_lists = {k: set(v) for k, v in config.items()
                   if k not in per_layer and (k in LAYER_INDEX_KEYS or k.endswith("_layers")) and isinstance(v, list)
                   and all(_int(i) and 0 <= i < n for i in v)}
    periods = {k: config[k] for k in PERIOD_KEYS if _int(config.get(k)) and config[k] > 0}
    thresholds = {k: config[k] for k in THRESHOLD_KEYS if _int(config.get(k)) and config[k] >= 0}

    def pattern(i: int) -> tuple:
        return (tuple(json.dumps(v[i], sort_keys=True) for v in per_layer.values()),
                tuple(i in v for v in index_lists.values()), tuple(i % p for p in periods.values()),
                tuple(i < t for t in thresholds.values()))

    first: dict[tuple, int] = {}
    for i in range(n):
        first.setdefault(pattern(i), i)
    needed = max(first.values(), default=0) + 1
    layers = min(n, max(MIN_LAYERS, needed))
    keys = [*per_layer, *index_lists, *periods, *thresholds]
    why = (f"{len(first)} distinct layer pattern(s) of {', '.join(keys)}" if keys and len(first) > 1
           else "every layer alike")
    return layers, why, per_layer, index_lists


def _heads(heads: int, kv: int | None) -> tuple[int, int | None]:
    """Query and KV heads of the twin, keeping the GQA ratio where possible."""
    if kv is None or kv <= 0 or heads % kv:
        return min(heads, 4), None
    ratio = heads // kv
    if ratio > MAX_HEADS:
        return min(ratio, MAX_HEADS_HIGH_RATIO), 1
    kv_twin = next(k for k in (4, 2, 1) if k <= kv and ratio * k <= MAX_HEADS)
    return ratio * kv_twin, kv_twin


def _head_dim(real: int, fraction: float) -> int:
    """The smallest head size the CPU backend takes whose rotary part stays an even integer."""
    if real < HEAD_DIMS[0]:
        return real
    for size in HEAD_DIMS:
        if size > real:
            break
        rotary = size * fraction
        if rotary == int(rotary) and int(rotary) % 2 == 0:
            return size
    return real


def _head_counts(key: str, values: list) -> bool:
    """A per-layer list of query head counts: a key naming heads, not their size or their KV share."""
    words = set(re.split(r"[^a-z]+", key.lower()))
    return (bool(words & {"head", "heads"}) and not words & {"dim", "size", "key", "value", "kv"}
            and all(_int(v) and v > 0 for v in values))


def _layer_heads(key: str, value: int, heads: int, kv: int | None, heads_twin: int, kv_twin: int | None) -> int:
    """One layer's query heads in the twin: its GQA ratio kept over the twin's KV heads, or scaled with the
    model's query heads where every head has its own KV head."""
    if kv and kv_twin and value % kv == 0:
        return value // kv * kv_twin
    if not kv_twin and (value * heads_twin) % heads == 0:
        return value * heads_twin // heads
    raise ScaffoldError(f"--twin cannot shrink {key}: a layer's {value} query heads are not a whole number of "
                        f"groups over the model's {kv or heads} KV heads.")


def plan_twin(config: dict) -> TwinPlan:
    """Shrink a config.json (a dict) by the size table; keep every other key as it is."""
    cfg = json.loads(json.dumps(config))
    changes: dict[str, list] = {}

    def put(key: str | None, value: Any) -> None:
        if key is not None and cfg.get(key) != value:
            changes.setdefault(key, [cfg.get(key), value])[1] = value  # [real, twin], however many steps
            cfg[key] = value

    layers_key, n = _positive(cfg, "layers")
    if layers_key is None:
        raise ScaffoldError(f"config.json has no positive layer count ({' / '.join(KEYS['layers'])}).")
    layers, why, per_layer, index_lists = _layer_count(cfg, n)
    put(layers_key, layers)
    for key in per_layer:
        put(key, cfg[key][:layers])
    for key in index_lists:
        put(key, [i for i in cfg[key] if i < layers])

    hidden_key, hidden = _positive(cfg, "hidden")
    heads_key, heads = _positive(cfg, "heads")
    kv_key, kv = _positive(cfg, "kv_heads")
    hd_key, head_dim = _positive(cfg, "head_dim")
    if hidden_key and heads_key:
        real_head_dim = head_dim or hidden // heads
        heads_twin, kv_twin = _heads(heads, kv if kv_key else heads)
        rotary_key, rotary = _positive(cfg, "rotary_dim")
        fraction = rotary / real_head_dim if rotary else _rotary_fraction(cfg)
        head_dim_twin = _head_dim(real_head_dim, fraction)
        if hd_key is None or hidden == heads * head_dim:  # the hidden size is the query width
            hidden_twin = heads_twin * head_dim_twin
        else:  # the query width differs from the hidden size (Qwen3, Gemma): keep it different
            hidden_twin = HIDDEN if HIDDEN != heads_twin * head_dim_twin else HIDDEN + 32
        put(hidden_key, hidden_twin)
        put(heads_key, heads_twin)
        if kv_key and kv_twin is not None:
            put(kv_key, kv_twin)
        if hd_key:
            put(hd_key, head_dim_twin)
        if rotary_key:
            put(rotary_key, int(head_dim_twin * fraction))
        for key in per_layer:  # per-layer query head counts (Laguna's num_attention_heads_per_layer)
            if _head_counts(key, cfg[key]):
                put(key, [_layer_heads(key, v, heads, kv if kv_key else None, heads_twin, kv_twin)
                          for v in cfg[key]])
    key, _ = _positive(cfg, "intermediate")
    put(key, INTERMEDIATE)

    key, experts = _positive(cfg, "experts")
    if key:
        put(key, min(experts, EXPERTS))
        k_key, k = _positive(cfg, "experts_per_token")
        put(k_key, min(k or 1, EXPERTS_PER_TOKEN, cfg[key]))
    key, _ = _positive(cfg, "moe_intermediate")
    put(key, MOE_INTERMEDIATE)
    key, _ = _positive(cfg, "shared_intermediate")
    put(key, MOE_INTERMEDIATE)

    key, vocab = _positive(cfg, "vocab")
    keep_tokenizer = True
    if key and vocab > VOCAB:
        put(key, VOCAB)
        keep_tokenizer = False
        for name, value in list(cfg.items()):  # special token ids stay inside the vocabulary
            if name.endswith("_token_id") and _int(value) and value >= VOCAB:
                put(name, value % VOCAB)
            elif name.endswith("_token_id") and isinstance(value, list) and all(_int(v) for v in value):
                put(name, [v % VOCAB if v >= VOCAB else v for v in value])
    key, max_position = _positive(cfg, "max_position")
    if key and max_position > MAX_POSITION and _rope_type(cfg) in ROPE_TYPES_WITHOUT_MAX_POSITION:
        put(key, MAX_POSITION)  # rope types that scale by it (yarn, dynamic, longrope) keep it
    key, window = _positive(cfg, "sliding_window")
    if key and window > SLIDING_WINDOW:
        put(key, SLIDING_WINDOW)
    return TwinPlan(cfg, changes, layers, n, why, keep_tokenizer)


def needs_code(ckpt: Checkpoint) -> bool:
    """transformers can only build the twin's model from the checkpoint's own code."""
    return str(ckpt.config.get("model_type", "")) not in transformers_model_types()


def check_buildable(ckpt: Checkpoint, trust_remote_code: bool) -> None:
    """Refuse, before any work, a twin that cannot or may not be built."""
    if not needs_code(ckpt):
        return
    model_type = ckpt.config.get("model_type")
    if not ckpt.sources or not isinstance(ckpt.config.get("auto_map"), dict):
        raise ScaffoldError(f"--twin builds the twin with transformers, which does not know model_type "
                            f"{model_type!r}, and config.json has no auto_map to the checkpoint's own code.",
                            ckpt.config_file)
    if not trust_remote_code:
        files = ", ".join(sorted(ckpt.sources))
        raise ScaffoldError(f"--twin builds the twin from the checkpoint's own code ({files}), because transformers "
                            f"does not know model_type {model_type!r}; pass --trust-remote-code to allow running it.",
                            ckpt.config_file)


def _cache_key(ckpt: Checkpoint) -> str:
    digest = hashlib.sha256(json.dumps([FORMAT, SEED, STD, ckpt.config, sorted(ckpt.sources.items())],
                                       sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def twin_dir(ckpt: Checkpoint) -> tuple[Path, bool]:
    """Where the twin of `ckpt` goes, and whether it is kept (SCAFFOLD_CACHE set) or temporary."""
    root = os.environ.get("SCAFFOLD_CACHE")
    if root:
        return Path(root) / f"twin-{_cache_key(ckpt)}", True
    return Path(tempfile.mkdtemp(prefix="scaffold-twin-")) / "twin", False


def build_twin(ckpt_path: str | Path | Checkpoint, out_dir: str | Path, *, trust_remote_code: bool = False,
               seed: int = SEED) -> Path:
    """Write the twin of the checkpoint at `ckpt_path` to `out_dir` and return its path.

    Reads config.json (plus the checkpoint's Python sources and, when the vocabulary is
    kept, its tokenizer files); never its tensors. An `out_dir` holding a complete twin of
    the same config is reused.
    """
    ckpt = ckpt_path if isinstance(ckpt_path, Checkpoint) else read_checkpoint(ckpt_path)
    check_buildable(ckpt, trust_remote_code)
    out = Path(out_dir)
    if _complete(out, ckpt):
        return out
    plan = plan_twin(ckpt.config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for name, text in ckpt.sources.items():  # the checkpoint's own code, for auto_map
            target = tmp / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
        if plan.keep_tokenizer:
            for name in ckpt.tokenizer.files:
                source = ckpt.path / name
                if source.is_file() and source.stat().st_size <= 64 * 2**20:
                    shutil.copyfile(source, tmp / Path(name).name)
        (tmp / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n", encoding="utf-8")
        _random_weights(tmp, trust_remote_code and needs_code(ckpt), seed, _integer_tables(ckpt, plan.config))
        (tmp / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n", encoding="utf-8")
        info = {"key": _cache_key(ckpt), "built_from": str(ckpt.config_file), "changes": plan.changes,
                "layers": plan.layers, "summary": plan.summary(ckpt.config_file)}
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            if not _complete(out, ckpt):  # else another verify built the same twin meanwhile
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _complete(out: Path, ckpt: Checkpoint) -> bool:
    """`out` holds a finished twin of this checkpoint's config (its info file is written last)."""
    try:
        return json.loads((out / INFO_FILE).read_text()).get("key") == _cache_key(ckpt)
    except (OSError, ValueError):
        return False


def _integer_tables(ckpt: Checkpoint, config: dict) -> dict[str, int]:
    """The last components of the integer tables the real checkpoint holds (a hash routing's experts per token id,
    which scaffold.detect.forms.read_checkpoint let through), each with the twin's expert count its rows draw from."""
    leaves = sorted({name.rsplit(".", 1)[-1] for name, t in ckpt.tensors.items() if t.dtype in INTEGER_DTYPES})
    if not leaves:
        return {}
    key, experts = _positive(config, "experts")
    if key is None:
        raise ScaffoldError(f"--twin cannot draw the integer table{'s' if len(leaves) > 1 else ''} "
                            f"{', '.join(leaves)} of the checkpoint: config.json names no expert count "
                            f"({' / '.join(KEYS['experts'])}) whose experts its rows pick.", ckpt.config_file)
    return {leaf: experts for leaf in leaves}


def _random_weights(folder: Path, trust_remote_code: bool, seed: int, tables: dict[str, int] | None = None) -> None:
    """Random weights for folder/config.json, saved by transformers as safetensors into `folder`. `tables`: integer
    tables by last name component, each row drawn as distinct experts of the given count (transformers builds them
    as zeros: every token would go to expert 0)."""
    # Deferred on purpose: torch and transformers take seconds to import, and only building a twin needs them.
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=trust_remote_code)
    except Exception as exc:  # noqa: BLE001 - transformers' own message says what it refused
        raise ScaffoldError(f"transformers cannot build the twin from the shrunk config.json "
                            f"({type(exc).__name__}: {exc}).", folder / "config.json") from None
    randomize(model, STD)
    _random_tables(model, tables or {})
    saved = Path(tempfile.mkdtemp(prefix=".weights-", dir=folder))
    try:
        model.save_pretrained(saved, safe_serialization=True)
        for path in saved.iterdir():
            if path.name.endswith(".safetensors") or path.name == "model.safetensors.index.json":
                os.replace(path, folder / path.name)
    finally:
        shutil.rmtree(saved, ignore_errors=True)


def _random_tables(model, tables: dict[str, int]) -> None:
    """Each row of an integer table: distinct experts drawn at random, so that the port's lookup of it matters."""
    import torch  # deferred on purpose: only building a twin needs torch

    tensors = [*model.named_parameters(), *model.named_buffers()]
    with torch.no_grad():
        for name, tensor in tensors:
            experts = tables.get(name.rsplit(".", 1)[-1])
            if experts is None or tensor.is_floating_point() or tensor.dim() != 2:
                continue
            if tensor.shape[1] > experts:
                raise ScaffoldError(f"--twin cannot draw {name}: rows of {tensor.shape[1]} distinct experts "
                                    f"out of the twin's {experts}.")
            rows = torch.argsort(torch.rand(tensor.shape[0], experts), dim=1)[:, :tensor.shape[1]]
            tensor.copy_(rows.to(tensor.dtype))


def info(twin: Path) -> dict:
    return json.loads((Path(twin) / INFO_FILE).read_text())


# ------------------------------------------------------------ twin vs checkpoint
_EXPERT = re.compile(r"\.experts\.(\d+)\.")


def layout_problems(spec, ckpt: Checkpoint, twin: Checkpoint, twin_spec) -> tuple[list[str], int]:
    """The twin must store the tensors the real checkpoint stores for its first layers and experts.

    Names the port skips on purpose (rotary buffers, a tied head) are left out of the
    comparison. Returns the problems and the number of tensor names compared.
    """
    prefix = f"{spec.names['model']}.{spec.names['layers']}."
    experts = max((int(m.group(1)) + 1 for n in twin.tensors if (m := _EXPERT.search(n))), default=0)

    def kept(names, layers: int) -> set[str]:
        out = set()
        for name in names:
            if name.startswith(prefix):
                index = name[len(prefix):].split(".", 1)[0]
                if index.isdigit() and int(index) >= layers:
                    continue
            if (m := _EXPERT.search(name)) and int(m.group(1)) >= experts:
                continue
            out.add(name)
        return out

    def loaded(s, c: Checkpoint) -> set[str]:
        rows, _ = weight_table(s, c)
        skipped = {r.checkpoint for r in rows if r.param is None}
        return set(c.tensors) - skipped

    layers = twin_spec.num_layers
    real = kept(loaded(spec, ckpt), layers)
    mine = loaded(twin_spec, twin)
    problems = []
    if only := sorted(real - mine, key=natural):
        problems.append(f"only in the checkpoint: {', '.join(only[:3])}{' ...' if len(only) > 3 else ''}")
    if only := sorted(mine - real, key=natural):
        problems.append(f"only in the twin: {', '.join(only[:3])}{' ...' if len(only) > 3 else ''}")
    return problems, len(real | mine)


# Spec fields the twin is expected to change; any other difference is reported.
SIZE_FIELDS = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
               "vocab_size", "max_position", "sliding_window", "sliding_window_layers", "no_rope_layers", "dtype",
               "tokenizer_vocab_size", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
               "shared_expert_intermediate_size", "mlp_only_layers", "dense_layers", "layer_num_heads")


def twin_spec(port_spec, real_detected, twin_detected) -> tuple[Any, list[str]]:
    """The port's spec with the twin's sizes: what verify's own bookkeeping (prompts, probes,
    TP proof) needs on the twin. The port's code reads sizes from the config at run time.

    A field takes the twin's value where the twin changed it (the real checkpoint and the
    twin disagree); elsewhere the port's own value stays, drift and all. Returns the spec
    and the fields outside the expected sizes that the twin changed.
    """
    spec = copy.deepcopy(port_spec)
    unexpected = []
    for name in FIELDS:
        if name == "package":
            continue
        theirs = getattr(twin_detected, name)
        if real_detected is None:
            if name in SIZE_FIELDS:
                setattr(spec, name, theirs)
            continue
        if getattr(real_detected, name) != theirs:
            setattr(spec, name, theirs)
            if name not in SIZE_FIELDS:
                unexpected.append(name)
    return spec, unexpected
