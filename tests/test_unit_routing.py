"""detect/routing.py: how a mixture-of-experts block routes, read from its code (never run).

FusedMoE computes softmax, top-k (renormalized or not). A block that routes otherwise is refused by
name, wherever its code keeps the routing: the block, its router's class, or a helper function."""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers

from scaffold.detect.moe import correction_bias, expert_width_key, shared_class_width_expr, shared_width_expr
from scaffold.detect.routing import routing

MODELS = Path(transformers.__file__).parent / "models"


def transformers_source(model_type: str) -> dict[str, str]:
    path = MODELS / model_type / f"modeling_{model_type}.py"
    return {f"transformers/models/{model_type}/{path.name}": path.read_text(encoding="utf-8")}


@pytest.mark.parametrize("model_type", ["qwen3_moe", "mixtral", "qwen2_moe", "olmoe"])
def test_softmax_top_k_routing_is_what_fused_moe_computes(model_type):
    found = routing(transformers_source(model_type), "experts")
    assert found is not None and found.standard, found
    assert found.problem() is None


def test_phimoe_sparsemixer_is_named_with_its_line():
    found = routing(transformers_source("phimoe"), "experts")
    problem = found.problem()
    assert problem is not None and "without a top-k" in problem
    assert "sparsemixer (transformers/models/phimoe/modeling_phimoe.py:" in problem




LAB = '''
import torch
import torch.nn as nn


def pick_experts(logits, k):
    scores = logits.sigmoid()
    weights, chosen = scores.topk(k, dim=-1)
    return weights / weights.sum(-1, keepdim=True), chosen


class Scorer(nn.Module):
    def __init__(self, dim, n):
        super().__init__()
        self.proj = nn.Linear(dim, n, bias=False)

    def forward(self, x):
        return pick_experts(self.proj(x), 2)


class FfnBank(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.scorer = Scorer(cfg.d, cfg.n)
        self.bank = nn.ModuleList([nn.Linear(cfg.d, cfg.d) for _ in range(cfg.n)])

    def forward(self, x):
        weights, chosen = self.scorer(x)
        return sum(self.bank[i](x) for i in range(len(self.bank)))
'''


def test_a_labs_routing_under_its_own_names_is_followed_into_its_helper():
    found = routing({"modeling_lab.py": LAB}, "bank")
    assert found.block == "FfnBank"
    assert any(h.startswith("pick_experts (modeling_lab.py:") for h in found.helpers)
    # The sigmoid sits in the helper the router's forward calls: the router's scoring.
    assert found.problem() is None and found.scoring == "sigmoid" and "sigmoid" in found.router_calls


def test_scores_neither_softmax_nor_sigmoid_are_refused_by_name():
    found = routing({"modeling_lab.py": LAB.replace("logits.sigmoid()", "torch.nn.functional.softplus(logits)")},
                    "bank")
    assert "pick_experts (modeling_lab.py:" in found.problem() and "neither a softmax nor a sigmoid" in found.problem()


def test_the_same_lab_block_with_softmax_scores_ports():
    found = routing({"modeling_lab.py": LAB.replace("logits.sigmoid()", "logits.softmax(-1)")}, "bank")
    assert found.problem() is None


@pytest.mark.parametrize("division", [
    "weights / weights.norm(dim=-1, keepdim=True)",
    # the norm in a local of its own first, under another function's name
    "weights / (scale := torch.linalg.vector_norm(weights, dim=-1, keepdim=True))",
])
def test_a_labs_weights_divided_by_a_norm_are_refused(division):
    code = LAB.replace("weights / weights.sum(-1, keepdim=True)", division)
    assert code != LAB
    assert "divided by a norm" in routing({"modeling_lab.py": code}, "bank").problem()


def test_a_labs_norm_kept_in_a_local_is_followed_to_the_division():
    code = LAB.replace("    return weights / weights.sum(-1, keepdim=True), chosen\n",
                       "    l2 = torch.linalg.vector_norm(weights, dim=-1, keepdim=True)\n"
                       "    return weights / l2, chosen\n")
    assert code != LAB
    assert "(line 10: weights / l2)" in routing({"modeling_lab.py": code}, "bank").problem()


def _renormalize(code: str, config: dict) -> tuple[bool, str]:
    """moe_renormalize as the routing fields set it for the lab block `code`, with config.json `config`."""
    from scaffold.checkpoint import Checkpoint, TokenizerInfo
    from scaffold.detect.moe import _routing_fields
    from scaffold.spec import Spec

    ckpt = Checkpoint(Path("/lab"), config, {}, [], None, TokenizerInfo(), {"modeling_lab.py": code})
    spec = Spec()
    _routing_fields(spec, ckpt, routing(ckpt.sources, "bank"))
    return spec.moe_renormalize, spec.source("moe_renormalize").kind


# Jamba's order: scores, then the top-k of them, used as they are.
SCORES_THEN_TOPK = LAB.replace("    return weights / weights.sum(-1, keepdim=True), chosen\n",
                               "    return weights, chosen\n")


def test_top_k_weights_used_as_they_are_are_not_renormalized_whatever_config_json_says():
    assert SCORES_THEN_TOPK != LAB
    found = routing({"modeling_lab.py": SCORES_THEN_TOPK}, "bank")
    assert found.scores_then_topk and not found.divides and not found.softmax_after_topk
    # Neither the convention (no key) nor a norm_topk_prob the code never reads renormalizes them.
    assert _renormalize(SCORES_THEN_TOPK, {}) == (False, "code")
    assert _renormalize(SCORES_THEN_TOPK, {"norm_topk_prob": True}) == (False, "code")
    # Divided by their sum (the lab block as written): the convention stands.
    assert _renormalize(LAB, {}) == (True, "default")


def test_a_softmax_of_what_the_top_k_chose_sums_to_one():
    """Mixtral's order written as granitemoe does: the top-k of the logits, then a softmax over them."""
    code = LAB.replace("    scores = logits.sigmoid()\n    weights, chosen = scores.topk(k, dim=-1)\n"
                       "    return weights / weights.sum(-1, keepdim=True), chosen\n",
                       "    top, chosen = torch.topk(logits, k, dim=-1)\n"
                       "    return torch.softmax(top, dim=-1), chosen\n")
    assert code != LAB
    found = routing({"modeling_lab.py": code}, "bank")
    assert found.softmax_after_topk and not found.scores_then_topk and found.problem() is None
    assert _renormalize(code, {})[0] is True


@pytest.mark.parametrize(("model_type", "renormalized"), [("jamba", False), ("deepseek_v2", False),
                                                          ("granitemoe", True), ("mixtral", True)])
def test_transformers_top_k_weights_renormalized_or_not(model_type, renormalized):
    found = routing(transformers_source(model_type), "experts")
    taken_as_they_are = not found.divides and not found.softmax_after_topk and found.scores_then_topk
    assert taken_as_they_are is not renormalized


def test_no_class_owning_the_experts_says_nothing():
    assert routing({"modeling_lab.py": LAB}, "experts") is None
    assert routing({}, "experts") is None


def test_a_routers_own_methods_are_followed():
    """longcat_flash's router takes its top-k in a method of its own class, called as self.method(...)."""
    lab = LAB.replace("        return pick_experts(self.proj(x), 2)\n",
                      "        return self.choose(self.proj(x).softmax(-1))\n\n"
                      "    def choose(self, probs):\n        return probs.topk(2, dim=-1)\n")
    lab = lab.replace("    scores = logits.sigmoid()\n    weights, chosen = scores.topk(k, dim=-1)\n",
                      "    weights, chosen = logits, logits\n")
    found = routing({"modeling_lab.py": lab}, "bank")
    assert found.problem() is None, found
    assert routing({"modeling_lab.py": lab.replace("probs.topk(2, dim=-1)", "probs.max(-1)")}, "bank").problem()


# ----------------------------------------------------------- the DeepSeek-V3 routing, read from the code
DEEPSEEK_V3_FORM = ["glm4_moe", "dots1", "solar_open", "exaone_moe", "deepseek_v3"]


@pytest.mark.parametrize("model_type", DEEPSEEK_V3_FORM)
def test_sigmoid_grouped_top_k_with_a_correction_bias_is_read_with_its_config_keys(model_type):
    found = routing(transformers_source(model_type), "experts")
    assert found.problem() is None and found.scoring == "sigmoid"
    assert found.config_keys(found.divisor_attrs) == ["n_group"]
    assert found.config_keys(found.topk_attrs) == ["num_experts_per_tok", "topk_group"]
    assert found.config_keys(found.factor_attrs) == ["routed_scaling_factor"]
    assert found.config_keys(found.test_attrs) == ["norm_topk_prob"]
    assert "e_score_correction_bias" in found.attributes


def test_qwen2_moe_shared_expert_gate_sigmoid_is_not_the_routers_scoring():
    found = routing(transformers_source("qwen2_moe"), "experts")
    assert "sigmoid" in found.calls and found.scoring == "softmax"
    assert not found.divisor_attrs and "e_score_correction_bias" not in found.attributes


def test_ernie_correction_bias_is_read_inside_a_module_of_the_router():
    """Ernie 4.5's router adds the bias in a module of its own (moe_statics): softmax scores, no groups."""
    found = routing(transformers_source("ernie4_5_moe"), "experts")
    assert found.scoring == "softmax" and found.problem() is None
    assert "e_score_correction_bias" in found.attributes
    assert not found.divisor_attrs


@pytest.mark.parametrize(("model_type", "shared", "expr"), [
    ("glm4_moe", "shared_experts", "config.moe_intermediate_size * config.n_shared_experts"),
    ("exaone_moe", "shared_experts", "config.moe_intermediate_size * config.num_shared_experts"),
    ("ernie4_5_moe", "shared_experts", "config.moe_intermediate_size * config.moe_num_shared_experts"),
    ("qwen2_moe", "shared_expert", "config.shared_expert_intermediate_size"),
])
def test_shared_expert_width_is_the_codes_expression(model_type, shared, expr):
    found = shared_width_expr(transformers_source(model_type), shared)
    assert found is not None and found[0] == expr
    assert found[2].startswith(f"transformers/models/{model_type}/modeling_{model_type}.py:")


LAB_DSV3 = '''
import torch
import torch.nn as nn


class BankMLP(nn.Module):
    def __init__(self, config, width):
        super().__init__()
        self.gate_proj = nn.Linear(config.dim, width, bias=False)
        self.up_proj = nn.Linear(config.dim, width, bias=False)
        self.down_proj = nn.Linear(width, config.dim, bias=False)


class Chooser(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(config.banks, config.dim))
        self.tilt = nn.Parameter(torch.zeros(config.banks))
        self.shelves = config.bank_shelves
        self.shelves_kept = config.bank_shelves_kept
        self.per_token = config.banks_per_token
        self.boost = config.bank_boost
        self.even = config.bank_even
        self.banks = config.banks

    def forward(self, x):
        s = torch.sigmoid(x @ self.weight.t())
        pick = s + self.tilt
        shelf = pick.view(-1, self.shelves, self.banks // self.shelves).amax(-1)
        kept = torch.topk(shelf, k=self.shelves_kept, dim=-1)[1]
        chosen = torch.topk(pick, self.per_token, dim=-1)[1]
        w = s.gather(1, chosen)
        if self.even:
            w = w / w.sum(-1, keepdim=True)
        return w * self.boost, chosen


class Banked(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.chooser = Chooser(config)
        self.bank = nn.ModuleList([BankMLP(config, config.bank_width) for _ in range(config.banks)])
        self.always = BankMLP(config, width=config.bank_width * config.always_on)

    def forward(self, x):
        w, chosen = self.chooser(x)
        return self.always(x) + sum(self.bank[i](x) for i in range(len(self.bank)))
'''


def test_a_labs_deepseek_v3_routing_under_its_own_names_is_read():
    found = routing({"modeling_lab.py": LAB_DSV3}, "bank")
    assert found.block == "Banked" and found.problem() is None and found.scoring == "sigmoid"
    assert found.config_keys(found.divisor_attrs) == ["bank_shelves"]
    assert found.config_keys(found.topk_attrs) == ["bank_shelves_kept", "banks_per_token"]
    assert found.config_keys(found.factor_attrs) == ["bank_boost"]
    assert found.config_keys(found.test_attrs) == ["bank_even"]
    assert "tilt" in found.attributes


def test_a_labs_correction_bias_is_the_tensor_its_routing_reads():
    sources = {"modeling_lab.py": LAB_DSV3.replace('"bank"', '"experts"').replace("self.bank =", "self.experts =")}
    names = ("chooser.weight", "chooser.tilt", "chooser.unused_stat", "experts.0.gate_proj.weight")
    tensors = {f"ffn.{name}": None for name in names}
    claimed = {"ffn.chooser", "ffn.experts.0.gate_proj"}
    assert correction_bias(sources, tensors, "ffn", claimed)[0] == "chooser.tilt"
    # A tensor the routing does not read is no correction bias (it stays unconsumed, and is refused).
    del tensors["ffn.chooser.tilt"]
    assert correction_bias(sources, tensors, "ffn", claimed) is None


def test_a_labs_shared_expert_width_is_its_expression():
    line = next(i for i, text in enumerate(LAB_DSV3.splitlines(), 1) if "self.always =" in text)
    assert shared_width_expr({"modeling_lab.py": LAB_DSV3}, "always") == (
        "config.bank_width * config.always_on", ("bank_width", "always_on"), f"modeling_lab.py:{line}")


def test_a_shared_expert_built_without_a_width_takes_the_key_its_class_reads():
    """HunYuan-MoE builds its shared_mlp as the dense MLP class (config.intermediate_size inside)."""
    source = transformers_source("hunyuan_v1_moe")
    assert shared_width_expr(source, "shared_mlp") is None
    assert expert_width_key(source, "shared_mlp", {"intermediate_size": 256, "moe_intermediate_size": 64}) \
        == "intermediate_size"


def test_a_switch_that_guards_no_division_is_not_the_renormalization():
    """HY-V3 renormalizes always; its block's `if self.enable_moe_fp32_combine:` only casts the shared expert's
    sum (it was read as the renormalization switch, and the port renormalized by that flag)."""
    found = routing(transformers_source("hy_v3"), "experts")
    assert found.problem() is None and found.scoring == "sigmoid"
    assert found.config_keys(found.test_attrs) == []
    assert found.config_keys(found.factor_attrs) == ["router_scaling_factor"]


def test_a_correction_bias_the_checkpoint_keeps_under_another_name_is_found_by_transformers_renaming():
    """HY-V3's checkpoints keep mlp.expert_bias; transformers loads it as mlp.e_score_correction_bias."""
    tensors = {"mlp.expert_bias": None, "mlp.router.gate.weight": None, "mlp.experts.0.gate_proj.weight": None}
    claimed = {"mlp.router.gate", "mlp.experts.0.gate_proj"}
    source = transformers_source("hy_v3")
    assert correction_bias(source, tensors, "mlp", claimed) is None  # under the checkpoint's name: not read

    def code(rest):
        return rest.replace("mlp.expert_bias", "mlp.e_score_correction_bias")
    name, why = correction_bias(source, tensors, "mlp", claimed, code)
    assert name == "expert_bias" and "reads e_score_correction_bias" in why and "checkpoint's expert_bias" in why


def test_aria_shared_experts_width_is_the_expression_its_class_builds_with():
    """Aria builds its shared experts from the config alone; the class sizes them
    config.intermediate_size * config.moe_num_shared_experts (one key alone would read half the width)."""
    found = shared_class_width_expr(transformers_source("aria"), "shared_experts")
    assert found is not None and found[:2] == ("config.intermediate_size * config.moe_num_shared_experts",
                                               ("intermediate_size", "moe_num_shared_experts"))
    assert found[2].startswith("transformers/models/aria/modeling_aria.py:")
    # HunYuan-MoE's dense MLP class: the one key, as before.
    assert shared_class_width_expr(transformers_source("hunyuan_v1_moe"), "shared_mlp")[:2] == (
        "config.intermediate_size", ("intermediate_size",))


LAB_INPUT_WEIGHTED = '''
import torch
import torch.nn as nn


class Chooser(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w = nn.Linear(cfg.d, cfg.n, bias=False)

    def forward(self, x):
        logits = self.w(x)
        top, idx = logits.topk(1, dim=-1)
        return torch.sigmoid(top), idx


class Bank(nn.Module):
    def forward(self, x, idx):
        return x


class SparseFfn(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.chooser = Chooser(cfg)
        self.bank = Bank(cfg)

    def forward(self, x):
        gates, idx = self.chooser(x)
        BODY
'''


@pytest.mark.parametrize(("body", "line"), [
    # The input scaled by the router's scores before the experts (Llama 4's form, under a lab's names).
    ("scaled = x * gates\n        return self.bank(scaled, idx)", 30),
    ("x = x.repeat(1, 1)\n        x *= gates\n        y = x.view(-1)\n        return self.bank(y, idx)", 31),
    ("return self.bank(gates * x, idx)", 30),
    # The experts' outputs weighted (what FusedMoE computes), or the input indexed by the choice: no problem.
    ("return self.bank(x, idx) * gates", None),
    ("picked = x[idx]\n        return self.bank(picked, idx) * gates", None),
    ("out = self.bank(x, idx)\n        out = out * gates\n        return self.bank(out, idx)", 31),
])
def test_routing_weights_applied_to_the_experts_input_are_refused_by_name(body, line):
    found = routing({"modeling_lab.py": LAB_INPUT_WEIGHTED.replace("BODY", body)}, "bank")
    assert found is not None and found.block == "SparseFfn"
    if line is None:
        assert found.weighted_input is None and found.problem() is None, found.weighted_input
    else:
        assert found.weighted_input.startswith(f"modeling_lab.py:{line}:"), found.weighted_input
        # FusedMoE applies the weights to the input (apply_router_weight_on_input) for one expert per token only.
        assert found.problem(1) is None
        assert found.problem(2).startswith("routing weights applied to the experts' input: SparseFfn (modeling_lab.py:")
        assert "with 2 experts per token" in found.problem(2)


def test_llama4_weights_its_experts_input():
    found = routing(transformers_source("llama4"), "experts")
    assert "routed_in * router_scores" in found.weighted_input
    assert found.weighted_input.startswith("transformers/models/llama4/modeling_llama4.py:")
    # Sigmoid of the top-k logits, no division anywhere on the path: not renormalized.
    assert found.scoring == "sigmoid" and found.standard and not found.divides
    assert found.problem(1) is None and "apply_router_weight_on_input" in found.problem(2)


def test_a_lab_that_divides_its_input_weights_says_so():
    body = "gates = gates / gates.sum(-1, keepdim=True)\n        return self.bank(x * gates, idx)"
    found = routing({"modeling_lab.py": LAB_INPUT_WEIGHTED.replace("BODY", body)}, "bank")
    assert found.weighted_input and found.divides
