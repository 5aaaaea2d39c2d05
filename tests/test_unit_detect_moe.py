"""detect/moe.py (with layout's MoE names): experts, router, shared expert and dense layers."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from ckpt_factory import Shape
from helpers import detect_until, moe_tensors, read

from scaffold.detect import moe

# The installed transformers' folder, found without importing it (that costs each test worker ~4 s).
TRANSFORMERS = Path(importlib.util.find_spec("transformers").submodule_search_locations[0])
from scaffold.errors import CheckpointError, UnsupportedArchitecture

MOE_CONFIG = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": False}


def test_experts_router_and_sizes(tmp_path):
    shape = Shape(layers=3, extra=MOE_CONFIG)
    spec = detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32, dense_layers=(1,))),
                        moe)
    assert spec.is_moe and spec.num_experts == 4 and spec.num_experts_per_tok == 2
    assert spec.moe_intermediate_size == 32 and spec.moe_renormalize is False
    assert spec.dense_layers == [1] and spec.sparse_layers == [0, 2]
    assert (spec.names["router"], spec.names["expert_gate_proj"], spec.names["expert_down_proj"]) == (
        "gate", "gate_proj", "down_proj")
    assert "shared_expert" not in spec.names and spec.shared_expert_intermediate_size == 0


def test_a_shared_expert_and_its_gate(tmp_path):
    shape = Shape(layers=2, extra={**MOE_CONFIG, "shared_expert_intermediate_size": 48})
    spec = detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32, shared=48)), moe)
    assert spec.names["shared_expert"] == "shared_expert" and spec.names["shared_expert_gate"] == "shared_expert_gate"
    assert spec.shared_expert_intermediate_size == 48 and spec.dense_layers == []


def test_more_experts_in_the_tensors_than_the_config_declares_are_refused(tmp_path):
    shape = Shape(layers=2, extra=MOE_CONFIG)
    tensors = moe_tensors(shape, experts=4, inter=32)
    for layer in range(2):
        tensors[f"model.layers.{layer}.mlp.experts.4.gate_proj.weight"] = [32, 64]
        tensors[f"model.layers.{layer}.mlp.experts.4.up_proj.weight"] = [32, 64]
        tensors[f"model.layers.{layer}.mlp.experts.4.down_proj.weight"] = [64, 32]
    with pytest.raises(CheckpointError, match="experts.4.down_proj.weight is an expert past the 4 that config.json"):
        detect_until(read(tmp_path, shape, tensors=tensors), moe)


def test_routing_to_more_experts_than_exist_is_refused(tmp_path):
    shape = Shape(layers=2, extra={**MOE_CONFIG, "num_experts_per_tok": 5})
    with pytest.raises(CheckpointError, match="routes each token to 5 of 4 experts"):
        detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32)), moe)


def test_a_dense_model_has_no_experts(tmp_path):
    spec = detect_until(read(tmp_path), moe)
    assert not spec.is_moe and spec.num_experts == 0 and spec.sparse_layers == []


def _transformers_source(model_type: str) -> dict[str, str]:
    path = TRANSFORMERS / "models" / model_type / f"modeling_{model_type}.py"
    return {path.name: path.read_text(encoding="utf-8")}


@pytest.mark.parametrize("model_type, key", [
    ("cohere2_moe", "intermediate_size"),  # its config class also carries moe_intermediate_size, unread
    ("qwen3_moe", "moe_intermediate_size"),
    ("mixtral", "intermediate_size"),
])
def test_expert_width_key_is_the_one_the_experts_code_reads(model_type, key):
    config = {"intermediate_size": 256, "moe_intermediate_size": 64}
    assert moe.expert_width_key(_transformers_source(model_type), "experts", config) == key


def test_expert_width_key_from_a_module_list_of_mlps():
    lab = ("import torch.nn as nn\n\nclass Mlp(nn.Module):\n    def __init__(self, config, intermediate_size):\n"
           "        super().__init__()\n\nclass Moe(nn.Module):\n    def __init__(self, config):\n"
           "        super().__init__()\n        self.experts = nn.ModuleList(\n"
           "            [Mlp(config, intermediate_size=config.expert_ffn) for _ in range(config.n_exp)])\n")
    assert moe.expert_width_key({"m.py": lab}, "experts", {"expert_ffn": 32, "intermediate_size": 64}) == "expert_ffn"
    assert moe.expert_width_key({"m.py": lab}, "experts", {"intermediate_size": 64}) is None  # key not in config.json


def _router_at(tensors: dict, path: str) -> dict:
    """The tensors with each layer's router (mlp.gate.weight) kept at mlp.<path>.weight instead."""
    return {name.replace(".mlp.gate.weight", f".mlp.{path}.weight"): dims for name, dims in tensors.items()}


@pytest.mark.parametrize("path, port", [("gate.wg", "wg"),  # HunYuan-MoE
                                        ("router.gate", "gate")])  # AfMoE, HY-V3
def test_a_router_kept_one_module_deeper_is_the_blocks_router(tmp_path, path, port):
    from scaffold.spec import port_names, renamed_suffixes

    shape = Shape(layers=2, extra=MOE_CONFIG)
    spec = detect_until(read(tmp_path, shape, tensors=_router_at(moe_tensors(shape, experts=4, inter=32), path)),
                        moe)
    assert spec.names["router"] == path and port_names(spec.names)["router"] == port
    # The port keeps the last component and maps the checkpoint's whole name onto it on load.
    assert renamed_suffixes(spec) == {f".mlp.{path}.weight": f".mlp.{port}.weight"}


@pytest.mark.parametrize("path", [
    "scorer.wg",  # a module not named gate or router
    "gates.wg",  # `gate` only as a substring of the module's name
    "my_router.gate",
    "gate.inner.wg",  # two modules deeper
])
def test_a_router_shaped_tensor_elsewhere_in_the_block_is_refused(tmp_path, path):
    shape = Shape(layers=2, extra=MOE_CONFIG)
    ckpt = read(tmp_path, shape, tensors=_router_at(moe_tensors(shape, experts=4, inter=32), path))
    with pytest.raises(UnsupportedArchitecture, match=rf"has experts but no router .*mlp\.{re.escape(path)}\.weight "
                                                      "has a router's shape"):
        detect_until(ckpt, moe)


def test_two_router_shaped_linears_inside_the_gate_are_refused(tmp_path):
    shape = Shape(layers=2, extra=MOE_CONFIG)
    tensors = _router_at(moe_tensors(shape, experts=4, inter=32), "gate.wg")
    tensors.update({name.replace("gate.wg", "gate.wk"): dims for name, dims in tensors.items() if "gate.wg" in name})
    with pytest.raises(UnsupportedArchitecture, match=r"several tensors shaped as its router \(mlp\.gate\.wg\.weight, "
                                                      r"mlp\.gate\.wk\.weight\)"):
        detect_until(read(tmp_path, shape, tensors=tensors), moe)


def test_a_top_k_per_layer_is_refused_by_name(tmp_path):
    """HunYuan-MoE's config may give moe_topk as a list, one per layer."""
    config = {k: v for k, v in MOE_CONFIG.items() if k != "num_experts_per_tok"}
    shape = Shape(layers=2, extra={**config, "moe_topk": [2, 1]})
    with pytest.raises(UnsupportedArchitecture, match=r"a per-layer MoE top-k \(config.json moe_topk is a list of 2"):
        detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32)), moe)


def test_a_top_k_under_hunyuans_key_is_read(tmp_path):
    config = {k: v for k, v in MOE_CONFIG.items() if k != "num_experts_per_tok"}
    shape = Shape(layers=2, extra={**config, "moe_topk": 1})
    spec = detect_until(read(tmp_path, shape, tensors=moe_tensors(shape, experts=4, inter=32)), moe)
    assert spec.num_experts_per_tok == 1 and spec.source("num_experts_per_tok").expr == "config.moe_topk"


def stacked_tensors(shape, *, experts: int, bias: bool = False) -> dict[str, list[int]]:
    """A Mixtral (transformers 5) layout of a ckpt_factory Shape: each layer's experts as one 3-D tensor per
    projection, mlp.experts.gate_up_proj [experts, 2 x width, hidden] and mlp.experts.down_proj."""
    from ckpt_factory import tensors_for

    h, inter = shape.hidden, shape.intermediate
    out = {}
    for name, dims in tensors_for(shape).items():
        if ".mlp." not in name:
            out[name] = dims
        elif name.endswith("mlp.gate_proj.weight"):
            mlp = name.removesuffix(".gate_proj.weight")
            out[f"{mlp}.gate.weight"] = [experts, h]
            out[f"{mlp}.experts.gate_up_proj"] = [experts, 2 * inter, h]
            out[f"{mlp}.experts.down_proj"] = [experts, h, inter]
            if bias:
                out[f"{mlp}.experts.gate_up_proj_bias"] = [experts, 2 * inter]
    return out


STACKED_CONFIG = {"num_local_experts": 4, "num_experts_per_tok": 2}


def test_experts_stored_3d_are_read_with_the_gate_half_the_code_activates(tmp_path):
    from scaffold import mapping

    shape = Shape(layers=2, model_type="mixtral", extra=STACKED_CONFIG)
    ckpt = read(tmp_path, shape, tensors=stacked_tensors(shape, experts=4))
    spec = detect_until(ckpt, moe)
    assert spec.experts_layout == "stacked" and spec.expert_gate_up_order == "gate_first"
    assert spec.source("expert_gate_up_order").kind == "code"
    assert (spec.names["stacked_gate_up"], spec.names["stacked_down"], spec.names["router"]) == (
        "experts.gate_up_proj", "experts.down_proj", "gate")
    assert spec.num_experts == 4 and spec.moe_intermediate_size == shape.intermediate
    rows, homeless = mapping.weight_table(spec, ckpt)
    assert homeless == []
    got = [(r.param, r.shard) for r in rows if r.checkpoint == "model.layers.1.mlp.experts.gate_up_proj"]
    w13 = "model.layers.1.mlp.experts.routed_experts.w13_weight"
    assert got == [(w13, (e, s)) for e in range(4) for s in ("w1", "w3")]
    got = [(r.param, r.shard) for r in rows if r.checkpoint == "model.layers.0.mlp.experts.down_proj"]
    assert got == [("model.layers.0.mlp.experts.routed_experts.w2_weight", (e, "w2")) for e in range(4)]


def test_a_3d_expert_tensor_of_the_wrong_shape_is_refused(tmp_path):
    shape = Shape(layers=2, model_type="mixtral", extra=STACKED_CONFIG)
    tensors = stacked_tensors(shape, experts=4)
    tensors["model.layers.1.mlp.experts.down_proj"] = [4, shape.hidden, shape.intermediate + 1]
    with pytest.raises(CheckpointError, match=rf"experts.down_proj has shape \[4, 64, {shape.intermediate + 1}\]"):
        detect_until(read(tmp_path, shape, tensors=tensors), moe)


def test_biased_3d_experts_are_refused_by_name(tmp_path):
    shape = Shape(layers=2, model_type="mixtral", extra=STACKED_CONFIG)
    with pytest.raises(UnsupportedArchitecture, match=r"biased experts \(model.layers.0.mlp.experts.gate_up_proj_bias"):
        detect_until(read(tmp_path, shape, tensors=stacked_tensors(shape, experts=4, bias=True)), moe)


@pytest.mark.parametrize("model_type, gate_up, problem", [
    ("granitemoe", "gate_up_proj", None),
    ("mixtral", "gate_up_proj", None),
    ("llama4", "gate_up_proj", None),
    ("aria", "gate_up_proj", None),
])
def test_the_experts_code_says_which_half_is_the_gate_or_what_the_port_lacks(model_type, gate_up, problem):
    from scaffold.detect import stacked

    read_code = stacked.experts_code(_transformers_source(model_type), ("down_proj", "gate_up_proj"))
    assert read_code is not None
    if problem is None:
        assert read_code.gate_up == gate_up and read_code.problem is None and read_code.up_first is False and ".chunk(2)" in read_code.evidence
        # Llama 4 (torch.bmm(x, self.gate_up_proj)) and Aria (x @ self.gate_up_proj[e]) store [in, out].
        assert read_code.in_out is (model_type in ("llama4", "aria")), read_code.storage_evidence
        assert f"modeling_{model_type}.py:" in read_code.storage_evidence
    else:
        assert re.search(problem, read_code.problem)


LAB_EXPERTS = '''import torch.nn as nn
import torch.nn.functional as F

class Experts(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(4, 8, 4))
        self.w_out = nn.Parameter(torch.empty(4, 4, 4))

    def forward(self, x, idx):
        up, gate = F.linear(x, self.w_in[idx]).chunk(2, dim=-1)
        return F.linear(PRODUCT, self.w_out[idx])
'''


@pytest.mark.parametrize("product, up_first", [("self.act(gate) * up", True), ("up * self.act(gate)", True),
                                                ("self.act(up) * gate", False)])
def test_the_gate_is_the_half_the_activation_takes(product, up_first):
    from scaffold.detect import stacked

    read_code = stacked.experts_code({"m.py": LAB_EXPERTS.replace("PRODUCT", product)}, ("w_in", "w_out"))
    assert (read_code.gate_up, read_code.down, read_code.up_first) == ("w_in", "w_out", up_first)


def test_halves_no_product_tells_apart_are_not_guessed():
    from scaffold.detect import stacked

    with pytest.raises(ValueError, match="no one product act\\(gate\\) \\* up"):
        stacked.experts_code({"m.py": LAB_EXPERTS.replace("PRODUCT", "up + gate")}, ("w_in", "w_out"))


LAB_IN_OUT = '''import torch
import torch.nn as nn

class RoutedFFN(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.wi = nn.Parameter(torch.empty(4, 4, 8))
        self.wo = nn.Parameter(torch.empty(4, 4, 4))

    def forward(self, h, e):
        proj = torch.matmul(h, self.wi[e])
        lin, act = proj.chunk(2, dim=-1)
        return MULTIPLY_OUT
'''


@pytest.mark.parametrize("out, in_out, problem", [
    ("torch.matmul(lin * nn.functional.gelu(act), self.wo[e])", True, None),
    ("(nn.functional.gelu(act) * lin) @ self.wo[e]", True, None),
    ("self.wo[e] @ (lin * nn.functional.gelu(act))", None, r"self.wo multiplied as the left-hand matrix, m.py:13"),
    ("torch.einsum('td,df->tf', lin * nn.functional.gelu(act), self.wo[e])", None,
     r"self.wo multiplied through einsum, whose operand order"),
    ("nn.functional.linear(lin * nn.functional.gelu(act), self.wo[e])", None,
     r"as F.linear weights \(\[out, in\]\) and as right-hand matrices"),
])
def test_experts_multiplied_as_right_hand_matrices_are_stored_in_out(out, in_out, problem):
    """A lab's experts under other names: torch.matmul(h, self.wi[e]) takes each expert [in, out]; the second
    half (act) is the gate. Any other operand order, or the two tensors taken differently, is named."""
    from scaffold.detect import stacked

    read_code = stacked.experts_code({"m.py": LAB_IN_OUT.replace("MULTIPLY_OUT", out)}, ("wi", "wo"))
    if problem is None:
        assert (read_code.gate_up, read_code.down, read_code.up_first, read_code.in_out) == ("wi", "wo", True, True)
        assert read_code.problem is None and read_code.storage_evidence.startswith("m.py:11, 13: x @ self.W[e]")
    else:
        assert re.search(problem, read_code.problem), read_code.problem


LAB_LAYER = '''
class Block(nn.Module):
    def forward(self, x, cache=None):
        h = x + self.mixer(self.ln_1(x))
        y = self.ln_2(h)
        BODY
'''


@pytest.mark.parametrize("body, summed", [
    # GraniteMoE-Shared's form under a lab's names: the dense MLP's output added to the MoE block's.
    ("routed, logits = self.sparse(y)\n        dense = self.always_on(y)\n        return h + (routed + dense)", 8),
    ("return h + (self.always_on(y) + self.sparse(y))", 6),
    ("out = self.sparse(y)\n        out += self.always_on(y)\n        return h + out", 7),
    ("out = self.sparse(y)\n        out.add_(self.always_on(y))\n        return h + out", 7),
    # Read strictly: each added to the residual on its own is not read as the one sum (refused, not guessed).
    ("return h + self.always_on(y) + self.sparse(y)", None),
    # Scaled, gated, or used twice: not the sum the port computes.
    ("return h + self.sparse(y) + 0.5 * self.always_on(y)", None),
    ("dense = self.always_on(y)\n        return h + self.sparse(y) + dense * dense.sigmoid()", None),
    ("return h + self.sparse(y) + self.always_on(y) + self.always_on(h)", None),
])
def test_a_shared_mlp_on_the_layer_is_the_one_summed_with_the_block(body, summed):
    import ast as ast_

    forward = ast_.parse(LAB_LAYER.replace("BODY", body)).body[0].body[0]
    assert moe._summed_with_block(forward, "always_on", "sparse") == summed


@pytest.mark.parametrize("model_type, interleaved", [("gpt_oss", True), ("minimax_m3_vl", False)])
def test_gpt_oss_and_minimax_experts_compute_vllms_swigluoai(model_type, interleaved):
    """GPT-OSS cuts gate and up as even and odd columns, MiniMax-M3 as halves; both clamp, then
    (up + 1) * gate * sigmoid(alpha * gate), with alpha and the limit read from the config."""
    from scaffold.detect import stacked

    config = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}
    read_code = stacked.experts_code(_transformers_source(model_type), ("down_proj", "gate_up_proj"), config)
    assert read_code.problem is None and read_code.interleaved is interleaved
    assert read_code.swigluoai.alpha == (1.702, "config.swiglu_alpha")
    assert read_code.swigluoai.limit == (7.0, "config.swiglu_limit")
    # Another limit in the config: not what vLLM's kernel computes, named with the values read.
    read_code = stacked.experts_code(_transformers_source(model_type), ("down_proj", "gate_up_proj"),
                                     {**config, "swiglu_limit": 10.0})
    assert "not vLLM's swigluoai" in read_code.problem and "config.swiglu_limit (10)" in read_code.problem


LAB_CLAMPED = '''import torch
import torch.nn as nn
import torch.nn.functional as F

class FfnBank(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(4, 8, 4))
        self.w_out = nn.Parameter(torch.empty(4, 4, 4))
        self.cap = config.glu_cap
        self.beta = 1.702

    def forward(self, x, e):
        h = F.linear(x, self.w_in[e])
        CUT
        BODY
        return F.linear(out, self.w_out[e])
'''


@pytest.mark.parametrize("cut, body, interleaved, problem", [
    ("a, b = h.chunk(2, dim=-1)",
     ("a = torch.clamp(a, max=self.cap)\n        b = b.clip(-self.cap, self.cap)\n"
      "        out = (1 + b) * (a * F.sigmoid(self.beta * a))"), False, None),
    ("b, a = h[..., 1::2], h[..., ::2]",
     ("a = a.clamp(min=None, max=self.cap)\n        b = torch.clamp(b, min=-self.cap, max=self.cap)\n"
      "        glu = a * torch.sigmoid(a * self.beta)\n        out = glu * (b + 1.0)"), True, None),
    # No +1 on the up half, a gate clamped from below too, the halves swapped: other formulas, refused.
    ("a, b = h.chunk(2, dim=-1)",
     "a = a.clamp(max=self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = b * a * torch.sigmoid(self.beta * a)",
     False, "its values differ from swigluoai's"),
    ("a, b = h.chunk(2, dim=-1)",
     ("a = a.clamp(-self.cap, self.cap)\n        b = b.clamp(-self.cap, self.cap)\n"
      "        out = (b + 1) * a * torch.sigmoid(self.beta * a)"), False, "its values differ"),
    ("b, a = h.chunk(2, dim=-1)",
     "a = a.clamp(max=self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = (b + 1) * a * torch.sigmoid(self.beta * a)",
     False, "its values differ"),
    # silu with the +1: neither swigluoai (alpha 1) nor HY-V4's clamped SiLU (no +1): both differences named.
    ("a, b = h.chunk(2, dim=-1)",
     "a = a.clamp(max=self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = (b + 1) * F.silu(a)",
     False, "nor is it silu(gate.clamp(max=L)) * up.clamp(-L, L)"),
    # An operation the reader does not follow is named, not guessed.
    ("a, b = h.chunk(2, dim=-1)",
     "a = a.clamp(max=self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = (b + 1) * F.gelu(a)",
     False, "the gate computes F.gelu"),
])
def test_a_labs_clamped_swiglu_is_read_by_what_it_computes(cut, body, interleaved, problem):
    from scaffold.detect import stacked

    source = LAB_CLAMPED.replace("CUT", cut).replace("BODY", body)
    read_code = stacked.experts_code({"m.py": source}, ("w_in", "w_out"), {"glu_cap": 7.0})
    if problem is None:
        assert read_code.problem is None, read_code.problem
        assert (read_code.gate_up, read_code.interleaved, read_code.in_out) == ("w_in", interleaved, False)
        assert read_code.swigluoai.limit == (7.0, "config.glu_cap") and read_code.swigluoai.alpha == (1.702, "1.702")
    else:
        assert problem in read_code.problem, read_code.problem


# ------------------------------------------------------------ experts computing a clamped SiLU (HY-V4's)
@pytest.mark.parametrize("model_type", ["hy_v4", "glm5_next"])
def test_hy_v4_and_glm5_next_experts_compute_a_clamped_silu(model_type):
    """silu(gate.clamp(max=L)) * up.clamp(-L, L) on halves of gate_up_proj, L = config.swiglu_limit: not
    swigluoai (no alpha, no +1), read as its own form, whichever limit the config holds."""
    from scaffold.detect import stacked

    for limit in (10.0, 0.5):
        config = {"num_local_experts": 4, "hidden_size": 64, "moe_intermediate_size": 32, "swiglu_limit": limit}
        read_code = stacked.experts_code(_transformers_source(model_type), ("down_proj", "gate_up_proj"), config)
        assert read_code.problem is None, read_code.problem
        assert read_code.swigluoai is None and read_code.clamped_silu.limit == (limit, "config.swiglu_limit")
        assert (read_code.gate_up, read_code.up_first, read_code.interleaved) == ("gate_up_proj", False, False)


@pytest.mark.parametrize("cut, body, problem", [
    # Other names, torch.clamp with a positional bound, silu written as a * sigmoid(a), the bound a config key of
    # its own.
    ("a, b = h.chunk(2, dim=-1)",
     "a = torch.clamp(a, max=self.cap)\n        b = b.clip(-self.cap, self.cap)\n        out = a * torch.sigmoid(a) * b",
     None),
    # F.silu over the clamped gate inline, the up half clamped after the product is formed: the same values.
    ("a, b = h.chunk(2, dim=-1)",
     "out = F.silu(a.clamp(max=self.cap)) * torch.clamp(b, min=-self.cap, max=self.cap)", None),
    # silu clamped after the activation (vLLM's SwigluStepAndMul), the up half unclamped, the gate clamped from
    # below too, the halves swapped: other formulas, refused with the difference.
    ("a, b = h.chunk(2, dim=-1)",
     "a = F.silu(a).clamp(max=self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = a * b",
     "nor is it silu(gate.clamp(max=L)) * up.clamp(-L, L)"),
    ("a, b = h.chunk(2, dim=-1)", "a = a.clamp(max=self.cap)\n        out = F.silu(a) * b",
     "nor is it silu(gate.clamp(max=L))"),
    ("a, b = h.chunk(2, dim=-1)",
     "a = a.clamp(-self.cap, self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = F.silu(a) * b",
     "nor is it silu(gate.clamp(max=L))"),
    ("b, a = h.chunk(2, dim=-1)",
     "a = a.clamp(max=self.cap)\n        b = b.clamp(-self.cap, self.cap)\n        out = F.silu(a) * b",
     "nor is it silu(gate.clamp(max=L))"),
])
def test_a_labs_clamped_silu_is_read_by_what_it_computes(cut, body, problem):
    from scaffold.detect import stacked

    source = LAB_CLAMPED.replace("CUT", cut).replace("BODY", body)
    read_code = stacked.experts_code({"m.py": source}, ("w_in", "w_out"), {"glu_cap": 0.75})
    if problem is None:
        assert read_code.problem is None, read_code.problem
        assert read_code.clamped_silu.limit == (0.75, "config.glu_cap") and read_code.swigluoai is None
    else:
        assert read_code.clamped_silu is None and problem in read_code.problem, read_code.problem


def test_a_clamped_silu_inside_the_loop_over_the_experts_is_read():
    """The lab checkpoint's experts (tests/clamped_experts_ckpt.py): the cut and the formula inside the loop over
    the experts, the bound in config.expert_clip; the number of experts, another number the class reads, is not
    taken for the bound."""
    from clamped_experts_ckpt import LAB_EXPERTS

    from scaffold.detect import stacked

    # The bound's key renamed so that config.num_experts (also 4) is tried first.
    source = "import torch\nfrom torch import nn\n\n\n" + LAB_EXPERTS.replace("config.expert_clip", "config.x_clip")
    config = {"num_experts": 4, "moe_intermediate_size": 64, "hidden_size": 128, "x_clip": 4.0}
    read_code = stacked.experts_code({"m.py": source}, ("gate_up_proj", "down_proj"), config)
    assert read_code.problem is None, read_code.problem
    assert read_code.clamped_silu.limit == (4.0, "config.x_clip")


# ------------------------------------------------------------ a shared expert computing a clamped SwiGLU
def _dense_class(source: dict[str, str], name: str):
    from scaffold.detect import sourcecode

    return sourcecode._classes(source)[name]


def test_minimax_m3_shared_experts_compute_swigluoai_with_the_configs_alpha_and_limit():
    """MiniMax-M3's dense MLP (its shared experts) cuts one gate_up_proj in halves and computes the experts'
    clamped SwiGLU before down_proj: vLLM's SwigluOAIAndMul, which takes alpha and limit as arguments, so
    another alpha or limit in the config is read, not refused."""
    from scaffold.detect import gluformula, stacked

    for alpha, limit in ((1.702, 7.0), (1.5, 10.0)):
        config = {"swiglu_alpha": alpha, "swiglu_limit": limit}
        file, cls = _dense_class(_transformers_source("minimax_m3_vl"), "MiniMaxM3VLDenseMLP")
        read = gluformula.dense_swigluoai(cls, file, stacked._init_values(cls, config), "down_proj")
        assert isinstance(read, gluformula.SwigluOai), read
        assert read.alpha == (alpha, "config.swiglu_alpha") and read.limit == (limit, "config.swiglu_limit")


LAB_DENSE = '''import torch
import torch.nn as nn
import torch.nn.functional as F

class AlwaysOnFfn(nn.Module):
    def __init__(self, config, width):
        super().__init__()
        self.wi = nn.Linear(config.d_model, 2 * width, bias=False)
        self.wo = nn.Linear(width, config.d_model, bias=False)
        self.steep = config.glu_steepness
        self.cap = 6.5

    def forward(self, x):
        CUT
        BODY
        return self.wo(out)
'''


@pytest.mark.parametrize("cut, body, problem", [
    # Other names, torch.clamp and F.sigmoid, the limit a number in the code, alpha from another config key.
    ("g, u = self.wi(x).chunk(2, dim=-1)",
     ("g = torch.clamp(g, max=self.cap)\n        u = u.clip(-self.cap, self.cap)\n"
      "        out = (1.0 + u) * g * F.sigmoid(self.steep * g)"), None),
    # No +1 on the up half: another formula, named with its difference.
    ("g, u = self.wi(x).chunk(2, dim=-1)",
     "g = g.clamp(max=self.cap)\n        u = u.clamp(-self.cap, self.cap)\n        out = u * g * torch.sigmoid(self.steep * g)",
     "its values differ from swigluoai's"),
    # Halves swapped (up first): the port's fused gate_up reads the gate first; refused, not guessed.
    ("u, g = self.wi(x).chunk(2, dim=-1)",
     "g = g.clamp(max=self.cap)\n        u = u.clamp(-self.cap, self.cap)\n        out = (u + 1) * g * torch.sigmoid(self.steep * g)",
     "its values differ"),
    # Two projections, no cut: not the form the reader follows.
    ("g = self.wi(x)\n        u = self.wi(x)",
     "g = g.clamp(max=self.cap)\n        out = (u + 1) * g * torch.sigmoid(self.steep * g)",
     "not one projection's output cut in halves"),
])
def test_a_labs_clamped_dense_mlp_is_read_by_what_it_computes(cut, body, problem):
    from scaffold.detect import gluformula, stacked

    source = {"lab/modeling_lab.py": LAB_DENSE.replace("CUT", cut).replace("BODY", body)}
    file, cls = _dense_class(source, "AlwaysOnFfn")
    read = gluformula.dense_swigluoai(cls, file, stacked._init_values(cls, {"glu_steepness": 2.5}), "wo")
    if problem is None:
        assert isinstance(read, gluformula.SwigluOai), read
        assert read.alpha == (2.5, "config.glu_steepness") and read.limit == (6.5, "6.5")
    else:
        assert isinstance(read, str) and problem in read and read.startswith("lab/modeling_lab.py:"), read
