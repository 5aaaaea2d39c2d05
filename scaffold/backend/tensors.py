"""Will vLLM's transformers backend load every checkpoint tensor, and fill every parameter?

The native generator refuses a checkpoint whose tensors do not match the architecture
(a tensor missing, of the wrong shape, or with no home). The backend must be held to
the same standard before a package is written, or a corrupt checkpoint of a stock
architecture, or remote code whose module names vLLM cannot map, is "ported" with
exit 0 and fails (or silently computes something else) in the engine.

The check is static: no engine and no weights. A child process (isolated, `python -I`,
in a fresh empty folder, bounded in memory and time) builds the base model the way the
backend does, `AutoModel.from_config` on the `meta` device (transformers' own code; the
checkpoint's code only with --trust-remote-code), and maps each checkpoint tensor name
the way the backend's `hf_to_vllm_mapper` does (vllm/model_executor/models/transformers/
base.py `_create_hf_to_vllm_mapper`: transformers' `WeightRenaming`s, the keys the model
ignores, the base-model-prefix rewrites, a nested lm_head). This process then compares
both ways, from the safetensors headers already read: every tensor must land on a
parameter (or persistent buffer) of the module tree with that parameter's shape, and every
parameter must be filled. A stray tensor is refused even where vLLM would drop it silently
(its loader ignores any unexpected `.bias`): a port that drops a stored tensor computes
something else.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from scaffold.checkpoint import Checkpoint, TensorInfo

BUILD_TIMEOUT_S = 180
BUILD_MEMORY_BYTES = 6 << 30  # address space of the child: torch and transformers need ~3 GiB of it
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
MAX_EXPERTS = 16384  # real MoE checkpoints have hundreds; built one module each, 10**8 would take minutes and GBs
EXPERT_TENSOR = re.compile(r"^(\d+)\.(\w+)\.(weight|bias)$")
MAX_LISTED = 2

# Runs in the child. Reads {"checkpoint", "trust_remote_code", "names"} from argv[1], writes the module
# tree and the mapped names to argv[2]. Mirrors vLLM 0.32's Base.__init__ / _create_hf_to_vllm_mapper.
CHILD = r'''
import json, re, resource, sys
limit = int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
with open(sys.argv[1]) as f:
    args = json.load(f)
import torch
from torch import nn
from transformers import AutoConfig, AutoModel
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, get_model_conversion_mapping
from transformers.core_model_loading import WeightRenaming

trust = args["trust_remote_code"]
config = AutoConfig.from_pretrained(args["checkpoint"], trust_remote_code=trust)
with torch.device("meta"):
    model = AutoModel.from_config(config, trust_remote_code=trust)
text = config.get_text_config()

renamings = [m for m in get_model_conversion_mapping(model) if isinstance(m, WeightRenaming)]
instantiated = {type(m).__name__ for m in model.modules()}
for arch in config.architectures or []:
    if arch not in instantiated:
        renamings += [m for m in get_checkpoint_conversion_mapping(arch) or [] if isinstance(m, WeightRenaming)]
regex = {}
for key in model._keys_to_ignore_on_load_unexpected or []:
    regex[re.compile(key)] = None
bmp = model.base_model_prefix
if bmp and bmp != "model":
    regex[re.compile(rf"^{bmp}\.(.+)")] = r"model.\1"
children = "|".join(n for n, _ in [*model.named_children(), *model.named_parameters(recurse=False),
                                   *model.named_buffers(recurse=False)])
regex[re.compile(rf"^(?!model\.)(({children}).*)")] = r"model.\1"
regex[re.compile(rf"^(model\.)((?!{children}).+)")] = r"\2"
regex[re.compile(r"^model\.(.+\.)*(lm_head.+)")] = r"\2"
ignored_substr = ("rotary_pos_emb.inv_freq", "rotary_emb.inv_freq", "rotary_emb.cos_cached", "rotary_emb.sin_cached")


ignored_by = {}


def map_name(original):
    key = original
    for r in renamings:
        key, _ = r.rename_source_key(key)
    for pattern, new in regex.items():
        if pattern.search(key):
            if new is None:
                ignored_by[original] = pattern.pattern
                return None
            key = pattern.sub(new, key)
    return None if any(s in key for s in ignored_substr) else key


params = {"model." + n: list(p.shape) for n, p in model.named_parameters()}
buffers = {}
for prefix, module in model.named_modules():
    for n, b in module.named_buffers(recurse=False):
        if n not in module._non_persistent_buffers_set:
            buffers["model." + (prefix + "." if prefix else "") + n] = list(b.shape)
experts = {}
layers_list = None
num_layers = getattr(text, "num_hidden_layers", None)
for prefix, module in model.named_modules():
    if isinstance(module, nn.ModuleList) and len(module) == num_layers and layers_list is None:
        layers_list = "model." + prefix
    name = prefix.rsplit(".", 1)[-1]
    if name == "experts":
        own = [p for p in module.parameters(recurse=False)]
        if not isinstance(module, nn.ModuleList) and any(p.dim() == 3 for p in own):
            experts["model." + prefix] = {"count": int(own[0].shape[0]),
                                          "numel": sum(p.numel() for p in module.parameters())}
tie = bool(getattr(text, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False))
n_predict = next((getattr(text, k) for k in ("n_predict", "num_nextn_predict_layers", "mtp_num_hidden_layers")
                  if isinstance(getattr(text, k, None), int)), 0)
lm_head_bias = False
if "lm_head.bias" in args["names"] or "model.lm_head.bias" in args["names"]:
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        head = AutoModelForCausalLM.from_config(config, trust_remote_code=trust).get_output_embeddings()
    lm_head_bias = getattr(head, "bias", None) is not None
mapped = {n: map_name(n) for n in args["names"]}
tree = {
    "model_class": type(model).__name__, "params": params, "buffers": buffers, "experts": experts,
    "mapped": mapped, "ignored_by": ignored_by, "tie": tie, "lm_head_bias": lm_head_bias,
    "vocab": text.vocab_size, "hidden": text.hidden_size,
    "mtp_prefixes": [f"{layers_list}.{i}." for i in range(num_layers, num_layers + n_predict)] if layers_list else [],
}
with open(sys.argv[2], "w") as f:
    json.dump(tree, f)
'''


@dataclass
class TensorCheck:
    """The checkpoint's tensors against the module tree the backend builds."""

    checked: bool  # False: the tree could not be built (see `reason`)
    problems: list[str] = field(default_factory=list)  # each names a tensor and its file
    reason: str = ""
    model_class: str = ""
    tensors: int = 0  # checkpoint tensors that land on a parameter or buffer
    ignored: int = 0  # checkpoint tensors the backend ignores on purpose (rotary caches, MTP layers, ...)
    parameters: int = 0

    @property
    def ok(self) -> bool:
        return self.checked and not self.problems

    def blocker(self) -> str | None:
        if not self.checked:
            return self.reason
        if self.problems:
            more = f"; and {len(self.problems) - MAX_LISTED} more" if len(self.problems) > MAX_LISTED else ""
            return "; ".join(self.problems[:MAX_LISTED]) + more
        return None

    def summary(self) -> str:
        if not self.ok:
            return self.blocker() or ""
        ignored = f" ({self.ignored} more ignored by the backend, as by transformers)" if self.ignored else ""
        return (f"every one of the {self.tensors} checkpoint tensors{ignored} lands on a parameter of the "
                f"backend's {self.model_class} with its shape, and all {self.parameters} parameters are filled")


def check(ckpt: Checkpoint, trust_remote_code: bool, remote_code: bool) -> TensorCheck:
    """Build the backend's module tree (in a child process) and hold the checkpoint's tensors to it."""
    if remote_code and not trust_remote_code:
        return TensorCheck(False, reason=(
            "without --trust-remote-code the tool cannot build the checkpoint's own model to check that vLLM's "
            "backend maps every checkpoint tensor name; pass --trust-remote-code, or describe the architecture "
            "with --spec for a native port"))
    if ckpt.config.get("quantization_config") is not None:
        return TensorCheck(False, reason=(
            "the checkpoint is quantized (config.json has a quantization_config): its packed tensors and scales "
            "cannot be held to the module tree transformers builds, so the tool cannot check that vLLM's backend "
            "maps every tensor"))
    too_many = _bounds(ckpt)
    if too_many:
        return TensorCheck(False, reason=too_many)
    try:
        tree = _build_tree(ckpt, trust_remote_code)
    except _BuildError as exc:
        return TensorCheck(False, reason=str(exc))
    return compare(ckpt, tree)


def _bounds(ckpt: Checkpoint) -> str | None:
    """Counts that no real checkpoint reaches, checked before the model is built: on the meta device the
    tensors cost nothing, but each layer (and each expert built as its own module) is Python objects.
    Every layer stores at least one tensor, so a layer count above the tensor count is not a checkpoint."""
    config = ckpt.config.get("text_config") if isinstance(ckpt.config.get("text_config"), dict) else ckpt.config
    for key in (*LAYER_KEYS, *EXPERT_KEYS):
        value = config.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            continue
        if key in LAYER_KEYS and value > len(ckpt.tensors):
            return (f"config.json sets {key} = {value}, but the checkpoint stores only {len(ckpt.tensors)} tensors; "
                    "every layer stores at least one")
        if key in EXPERT_KEYS and value > MAX_EXPERTS:
            return f"config.json sets {key} = {value}, more than the {MAX_EXPERTS} experts this tool builds"
    return None


class _BuildError(Exception):
    pass


def _build_tree(ckpt: Checkpoint, trust_remote_code: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="scaffold-tree-") as tmp:
        args, out = Path(tmp) / "args.json", Path(tmp) / "tree.json"
        args.write_text(json.dumps({"checkpoint": str(ckpt.path), "trust_remote_code": trust_remote_code,
                                    "names": sorted(ckpt.tensors)}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", TOKENIZERS_PARALLELISM="false")
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", CHILD, str(args), str(out), str(BUILD_MEMORY_BYTES)],
                                  cwd=tmp, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                  check=False)
        except subprocess.TimeoutExpired:
            raise _BuildError(f"building the model from config.json on the meta device took over "
                              f"{BUILD_TIMEOUT_S} s") from None
        if proc.returncode != 0 or not out.exists():
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            last = next((ln for ln in reversed(lines) if "Error" in ln), lines[-1] if lines else f"exit {proc.returncode}")
            last = "".join(c if c.isprintable() else "?" for c in last)  # it may quote the checkpoint's text
            raise _BuildError("transformers could not build the model from config.json (so the tool cannot check "
                              f"that vLLM's backend maps every tensor): {last[:300]}")
        return json.loads(out.read_text())


def _where(info: TensorInfo) -> str:
    return f"in {info.file}" if info.file else "in the checkpoint"


def compare(ckpt: Checkpoint, tree: dict) -> TensorCheck:
    """Both ways: each tensor finds a parameter or buffer of its shape; each parameter is filled."""
    result = TensorCheck(True, model_class=tree["model_class"])
    params: dict[str, list[int]] = dict(tree["params"])
    loadable = {**tree["buffers"], **params}
    vocab_hidden = [tree["vocab"], tree["hidden"]]
    if not tree["tie"]:
        params["lm_head.weight"] = loadable["lm_head.weight"] = vocab_hidden
    if tree["lm_head_bias"]:
        loadable["lm_head.bias"] = [tree["vocab"]]
    experts = tree["experts"]
    per_expert: dict[str, dict[int, dict[str, tuple[str, TensorInfo]]]] = {}
    filled: set[str] = set()
    owners: dict[str, str] = {}  # parameter -> the checkpoint tensor that fills it
    problems = result.problems
    for name in sorted(ckpt.tensors):
        info = ckpt.tensors[name]
        target = tree["mapped"].get(name)
        if target is None or any(target.startswith(p) for p in tree["mtp_prefixes"]):
            result.ignored += 1
            continue  # the backend (and transformers) ignore it on purpose: rotary caches, keys the model ignores
        if target == "lm_head.weight" and tree["tie"]:
            target = "model-tied lm_head.weight"
            want = vocab_hidden
        else:
            want = loadable.get(target)
        if want is None:
            owner = next((q for q in experts if target.startswith(q + ".")), None)
            m = EXPERT_TENSOR.match(target[len(owner) + 1:]) if owner else None
            if m:
                per_expert.setdefault(owner, {}).setdefault(int(m.group(1)), {})[
                    f"{m.group(2)}.{m.group(3)}"] = (name, info)
                continue
            problems.append(f"tensor {name} ({_where(info)}) has no parameter in the backend's {result.model_class}"
                            + (f" (mapped to {target})" if target != name else "")
                            + ": vLLM would refuse it or drop it, and the model would compute something else")
            continue
        if target in owners:
            problems.append(f"tensors {owners[target]} and {name} ({_where(info)}) both land on {target}: "
                            "vLLM would load one over the other")
        owners[target] = name
        if list(info.shape) != list(want):
            problems.append(f"tensor {name} has shape {list(info.shape)} ({_where(info)}), but the backend's "
                            f"{result.model_class} built from config.json needs {list(want)}")
        filled.add(target)
        result.tensors += 1
    for owner, by_expert in per_expert.items():
        result.tensors += _check_experts(owner, experts[owner], by_expert, problems)
        filled.update(n for n in params if n.startswith(owner + "."))
    ignored = tree.get("ignored_by", {})
    for name in sorted(set(params) - filled, key=_natural):
        inner = name.split(".", 1)[-1]
        dropped = next((t for t in sorted(ignored) if t == name or t.endswith("." + inner)), None)
        if dropped:  # stored, but the backend's mapping throws it away (an unanchored ignore pattern)
            problems.append(f"tensor {dropped} ({_where(ckpt.tensors[dropped])}) is stored, but vLLM's backend "
                            f"ignores it (it matches the model's ignore pattern {ignored[dropped]!r}), leaving "
                            f"parameter {name} {list(params[name])} of {result.model_class} unfilled")
            continue
        problems.append(f"tensor {name} is missing: the backend's {result.model_class} built from config.json "
                        f"needs it ({list(params[name])}) and no checkpoint tensor ({_index_file(ckpt)}) fills it")
    result.parameters = len(params)
    return result


def _check_experts(owner: str, meta: dict, by_expert: dict, problems: list[str]) -> int:
    """Checkpoint tensors stored one per expert (`experts.3.gate_proj.weight`) for a module that holds them
    stacked (3-D): vLLM's MoE runner loads them by expert index, so every expert must store the same
    projections, together exactly the stacked parameters' size."""
    count, numel = meta["count"], meta["numel"]
    first = by_expert[min(by_expert)]
    shapes = {k: list(info.shape) for k, (_, info) in first.items()}
    for e in range(count):
        stored = by_expert.get(e)
        if stored is None:
            problems.append(f"expert {e} of {owner} is missing: the backend's module stacks {count} experts and "
                            f"the checkpoint stores none of expert {e}'s tensors")
            continue
        for key in sorted(set(shapes) - set(stored)):
            problems.append(f"tensor {owner}.{e}.{key} is missing: the other experts store it")
        for key, (name, info) in sorted(stored.items()):
            if key in shapes and list(info.shape) != shapes[key]:
                problems.append(f"tensor {name} has shape {list(info.shape)} ({_where(info)}), but expert "
                                f"{min(by_expert)} stores {shapes[key]}")
            elif key not in shapes:
                problems.append(f"tensor {name} ({_where(info)}) is stored for expert {e} only")
    for e in sorted(set(by_expert) - set(range(count))):
        name, info = next(iter(by_expert[e].values()))
        problems.append(f"tensor {name} ({_where(info)}) is for expert {e}, but the backend's module holds "
                        f"{count} experts (0-{count - 1})")
    per = sum(_numel(s) for s in shapes.values())
    if per * count != numel:
        problems.append(f"the experts of {owner} store {per} values each, but the backend's stacked parameters "
                        f"hold {numel // max(count, 1)} per expert")
    return sum(len(v) for v in by_expert.values())


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _index_file(ckpt: Checkpoint) -> str:
    return ckpt.index_file or ", ".join(ckpt.shards[:2]) or "no shard"


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]
