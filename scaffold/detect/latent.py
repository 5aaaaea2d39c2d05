"""Multi-head latent attention (DeepSeek-V2's MLA): its module names and sizes, read from the tensors.

The queries come from the hidden states through a low-rank projection and its norm (q_a_proj,
q_a_layernorm, q_b_proj), or through one projection (q_proj). Keys and values come from one joint
projection (kv_a_proj_with_mqa) whose output is the compressed latent (kv_lora_rank wide, normed by
kv_a_layernorm) followed by one rotated key part shared by every head (qk_rope_head_dim wide);
kv_b_proj expands the latent into each head's unrotated key part (qk_nope_head_dim) and its value
(v_head_dim). vLLM caches the latent and the rotated key, not per-head keys and values.

Every size follows from the shapes, so a checkpoint without the config keys still ports; where
config.json holds a key of the same value, the port reads that key at run time. A query up-projection that
reads twice the low-rank query's width (A.X-K2's q_gate_proj: the normed and the unnormed query, with an
output gate in each head's rows) is read from the code by latentgate.py; its gate is as wide as the values.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaffold.checkpoint import Checkpoint
from scaffold.detect import keyselect, latentgate, renamings
from scaffold.detect.common import unsupported
from scaffold.detect.sourcecode import config_default
from scaffold.errors import CheckpointError
from scaffold.spec import Source, Spec

# Module names each role goes by in the checkpoints the generator knows (DeepSeek-V2/V3 and the families built
# on their code: GLM-4.7-Flash, MiniCPM3, Kimi, Youtu), first present wins.
CANDIDATES = {
    "kv_a_proj": ("kv_a_proj_with_mqa", "kv_a_proj"),
    "kv_a_norm": ("kv_a_layernorm", "kv_a_norm"),
    "kv_b_proj": ("kv_b_proj",),
    "q_a_proj": ("q_a_proj",),
    "q_a_norm": ("q_a_layernorm", "q_a_norm"),
    "q_b_proj": ("q_b_proj",),
    "q_proj": ("q_proj",),
}
SIZES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def _find(layer0: dict, attn: str, role: str) -> str | None:
    return next((c for c in CANDIDATES[role] if f"{attn}.{c}.weight" in layer0), None)


def present(layer0: dict, attn: str) -> bool:
    """Whether layer 0's attention is a latent one: a joint latent projection and the latent's expansion."""
    return _find(layer0, attn, "kv_a_proj") is not None and _find(layer0, attn, "kv_b_proj") is not None


def detect(ckpt: Checkpoint, spec: Spec, names: dict, attn: str, layer0: dict, path: str,
           o_proj: str | None, sources: dict | None = None, attention_cls: str | None = None) -> set[str]:
    """Name the latent roles and set the latent sizes; `path` is layer 0's attention in the checkpoint, `o_proj`
    its output projection, `attention_cls` the attention's class in `sources`. Returns the attention's modules the
    port accounts for (the layout's claimed ones): those it computes with, and a top-k key selector it skips."""
    where = ckpt.config_file
    found = {role: _find(layer0, attn, role) for role in CANDIDATES}
    selector = _key_selection(ckpt, spec, attn, layer0, path, sources, attention_cls)
    low_rank_q = found["q_a_proj"] is not None
    needed = ("kv_a_proj", "kv_a_norm", "kv_b_proj") + (("q_a_proj", "q_a_norm", "q_b_proj") if low_rank_q
                                                         else ("q_proj",))
    missing = [role for role in needed if found[role] is None]
    if missing:
        raise unsupported(f"latent attention without {', '.join(missing)} "
                          f"(looked for {', '.join(c for r in missing for c in CANDIDATES[r])} under {path})",
                          where, spec.model_type)
    biased = sorted(f"{found[r]}.bias" for r in needed if f"{attn}.{found[r]}.bias" in layer0)
    if biased:
        raise unsupported(f"latent attention projections with a bias ({path}.{biased[0]})", where, spec.model_type)

    def shape(role: str) -> tuple[int, ...]:
        return tuple(layer0[f"{attn}.{found[role]}.weight"].shape)

    def tensor(role: str) -> str:
        return f"{path}.{found[role]}.weight"

    heads, hidden = spec.num_heads, spec.hidden_size
    kv_rank = shape("kv_a_norm")[0]
    rope = shape("kv_a_proj")[0] - kv_rank
    q_rows = shape("q_b_proj" if low_rank_q else "q_proj")[0]
    q_rank = shape("q_a_norm")[0] if low_rank_q else 0
    kv_rows, kv_in = shape("kv_b_proj")
    gate = None
    if low_rank_q and shape("q_b_proj")[1] != q_rank:
        gate = _query_gate(ckpt, spec, found, path, attn, layer0, o_proj, sources, attention_cls,
                           f"latent attention whose query up-projection reads {shape('q_b_proj')[1]} columns "
                           f"({tensor('q_b_proj')}), not the {q_rank}-wide normed low-rank query ({tensor('q_a_norm')})")
    if rope <= 0 or q_rows % heads or kv_rows % heads:
        raise CheckpointError(f"{tensor('kv_a_proj')} has shape {list(shape('kv_a_proj'))}, {tensor('kv_b_proj')} "
                              f"{list(shape('kv_b_proj'))}: not the latent attention of {heads} heads over a "
                              f"{kv_rank}-wide latent ({tensor('kv_a_norm')}).", where)
    if gate is None:
        nope = q_rows // heads - rope
        value = kv_rows // heads - nope
    else:  # each head's rows hold its query and a gate as wide as its value: the value's width is o_proj's
        value = gate.value
        nope = kv_rows // heads - value
    sizes = {"q_lora_rank": q_rank, "kv_lora_rank": kv_rank, "qk_nope_head_dim": nope, "qk_rope_head_dim": rope,
             "v_head_dim": value}
    q_in = q_rank * (2 if gate is not None else 1)
    expected = {
        "kv_a_proj": (kv_rank + rope, hidden),
        "kv_b_proj": (heads * (nope + value), kv_rank),
        "o_proj": (hidden, heads * value),
        **({"q_a_proj": (q_rank, hidden),
            "q_b_proj": (heads * (nope + rope + (value if gate is not None else 0)), q_in)} if low_rank_q
           else {"q_proj": (heads * (nope + rope), hidden)}),
    }
    if nope <= 0 or value <= 0 or kv_in != kv_rank:
        raise CheckpointError(f"{tensor('kv_b_proj')} has shape {list(shape('kv_b_proj'))}, but {heads} heads "
                              f"whose rotated part is {rope} wide (from {tensor('kv_a_proj')}) over a "
                              f"{kv_rank}-wide latent cannot make it.", where)
    names.update({role: found[role] for role in needed})
    # The port's one module for both down-projections of the hidden states (vLLM's fused_qkv_a_proj), where the
    # queries have one; else the role is unused.
    names["qkv_proj"] = "fused_qkv_a_proj" if low_rank_q else "qkv_proj"
    for role, want in expected.items():
        module = o_proj if role == "o_proj" else found[role]
        info = layer0.get(f"{attn}.{module}.weight")
        if info is not None and tuple(info.shape) != want:
            raise CheckpointError(f"tensor {path}.{module}.weight has shape {list(info.shape)}, but latent attention "
                                  f"of {heads} heads (rotated part {rope}, unrotated {nope}, value {value}, latent "
                                  f"{kv_rank}) over hidden size {hidden} needs {list(want)}.", where)
    for field, size in sizes.items():
        said = ckpt.config.get(field)
        if said is not None and said != size and not (field == "q_lora_rank" and size == 0):
            raise CheckpointError(f"config.json says {field} = {said!r}, but the tensors of layer 0's attention "
                                  f"({path}) make it {size}.", where)
        if said == size and size:
            spec.set(field, size, Source("config", f"config.json {field} (matches the tensors)", f"config.{field}"))
        else:
            spec.set(field, size, Source("tensor", _why(field, found, path, low_rank_q)))
    spec.set("qkv_layout", "latent", Source("tensor", f"{tensor('kv_a_proj')} and {tensor('kv_b_proj')}: a "
                                                      "compressed key/value latent"))
    spec.set("qkv_bias", False, Source("tensor", f"{path}: no bias on the latent projections"))
    if gate is not None:
        spec.set("latent_query_input", "+".join(gate.found.inputs),
                 Source("code", f"{gate.found.evidence}: {tensor('q_b_proj')} ({shape('q_b_proj')[1]} columns) reads "
                                f"the {' and the '.join(gate.found.inputs)} low-rank query, concatenated"))
        spec.set("latent_gate_first", gate.found.gate_first,
                 Source("code", f"{gate.found.evidence}: each head's {q_rows // heads} rows hold "
                                + ("the gate, then the query" if gate.found.gate_first else "the query, then the gate")))
        spec.set("attn_output_gate", "in_query",
                 Source("code", f"{gate.found.evidence}: a {gate.found.act} gate, {value} wide per head (as the "
                                f"values, from {path}.{o_proj}.weight's columns), in {tensor('q_b_proj')}'s rows"))
        spec.set("attn_gate_act", gate.found.act, Source("code", f"{gate.found.evidence}: the gate's activation"))
        spec.set("attn_gate_bias", False, Source("tensor", f"no bias on {tensor('q_b_proj')}"))
    skipped = {r.rsplit(".", 1)[0] for r in layer0 if any(r.startswith(f"{attn}.{m}.") for m in selector)}
    return {f"{attn}.{found[role]}" for role in needed} | skipped


@dataclass(frozen=True)
class _Gate:
    found: latentgate.QueryGate
    value: int  # each head's value and gate width


def _query_gate(ckpt: Checkpoint, spec: Spec, found: dict, path: str, attn: str, layer0: dict, o_proj: str | None,
                sources: dict | None, attention_cls: str | None, what: str) -> _Gate:
    """The query up-projection reads more than the normed low-rank query: A.X-K2's form (latentgate.read: the
    normed and the unnormed query concatenated, each head's rows [query | gate], the gate activated on the attention
    output), with the gate's width, the value's, from o_proj's columns. Refused by name where the code does not
    show it, or shows another form."""
    where = ckpt.config_file
    if not sources or not attention_cls:
        raise unsupported(f"{what}, and no modeling code says what it reads", where, spec.model_type)
    table = renamings.renamings(ckpt)

    def code(role: str) -> str:
        return renamings.code_name(table, f"{path}.{found[role]}.weight").rsplit(".", 2)[-2]

    o_name = o_proj or "o_proj"
    try:
        read = latentgate.read(sources, attention_cls, code("q_a_proj"), code("q_a_norm"), code("q_b_proj"),
                               renamings.code_name(table, f"{path}.{o_name}.weight").rsplit(".", 2)[-2])
    except latentgate.Refused as exc:
        raise unsupported(f"{what}: {exc}", where, spec.model_type) from None
    q_rank = layer0[f"{attn}.{found['q_a_norm']}.weight"].shape[0]
    columns = layer0[f"{attn}.{found['q_b_proj']}.weight"].shape[1]
    o_info = layer0.get(f"{attn}.{o_name}.weight")
    heads = spec.num_heads
    if columns != 2 * q_rank or o_info is None or len(o_info.shape) != 2 or o_info.shape[1] % heads:
        raise unsupported(f"{what}: {columns} columns are not the two {q_rank}-wide queries it concatenates, or "
                          f"{path}.{o_name}.weight does not give the values' width", where, spec.model_type)
    return _Gate(read, o_info.shape[1] // heads)


def _key_selection(ckpt: Checkpoint, spec: Spec, attn: str, layer0: dict, path: str, sources: dict | None,
                   attention_cls: str | None) -> tuple[str, ...]:
    """A top-k key selection in the attention (DeepSeek-V3.2's lightning indexer): the attention's modules that
    compute it, whose tensors the port does not load, and spec index_topk, the k the port serves contexts up to.
    Refused by name where the code does not show it (tensors under `indexer` without it) or the reader does not
    follow it; () where there is none."""
    where = ckpt.config_file
    stem = path.rsplit(".", 1)[0]
    try:
        found = keyselect.read(sources, attention_cls) if sources and attention_cls else None
    except keyselect.Unfollowed as exc:
        raise unsupported(f"sparse latent attention: a top-k selection of the keys each query sees that the port does "
                          f"not compute ({exc})", where, spec.model_type) from None
    if found is None:
        indexer = sorted(r for r in layer0 if r.startswith(f"{attn}.indexer."))
        if indexer:
            raise unsupported(f"sparse latent attention: a top-k token indexer ({stem}.{indexer[0]}, DeepSeek-V3.2's "
                              "lightning indexer) chooses the keys each query sees, and the code read shows no "
                              "top-k the reader follows into the attention", where, spec.model_type)
        return ()
    held = sorted(r for r in layer0 if any(r.startswith(f"{attn}.{m}.") for m in found.modules))
    said = ckpt.config.get(found.key)
    default = None if said is not None else config_default(ckpt, found.key)
    value = said if said is not None else default.value if default is not None else None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise unsupported(f"sparse latent attention: a top-k selection of keys ({found.evidence}) whose k, "
                          f"config.{found.key}, is {value!r} (config.json, or the code's default): the port serves "
                          "contexts up to k tokens and cannot tell k", where, spec.model_type)
    origin = f"config.json {found.key}" if said is not None else f"the code's default for {found.key} ({default})"
    spec.set("index_topk", value, Source("code", f"{origin}: the k of {found.evidence}", f"config.{found.key}"))
    spec.set("key_selector", list(found.modules),
             Source("code", f"{found.evidence}; up to index_topk keys it keeps every key, so the port does not "
                            f"compute it and skips its tensors ({', '.join(f'{stem}.{r}' for r in held[:3])}"
                            f"{', ...' if len(held) > 3 else ''})"
                            + (f"; the config keys the selector reads: {', '.join(found.reads)}" if found.reads else "")))
    return found.modules


def _why(field: str, found: dict, path: str, low_rank_q: bool) -> str:
    if field == "q_lora_rank":
        return (f"{path}.{found['q_a_norm']}.weight's width" if low_rank_q
                else f"no {path}.q_a_proj: the queries come from {found['q_proj']} alone")
    return {
        "kv_lora_rank": f"{path}.{found['kv_a_norm']}.weight's width",
        "qk_rope_head_dim": f"{path}.{found['kv_a_proj']}.weight's rows beyond the latent",
        "qk_nope_head_dim": f"{path}.{found['q_b_proj' if low_rank_q else 'q_proj']}.weight's rows per head beyond "
                            "the rotated part",
        "v_head_dim": f"{path}.{found['kv_b_proj']}.weight's rows per head beyond the unrotated key part",
    }[field]
