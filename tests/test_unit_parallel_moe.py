"""Routed experts beside the dense MLP in each decoder layer (Gemma 4's enable_moe_block), read from what the code
computes (scaffold.detect.parallelmoe): the layer's sum of the dense MLP and the experts with their norms, what the
experts and the router read, the router's forward over numbers compared with vLLM's Gemma 4 router, the experts'
halves and activation; on transformers' file and on a lab's module written otherwise; other forms refused naming
what differs."""

from __future__ import annotations

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import forms, parallelmoe
from scaffold.detect.formcode import _decoder_layer

HIDDEN, EXPERTS, WIDTH = 128, 4, 64
GEMMA4 = {"hidden_size": HIDDEN, "num_experts": EXPERTS, "top_k_experts": 2, "moe_intermediate_size": WIDTH,
          "intermediate_size": 256, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
          "enable_moe_block": True, "hidden_size_per_layer_input": 0, "num_hidden_layers": 2,
          "num_kv_shared_layers": 0, "use_double_wide_mlp": False, "attention_k_eq_v": False}
GEMMA4_TENSORS = {"experts.gate_up_proj": (EXPERTS, 2 * WIDTH, HIDDEN), "experts.down_proj": (EXPERTS, HIDDEN, WIDTH),
                  "router.proj.weight": (EXPERTS, HIDDEN), "router.scale": (HIDDEN,),
                  "router.per_expert_scale": (EXPERTS,)}


def _read(sources, config, tensors):
    return parallelmoe.read(sources, config, _decoder_layer(sources), tensors)


def test_gemma4_moe_block_is_read_from_its_code():
    code = transformers_code("gemma4")
    found = _read(code, GEMMA4, GEMMA4_TENSORS)
    assert isinstance(found, parallelmoe.ParallelMoe), found
    assert (found.experts, found.router, found.dense) == ("experts", "router", "mlp")
    assert (found.dense_norm, found.input_norm, found.output_norm, found.sum_norm) == (
        "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2",
        "post_feedforward_layernorm")
    # The router reads the residual stream (not the experts' normed input): norm, scale, hidden ** -0.5, proj,
    # softmax top-k renormalized, times the per-expert scale; its norm's eps is config.json's rms_norm_eps.
    assert found.router_input == "residual"
    assert (found.router_norm, found.router_proj, found.router_scale, found.expert_scale) == (
        "norm", "proj", "scale", "per_expert_scale")
    assert found.router_root and found.renormalize and found.router_eps_key == "rms_norm_eps"
    assert (found.gate_up, found.down, found.up_first) == ("gate_up_proj", "down_proj", False)
    assert (found.activation_key, found.activation) == ("hidden_activation", "gelu_pytorch_tanh")
    assert found.where.startswith("modeling_gemma4.py:") and found.router_where.startswith("modeling_gemma4.py:")
    # Built under `if self.enable_moe_block:` (self.enable_moe_block = config.enable_moe_block): the port evaluates
    # the condition on the config it serves.
    assert found.condition == "config.enable_moe_block"
    # The form check lets it through now (its router is read with the tensors by the layout detector); config.json
    # switching the block off leaves one feed-forward block.
    assert forms.experts_beside_mlp(code, GEMMA4) is None
    assert forms.experts_beside_mlp(code, dict(GEMMA4, enable_moe_block=False)) is None


def test_a_router_that_computes_otherwise_is_refused_naming_its_forward():
    code = dict(transformers_code("gemma4"))
    file = next(f for f in code if f.endswith("modeling_gemma4.py"))
    # No renormalization of the top-k and sigmoid scores: not the softmax top-k the port computes.
    changed = code[file].replace("router_probabilities = nn.functional.softmax(expert_scores, dim=-1, "
                                 "dtype=torch.float32)", "router_probabilities = torch.sigmoid(expert_scores)")
    assert changed != code[file]
    found = _read({**code, file: changed}, GEMMA4, GEMMA4_TENSORS)
    assert isinstance(found, str) and "Gemma4TextRouter.forward (modeling_gemma4.py:" in found, found
    assert "computes routing weights other than a softmax top-k" in found
    # The router's scale held nowhere in the checkpoint: named, not guessed.
    missing = _read(code, GEMMA4, {k: v for k, v in GEMMA4_TENSORS.items() if k != "router.scale"})
    assert isinstance(missing, str) and "self.scale, which the checkpoint does not hold" in missing, missing


# A lab's layer written otherwise: the dense MLP `ffn` with no norm of its own after it, the experts `bank` (weights
# before indices in its forward, a loop over every expert), their norms `moe_in` / `moe_out`, the router `chooser`
# (a plain linear of the experts' normed input, softmax top-k renormalized, no scales) returning two values, the sum
# added to the residual stream with no norm over it.
LAB = "\n" + LAB_PRELUDE + '''ACT2FN = {"silu": F.silu}


class LabDense(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.w_gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w_up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w_down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class LabBank(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.count = config.num_experts
        self.w_gu = nn.Parameter(torch.empty(config.num_experts, 2 * config.moe_intermediate_size, config.hidden_size))
        self.w_dn = nn.Parameter(torch.empty(config.num_experts, config.hidden_size, config.moe_intermediate_size))
        self.act = ACT2FN[config.hidden_act]

    def forward(self, x, scores, chosen):
        out = torch.zeros_like(x)
        for e in range(self.count):
            tok, slot = torch.where(chosen == e)
            g, u = F.linear(x[tok], self.w_gu[e]).chunk(2, dim=-1)
            y = F.linear(self.act(g) * u, self.w_dn[e])
            out.index_add_(0, tok, y * scores[tok, slot, None])
        return out


class LabChooser(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.k = config.num_experts_per_tok
        self.lin = nn.Linear(config.hidden_size, config.num_experts, bias=False)

    def forward(self, h):
        probs = torch.softmax(self.lin(h), dim=-1)
        top, idx = torch.topk(probs, self.k, dim=-1)
        return top / top.sum(-1, keepdim=True), idx


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask))


class LabLayer(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.attn = LabAttention(config, layer_idx)
        self.ffn = LabDense(config)
        self.chooser = LabChooser(config)
        self.bank = LabBank(config)
        self.ln_1 = LabRMSNorm(config.hidden_size)
        self.ln_2 = LabRMSNorm(config.hidden_size)
        self.moe_in = LabRMSNorm(config.hidden_size)
        self.moe_out = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.ln_1(x), cos, sin, mask)
        dense = self.ffn(self.ln_2(x))
        routed_in = self.moe_in(x)
        scores, chosen = self.chooser(routed_in)
        routed = self.moe_out(self.bank(routed_in, scores, chosen))
        return x + (dense + routed)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''
LAB_CONFIG = {"hidden_size": HIDDEN, "num_experts": EXPERTS, "num_experts_per_tok": 2, "moe_intermediate_size": WIDTH,
              "intermediate_size": 256, "hidden_act": "silu", "num_hidden_layers": 2, "vocab_size": 256}
LAB_TENSORS = {"bank.w_gu": (EXPERTS, 2 * WIDTH, HIDDEN), "bank.w_dn": (EXPERTS, HIDDEN, WIDTH),
               "chooser.lin.weight": (EXPERTS, HIDDEN)}


def test_a_lab_layer_with_experts_beside_its_mlp_is_read_under_its_own_names():
    found = _read({"modeling_lab.py": LAB}, LAB_CONFIG, LAB_TENSORS)
    assert isinstance(found, parallelmoe.ParallelMoe), found
    assert (found.experts, found.router, found.dense) == ("bank", "chooser", "ffn")
    assert (found.dense_norm, found.input_norm, found.output_norm, found.sum_norm) == ("", "moe_in", "moe_out", "")
    assert found.router_input == "experts_input"
    assert (found.router_norm, found.router_proj, found.router_scale, found.expert_scale) == ("", "lin", "", "")
    assert not found.router_root and found.renormalize
    assert (found.gate_up, found.down, found.activation) == ("w_gu", "w_dn", "silu")
    assert found.condition == ""  # built in every layer
    assert forms.experts_beside_mlp({"modeling_lab.py": LAB}, LAB_CONFIG) is None


def test_the_condition_building_the_experts_is_followed_to_the_config_and_the_layer_index():
    # Built in the odd layers while the config says so, the flag copied to the layer under another name.
    code = LAB.replace('''        self.chooser = LabChooser(config)
        self.bank = LabBank(config)''', '''        self.routed = config.use_bank
        if self.routed and layer_idx % 2 == 1:
            self.chooser = LabChooser(config)
            self.bank = LabBank(config)''')
    assert code != LAB
    found = _read({"modeling_lab.py": code}, LAB_CONFIG, LAB_TENSORS)
    assert isinstance(found, parallelmoe.ParallelMoe), found
    assert found.condition == "config.use_bank and layer_idx % 2 == 1"


@pytest.mark.parametrize(("change", "reason"), [
    # The experts read the stream before the attention's output was added: not what the dense MLP reads.
    (("routed_in = self.moe_in(x)", "routed_in = self.moe_in(self.ln_1(x))"), "not the residual stream"),
    # Top-k weights left as the softmax gives them, beside the renormalized sum: still a routing the reader matches.
    (("return top / top.sum(-1, keepdim=True), idx", "return top * 2.0, idx"), "routing weights other than"),
])
def test_a_lab_layer_computing_otherwise_is_refused_naming_it(change, reason):
    code = LAB.replace(*change)
    assert code != LAB
    found = _read({"modeling_lab.py": code}, LAB_CONFIG, LAB_TENSORS)
    assert isinstance(found, str) and reason in found, found
    message = forms.experts_beside_mlp({"modeling_lab.py": code}, LAB_CONFIG)
    if "routing weights" not in reason:  # the router is read with the tensors (layout), the layer's form here
        assert message is not None and "otherwise than the port's experts beside the dense MLP" in message


def test_the_top_k_is_what_the_routers_code_takes():
    # The router reads its k from config.json (top_k_experts); run over numbers, the top-k it takes is that value.
    found = _read(transformers_code("gemma4"), dict(GEMMA4, top_k_experts=3), GEMMA4_TENSORS)
    assert isinstance(found, parallelmoe.ParallelMoe) and found.top_k == 3
    found = _read({"modeling_lab.py": LAB}, dict(LAB_CONFIG, num_experts_per_tok=1), LAB_TENSORS)
    assert isinstance(found, parallelmoe.ParallelMoe) and found.top_k == 1


# The lab's layer in a checkpoint, its attention, dense MLP and layer norms under Llama's names (ckpt_factory's), the
# experts beside the MLP under the lab's own: detected, mapped and rendered end to end.
LAB_LLAMA = LAB.replace('''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.wo = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask))''', '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.q_proj(x), self.k_proj(x), cos, sin)
        return self.o_proj(F.scaled_dot_product_attention(q, k, self.v_proj(x), attn_mask=mask))''').replace(
    '''        self.w_gate = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w_up = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w_down = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))''', '''        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))''').replace(
    "self.attn = LabAttention", "self.self_attn = LabAttention").replace(
    "self.ffn = LabDense", "self.mlp = LabDense").replace(
    "self.ln_1 = ", "self.input_layernorm = ").replace("self.ln_2 = ", "self.post_attention_layernorm = ").replace(
    "x = x + self.attn(self.ln_1(x), cos, sin, mask)", "x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)").replace(
    "dense = self.ffn(self.ln_2(x))", "dense = self.mlp(self.post_attention_layernorm(x))").replace(
    "self.embed = nn.Embedding", "self.embed_tokens = nn.Embedding")


def _lab_checkpoint(tmp_path):
    from ckpt_factory import Shape, config_for, tensors_for
    from helpers import read

    shape = Shape(architecture="LabForCausalLM", model_type="lab_beside", layers=2)
    hidden, experts, width = shape.hidden, 4, 32
    tensors = dict(tensors_for(shape))
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        tensors.update({p + "bank.w_gu": [experts, 2 * width, hidden], p + "bank.w_dn": [experts, hidden, width],
                        p + "chooser.lin.weight": [experts, hidden], p + "moe_in.weight": [hidden],
                        p + "moe_out.weight": [hidden]})
    config = {**config_for(shape), "num_experts": experts, "num_experts_per_tok": 2, "moe_intermediate_size": width,
              "hidden_act": "silu"}
    read(tmp_path, shape, tensors=tensors, config=config)
    (tmp_path / "modeling_lab.py").write_text(LAB_LLAMA)  # read back with the checkpoint's own code beside it
    return read_checkpoint(tmp_path)


def test_a_lab_checkpoint_with_experts_beside_its_mlp_is_ported_end_to_end(tmp_path):
    from scaffold.detect import detect
    from scaffold.render import render
    from scaffold.verify.report import Report
    from scaffold.verify.static import check_mapping

    assert "self.bank = LabBank(config)" in LAB_LLAMA and "self.self_attn = LabAttention" in LAB_LLAMA
    ckpt = _lab_checkpoint(tmp_path)
    spec = detect(ckpt)
    assert (spec.parallel_moe_experts, spec.parallel_moe_router, spec.parallel_moe_router_proj) == (
        "bank", "chooser", "lin")
    assert (spec.parallel_moe_gate_up, spec.parallel_moe_down) == ("w_gu", "w_dn")
    assert (spec.parallel_moe_input_norm, spec.parallel_moe_output_norm, spec.parallel_moe_dense_norm) == (
        "moe_in", "moe_out", "")
    assert spec.parallel_moe_router_input == "experts_input" and spec.parallel_moe_renormalize
    assert (spec.parallel_moe_num_experts, spec.parallel_moe_top_k, spec.parallel_moe_intermediate_size) == (4, 2, 32)
    assert spec.source("parallel_moe_top_k").expr == "config.num_experts_per_tok"
    assert "mlp_post_norm" not in spec.names and not spec.is_moe
    report = Report("port", str(ckpt.path))
    check_mapping(report, spec, ckpt)
    assert all(c.status != "FAIL" for c in report.checks), [c.detail for c in report.checks]
    model = next(text for name, text in render(spec, ckpt).files.items() if name.endswith("model.py"))
    assert "self.bank = FusedMoE(" in model and ("activation='silu'" in model or 'activation="silu"' in model)
    assert "self.parallel_moe = True" in model  # built in every layer: the lab's __init__ has no condition
    assert "router_logits = self.chooser(experts_input)" in model
    assert "experts_output = self.moe_out(experts_output)" in model
