"""Weight mapping of the GoldenDeepseekV3ForCausalLM port, checked on the real checkpoint.

Each checkpoint tensor must land in exactly the rows of exactly one vLLM
parameter, and every parameter must be loaded. The expected rows below are
written out from the head counts, independently of the port's
stacked_params_mapping, so a swapped or mis-sized shard fails here.
"""

import json
import re
from pathlib import Path

import pytest
import torch
from golden_deepseek_v3_vllm.model import (
    KV_CACHE_SCALES,
    GoldenDeepseekV3ForCausalLM,
    quantization_mapper,
)
from safetensors import safe_open
from vllm.model_executor.model_loader.weight_utils import maybe_remap_kv_scale_name

HEADS = 4
Q_A_ROWS = 96  # the query's down-projection: q_lora_rank
KV_A_ROWS = 576  # the latent's: kv_lora_rank 512 + qk_rope_head_dim 64
INTERMEDIATE = 256
EXPERTS = 4
EXPERT_INTERMEDIATE = 64
SHARED_INTERMEDIATE = 64
LAYERS = "model.layers."

# Checkpoint module inside a decoder layer -> the pieces it holds:
# (vLLM module, first checkpoint row, first parameter row, rows).
FUSED_ROWS = {
    # Multi-head latent attention: the query's down-projection and the latent's (compressed keys and
    # values, then the shared rotary key) fill one parameter, the query's rows first.
    "self_attn.q_a_proj": [("self_attn.fused_qkv_a_proj", 0, 0, Q_A_ROWS)],
    "self_attn.kv_a_proj_with_mqa": [
        ("self_attn.fused_qkv_a_proj", 0, Q_A_ROWS, KV_A_ROWS)
    ],
    "mlp.gate_proj": [("mlp.gate_up_proj", 0, 0, INTERMEDIATE)],
    "mlp.up_proj": [("mlp.gate_up_proj", 0, INTERMEDIATE, INTERMEDIATE)],
    # The shared expert: a gated MLP of its own inside the experts block.
    "mlp.shared_experts.gate_proj": [
        ("mlp.shared_experts.gate_up_proj", 0, 0, SHARED_INTERMEDIATE)
    ],
    "mlp.shared_experts.up_proj": [
        ("mlp.shared_experts.gate_up_proj", 0, SHARED_INTERMEDIATE, SHARED_INTERMEDIATE)
    ],
}
# An expert's projection -> (vLLM's parameter holding every expert, first row, rows):
# FusedMoE stacks gate (w1) then up (w3) as w13 [experts, 2 x intermediate, hidden]
# and keeps down (w2) as [experts, hidden, intermediate].
EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(\w+)$")
EXPERT_ROWS = {
    "gate_proj": ("mlp.experts.routed_experts.w13_weight", 0, EXPERT_INTERMEDIATE),
    "up_proj": (
        "mlp.experts.routed_experts.w13_weight",
        EXPERT_INTERMEDIATE,
        EXPERT_INTERMEDIATE,
    ),
    "down_proj": ("mlp.experts.routed_experts.w2_weight", 0, None),
}
# Parameters vLLM's attention layer creates for a quantized KV cache; a checkpoint without
# those scales leaves them at their defaults, as vLLM's own loaders do.
KV_CACHE_PARAMETERS = (
    ".k_scale",
    ".v_scale",
    ".q_scale",
    ".prob_scale",
    ".k_zero_point",
    ".v_zero_point",
    ".q_zero_point",
)
TIED = False
HEAD = "lm_head.weight"
EMBEDDING = "model.embed_tokens.weight"


def checkpoint_tensors(checkpoint: Path):
    index = checkpoint / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        shards = [p.name for p in checkpoint.glob("*.safetensors")]
    for shard in shards:
        with safe_open(str(checkpoint / shard), framework="pt") as f:
            for name in sorted(f.keys()):
                yield name, f.get_tensor(name)


def skipped(name: str) -> bool:
    return "rotary_emb." in name or name.endswith(
        (".attention.bias", ".attention.masked_bias")
    )


def loaded_as(model, params: dict, name: str, tensor: torch.Tensor) -> str | None:
    """The name the port's load_weights loads checkpoint tensor `name` under, or None where it
    drops it as vLLM's loaders do: names the quantization method drops (GPTQ's g_idx), KV-cache
    scales the attention layer does not keep, and zero biases of modules without one."""
    name = quantization_mapper(model.quant_config).map_name(name)
    if name is None:
        return None
    name = maybe_remap_kv_scale_name(name, params)
    if name is None or (name.endswith(KV_CACHE_SCALES) and name not in params):
        return None
    if (
        name.endswith(".bias")
        and not tensor.any()
        and expected_pieces(name)[0][0] not in params
    ):
        return None
    return name


def expected_pieces(name: str) -> list[tuple]:
    """(vLLM parameter, first checkpoint row, first parameter row, rows, expert) that `name` should fill."""
    if TIED and name == HEAD:
        return [(EMBEDDING, None, None, None, None)]
    if name.startswith(LAYERS):
        layer, _, rest = name[len(LAYERS) :].partition(".")
        module, _, kind = rest.rpartition(".")
        if module in FUSED_ROWS:
            return [
                (f"{LAYERS}{layer}.{fused}.{kind}", first, dest, rows, None)
                for fused, first, dest, rows in FUSED_ROWS[module]
            ]
        expert = EXPERT.match(module)
        if expert and kind == "weight" and expert.group(2) in EXPERT_ROWS:
            param, dest, rows = EXPERT_ROWS[expert.group(2)]
            return [(f"{LAYERS}{layer}.{param}", 0, dest, rows, int(expert.group(1)))]
    return [(name, None, None, None, None)]


def quantized(name: str) -> bool:
    """A tensor of the checkpoint's quantization method (qweight, scales, ...), not a float weight or bias."""
    return not name.endswith((".weight", ".bias", ".e_score_correction_bias"))


def compare_with_checkpoint(model, checkpoint: Path) -> tuple[list[str], int, int]:
    params = dict(model.named_parameters())
    problems, compared, dropped = [], 0, 0
    for name, tensor in checkpoint_tensors(checkpoint):
        if skipped(name):
            continue
        name = loaded_as(model, params, name, tensor)
        if name is None:
            dropped += 1
            continue
        if name.endswith(KV_CACHE_SCALES):
            # The attention layer's own scale (maybe_remap_kv_scale_name moved it there).
            if name not in params:
                problems.append(f"{name}: no parameter")
            compared += 1
            continue
        for param_name, first, dest, rows, expert in expected_pieces(name):
            if param_name not in params:
                problems.append(f"{name}: no parameter {param_name}")
                continue
            if quantized(name):
                # The quantization method's own parameter; its loader places the packed values.
                continue
            data, want = params[param_name].data, tensor
            if expert is not None:
                data = data[expert]
            if rows is None:
                rows = want.shape[0]
            if first is not None:
                data, want = data[dest : dest + rows], tensor[first : first + rows]
            elif (
                want.dim()
                and data.shape[1:] == want.shape[1:]
                and data.shape[0] > want.shape[0]
            ):
                # vLLM pads vocabulary rows (embedding, head) to a multiple of 64.
                data = data[: want.shape[0]]
            if data.shape != want.shape:
                problems.append(
                    f"{name}: {param_name} rows have shape {list(data.shape)}, tensor {list(want.shape)}"
                )
            elif not torch.equal(data.to(want.dtype), want):
                problems.append(
                    f"{name}[{first}:]: {param_name}[{dest}:{'' if rows is None else dest + rows}] "
                    "holds other values"
                )
        compared += 1
    return problems, compared, dropped


def test_every_tensor_lands_in_its_rows(on_fresh_model, checkpoint):
    def load_and_compare(model):
        model.load_weights(checkpoint_tensors(checkpoint))
        return compare_with_checkpoint(model, checkpoint)

    problems, compared, dropped = on_fresh_model(load_and_compare)
    assert compared > 0 and compared + dropped == sum(
        1 for name, _ in checkpoint_tensors(checkpoint) if not skipped(name)
    )
    assert dropped == 0, "a float checkpoint's tensors are all loaded"
    assert not problems, "\n".join(problems)


def test_every_parameter_is_loaded(on_fresh_model, checkpoint):
    def load(model):
        loaded = model.load_weights(checkpoint_tensors(checkpoint))
        return sorted(loaded), sorted(name for name, _ in model.named_parameters())

    loaded, params = on_fresh_model(load)
    assert set(loaded) <= set(params)
    assert [
        name
        for name in params
        if name not in loaded and not name.endswith(KV_CACHE_PARAMETERS)
    ] == []


def test_a_tensor_without_a_home_is_an_error(on_fresh_model):
    # An expert past the last one the config declares.
    stray = (LAYERS + "1.mlp.experts.4.gate_proj.weight", torch.zeros(1))

    def load(model):
        try:
            model.load_weights(iter([stray]))
        except ValueError as exc:
            return str(exc)
        return None

    message = on_fresh_model(load)
    assert message is not None and "experts.4.gate_proj" in message


def test_a_shard_loaded_twice_is_an_error(on_fresh_model, checkpoint):
    def load(model):
        params = dict(model.named_parameters())
        first = next(
            (name, tensor)
            for name, tensor in checkpoint_tensors(checkpoint)
            if (loaded := loaded_as(model, params, name, tensor)) is not None
            and GoldenDeepseekV3ForCausalLM.param_for(loaded)[1] is not None
        )
        try:
            model.load_weights(iter([first, first]))
        except ValueError as exc:
            return str(exc)
        return None

    message = on_fresh_model(load)
    assert message is not None and "second time" in message


@pytest.mark.parametrize(
    "name",
    [
        LAYERS + "0.mlp.experts.3.gate_proj.weight",
        LAYERS + "0.self_attn.fused_qkv_a_proj_extra.weight",
        LAYERS + "0.cross_attn.k_proj.weight",
    ],
)
def test_stacked_mapping_matches_whole_module_paths(name):
    assert GoldenDeepseekV3ForCausalLM.param_for(name) == (name, None)


def test_quantized_tensors_load_where_their_weight_would(checkpoint):
    """qweight, qzeros, scales, ... of a module go to its parameter of that name, in its weight's shard."""
    names = [
        name
        for name, _ in checkpoint_tensors(checkpoint)
        if quantized(name) and not skipped(name) and not name.endswith(KV_CACHE_SCALES)
    ]
    assert not names, "the port was generated from a float checkpoint"
    for name in names:
        module, _, kind = name.rpartition(".")
        weight_param, shard = GoldenDeepseekV3ForCausalLM.param_for(f"{module}.weight")
        assert GoldenDeepseekV3ForCausalLM.param_for(name) == (
            weight_param.removesuffix("weight") + kind,
            shard,
        )


def test_experts_never_load_through_the_dense_mapping(on_fresh_model, checkpoint):
    """Every expert projection goes to FusedMoE's parameters, never to a dense gate/up."""
    names = [name for name, _ in checkpoint_tensors(checkpoint) if ".experts." in name]
    assert len(names) == 2 * EXPERTS * 3

    def route(model):
        return {
            name: (type(model).param_for(name), model.experts_for(name))
            for name in names
        }

    for name, (dense, experts) in on_fresh_model(route).items():
        assert dense == (name, None), (
            f"{name} is caught by the stacked mapping: {dense}"
        )
        # One physical expert per checkpoint expert: the engine here runs without EPLB replicas.
        assert len(experts) == 1, (name, experts)
        assert ".experts.routed_experts.w" in experts[0][0], (name, experts)
