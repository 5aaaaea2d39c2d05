"""Static tensor-parallel proof: the port's mapping through vLLM's own loaders, rank by rank.

Usage: python -m scaffold.verify.tp REQUEST.json   (PYTHONPATH holds the staged port)

For each TP size, for each rank, builds vLLM's QKVParallelLinear and
MergedColumnParallelLinear as that rank would (the tensor-parallel rank and size are
simulated), feeds them layer 0's checkpoint tensors through the port's own
`param_for` (parameter and shard id), and checks what lands in the rank against an
independent statement of what it must hold: a contiguous block of query heads, the
rank's key/value heads (replicated when TP exceeds the KV heads, as in seed 000's
Qwen3-235B case), and its block of gate and of up rows. Then checks that the ranks
reassemble the unsharded projections. No engine, no process group.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys


@contextlib.contextmanager
def simulated_rank(tp_size: int, rank: int):
    # Deferred on purpose: this module runs in the sharding-proof worker; the parent never imports vLLM.
    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.parameter as parameter

    saved = []
    for module in (linear, parameter):
        for name, value in (("get_tensor_model_parallel_world_size", tp_size),
                            ("get_tensor_model_parallel_rank", rank)):
            if hasattr(module, name):
                saved.append((module, name, getattr(module, name)))
                setattr(module, name, lambda value=value: value)
    try:
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


def expected_rank_rows(q, k, v, gate, up, heads, kv_heads, head_dim, tp, rank):
    """What rank `rank` of `tp` must hold, stated from the head counts alone."""
    qs = heads // tp * head_dim
    q_rank = q[rank * qs:(rank + 1) * qs]
    if kv_heads >= tp:
        ks = kv_heads // tp * head_dim
        k_rank, v_rank = k[rank * ks:(rank + 1) * ks], v[rank * ks:(rank + 1) * ks]
    else:  # replicate: tp // kv_heads ranks share each KV head
        head = rank // (tp // kv_heads)
        k_rank = k[head * head_dim:(head + 1) * head_dim]
        v_rank = v[head * head_dim:(head + 1) * head_dim]
    inter = gate.shape[0] // tp
    return q_rank, k_rank, v_rank, gate[rank * inter:(rank + 1) * inter], up[rank * inter:(rank + 1) * inter]


def prove(request: dict) -> list[dict]:
    # Deferred on purpose, as in simulated_rank: only the worker process pays for torch and vLLM.
    import torch
    from safetensors import safe_open
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear, QKVParallelLinear

    module_name, class_name = request["model_class"].split(":")
    port = getattr(importlib.import_module(module_name), class_name)
    heads, kv_heads, head_dim = request["num_heads"], request["num_kv_heads"], request["head_dim"]
    # The query "heads" the port's QKVParallelLinear holds: twice the heads where q_proj also emits the output gate
    # per head ([query | gate] rows per head, attn_output_gate "in_query"), so each rank takes its heads' pairs.
    q_heads = request.get("query_heads", heads)
    hidden, inter = request["hidden_size"], request["intermediate_size"]
    tensors = {}
    for name, file in request["tensors"].items():
        with safe_open(file, framework="pt") as f:
            tensors[name] = f.get_tensor(name).float()
    by_shard = {}
    for name, tensor in tensors.items():
        param, shard = port.param_for(name)
        by_shard[(param.rsplit(".", 2)[-2], shard)] = (name, tensor)
    missing = [f"{param} shard {shard!r}" for param, shards in (("qkv_proj", ("q", "k", "v")), ("gate_up_proj", (0, 1)))
               for shard in shards if (param, shard) not in by_shard]
    if missing:
        raise ValueError(f"no tensor of layer 0 loads {', '.join(missing)} through the port's param_for, so no "
                         "rank can be checked")
    q, k, v = (by_shard[("qkv_proj", s)][1] for s in ("q", "k", "v"))
    gate, up = (by_shard[("gate_up_proj", s)][1] for s in (0, 1))

    results = []
    torch.set_default_dtype(torch.float32)
    for tp in request["tp_sizes"]:
        if heads % tp or (kv_heads < tp and tp % kv_heads) or (kv_heads >= tp and kv_heads % tp) or inter % tp:
            results.append({"tp": tp, "status": "not servable",
                            "detail": f"{heads} query heads / {kv_heads} KV heads / {inter} MLP rows do not "
                                      f"divide over {tp} ranks"})
            continue
        if request.get("paired_heads") and (heads % (2 * tp) or kv_heads % tp):
            results.append({"tp": tp, "status": "not servable",
                            "detail": f"differential attention's {heads // 2} head pairs or {kv_heads} KV heads do "
                                      f"not divide over {tp} ranks (the port does not replicate KV heads)"})
            continue
        problems, q_parts, k_heads = [], [], {}
        for rank in range(tp):
            with simulated_rank(tp, rank):
                qkv = QKVParallelLinear(hidden, head_dim, q_heads, kv_heads, bias=False)
                gate_up = MergedColumnParallelLinear(hidden, [inter, inter], bias=False)
            for (layer, shard), (name, tensor) in by_shard.items():
                target = qkv if layer == "qkv_proj" else gate_up
                target.weight.weight_loader(target.weight, tensor, shard)
            q_r, k_r, v_r, g_r, u_r = expected_rank_rows(q, k, v, gate, up, q_heads, kv_heads, head_dim, tp, rank)
            if not torch.equal(qkv.weight.data, torch.cat([q_r, k_r, v_r])):
                problems.append(f"rank {rank}: qkv_proj does not hold its q heads, then its k and v heads")
            if not torch.equal(gate_up.weight.data, torch.cat([g_r, u_r])):
                problems.append(f"rank {rank}: gate_up_proj does not hold its gate rows, then its up rows")
            q_parts.append(qkv.weight.data[: q_r.shape[0]])
            k_heads[rank] = qkv.weight.data[q_r.shape[0]: q_r.shape[0] + k_r.shape[0]]
        if not torch.equal(torch.cat(q_parts), q):
            problems.append("the ranks' q shards do not reassemble q_proj")
        if kv_heads >= tp and not torch.equal(torch.cat(list(k_heads.values())), k):
            problems.append("the ranks' k shards do not reassemble k_proj")
        replicas = tp // kv_heads if kv_heads < tp else 1
        detail = (f"k/v heads replicated on {replicas} ranks each; " if replicas > 1 else "") + (
            "per-rank shards reassemble q, k, v, gate, up" if not problems else "; ".join(problems[:2]))
        results.append({"tp": tp, "status": "ok" if not problems else "wrong", "detail": detail})
    return results


def main(request_file: str) -> None:
    request = json.loads(open(request_file).read())
    results = prove(request)
    with open(request["out"], "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1])
