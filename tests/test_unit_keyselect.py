"""A top-k that chooses the keys each query attends to (DeepSeek-V3.2's lightning indexer), read from what the code
computes: transformers' four families that have one, a lab's selection written otherwise (inline in the attention,
a module returning a mask, torch.topk unpacked, a keep-mask or an additive one), and the selections the port does
not compute, refused naming their line. The premise the port rests on, that up to k keys the selection keeps every
key and the attention is dense, is checked on transformers' own module."""

from __future__ import annotations

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import keyselect


@pytest.mark.parametrize("model, cls", [("deepseek_v32", "DeepseekV32Attention"), ("glm_moe_dsa", "GlmMoeDsaAttention"),
                                        ("hy_v4", "HYV4Attention"), ("axk2", "AXK2Attention")])
def test_transformers_indexers_are_a_top_k_of_config_index_topk(model, cls):
    found = keyselect.read(transformers_code(model), cls)
    assert found is not None and found.key == "index_topk" and found.modules == ("indexer",)
    assert f"modeling_{model}.py:" in found.evidence
    # The indexer's own sizes, which the port does not compute with (verify names the keys no field accounts for).
    assert {"index_head_dim", "index_n_heads"} <= set(found.reads) and "index_topk" not in found.reads


def test_an_attention_without_a_selection_and_a_routers_top_k_are_not_one():
    # DeepSeek-V3's file has top-k calls (its router's), none reaching its attention.
    assert keyselect.read(transformers_code("deepseek_v3"), "DeepseekV3Attention") is None
    assert keyselect.read(transformers_code("deepseek_v3"), "DeepseekV3MoE") is None


# A lab's selection written unlike DeepSeek's: inline in the attention, its own module names and config key,
# torch.topk unpacked into (values, indices), k the min of the config value and the keys' count taken with
# size(-1), a keep-mask scattered into zeros, folded into the additive mask with torch.where, then SDPA.
LAB_INLINE = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, cfg, layer_idx):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.d_head = cfg.head_dim
        self.keys_kept = cfg.keys_per_query
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d_head, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d_head, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.d_head, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.d_head, cfg.hidden_size, bias=False)
        self.sel_q = nn.Linear(cfg.hidden_size, 16, bias=False)
        self.sel_k = nn.Linear(cfg.hidden_size, 16, bias=False)

    def forward(self, x, cos, sin, bias):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.d_head).transpose(1, 2)
        q, k = apply_rope(q, k, cos, sin)
        relevance = self.sel_q(x) @ self.sel_k(x).transpose(-1, -2) + bias[:, 0]
        _, chosen = torch.topk(relevance, k=min(self.keys_kept, relevance.size(-1)), dim=-1)
        keep = torch.zeros_like(relevance, dtype=torch.bool).scatter_(-1, chosen, True)
        bias = torch.where(keep[:, None], bias, torch.finfo(bias.dtype).min)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, t, -1))
'''

# Another lab's: a module of its own class returns a mask True at the keys dropped; the attention is computed by
# hand, the scores masked with masked_fill before a softmax; k read with getattr from the config.
LAB_MODULE = "\n" + LAB_PRELUDE + '''def pick(scores, budget):
    best = scores.topk(min(budget, scores.shape[-1]), dim=-1)
    return torch.ones_like(scores, dtype=torch.bool).scatter(-1, best.indices, False)


class TokenPicker(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.budget = getattr(config, "pick_budget", 512)
        self.proj = nn.Linear(config.hidden_size, 32)

    def forward(self, x, causal):
        h = self.proj(x)
        return pick((h @ h.transpose(-1, -2)).masked_fill(~causal, float("-inf")), self.budget)


class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.picker = TokenPicker(config)
        self.scale = config.head_dim ** -0.5

    def forward(self, x, causal):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        dropped = self.picker(x, causal)
        scores = (q @ k.transpose(-1, -2)) * self.scale
        scores = scores.masked_fill(~causal, float("-inf")).masked_fill(dropped, float("-inf"))
        return self.out(scores.softmax(dim=-1) @ v)
'''


def test_a_labs_inline_selection_is_read_with_the_modules_that_score_it():
    found = keyselect.read({"modeling_lab.py": LAB_INLINE}, "LabAttention")
    assert found is not None and found.key == "keys_per_query"
    # What the scores are computed from, not the attention's own projections.
    assert found.modules == ("sel_k", "sel_q")
    topk = next(i for i, text in enumerate(LAB_INLINE.splitlines(), 1) if "torch.topk(" in text)
    sdpa = next(i for i, text in enumerate(LAB_INLINE.splitlines(), 1) if "scaled_dot_product_attention" in text)
    assert f"modeling_lab.py:{topk}" in found.evidence and f"modeling_lab.py:{sdpa}" in found.evidence


def test_a_labs_selection_module_returning_a_drop_mask_through_a_function_is_read():
    found = keyselect.read({"modeling_lab.py": LAB_MODULE}, "LabAttention")
    assert found is not None and (found.key, found.modules) == ("pick_budget", ("picker",))


@pytest.mark.parametrize("old, new, named", [
    # k a number of the code's own, not the config's.
    ("k=min(self.keys_kept, relevance.size(-1))", "k=64", "is not a config value"),
    # k capped by something else than the number of keys.
    ("k=min(self.keys_kept, relevance.size(-1))", "k=min(self.keys_kept, 64)", "is not a config value"),
    # The top-k over another dimension than the keys'.
    ("relevance.size(-1)), dim=-1)", "relevance.size(-1)), dim=1)", "another dimension"),
    # The mask that keeps the unselected keys.
    ("torch.where(keep[:, None], bias,", "torch.where(~keep[:, None], bias,", "does not keep the keys"),
    # The selection reaching the mask through a step the reader does not follow.
    ("bias = torch.where(keep[:, None], bias, torch.finfo(bias.dtype).min)",
     "bias = bias * keep[:, None].float()", "the reader does not follow"),
])
def test_selections_the_port_does_not_compute_are_refused_naming_the_line(old, new, named):
    assert old in LAB_INLINE
    code = LAB_INLINE.replace(old, new)
    line = next(i for i, text in enumerate(code.splitlines(), 1) if new.split(" = ")[-1][:20] in text)
    with pytest.raises(keyselect.Unfollowed, match=named) as caught:
        keyselect.read({"modeling_lab.py": code}, "LabAttention")
    assert f"modeling_lab.py:{line}" in str(caught.value)


def test_a_drop_mask_that_masks_the_kept_keys_is_refused():
    code = LAB_MODULE.replace(".masked_fill(dropped, float(\"-inf\"))", ".masked_fill(~dropped, float(\"-inf\"))")
    with pytest.raises(keyselect.Unfollowed, match="masks the keys the top-k keeps"):
        keyselect.read({"modeling_lab.py": code}, "LabAttention")


def test_up_to_index_topk_keys_the_selection_is_dense_attention_in_transformers():
    """The premise of the port, on transformers' own DeepSeek-V3.2: its output with the indexer's selection equals
    its output with every key kept, at every position whose query sees at most index_topk keys (the future keys a
    top-k of more than the visible keys picks stay masked), and differs past it."""
    torch = pytest.importorskip("torch")
    from transformers import DeepseekV32Config, DeepseekV32ForCausalLM
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as modeling

    config = DeepseekV32Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=64, max_position_embeddings=64, kv_lora_rank=32, qk_rope_head_dim=16, head_dim=16, q_lora_rank=24,
        qk_nope_head_dim=16, v_head_dim=16, index_topk=8, index_head_dim=32, index_n_heads=2, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = DeepseekV32ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(0.2 * torch.randn_like(param) + (1.0 if "norm" in name and name.endswith("weight") else 0.0))
    ids = torch.randint(0, 64, (1, 20))
    original = modeling.DeepseekV32Indexer.forward

    def every_key(self, hidden_states, q_resid, position_embeddings, attention_mask, *args, **kwargs):
        batch, length = hidden_states.shape[:2]
        return torch.arange(attention_mask.shape[-1]).expand(batch, length, -1).to(torch.int32)

    with torch.no_grad():
        sparse = model(ids).logits.log_softmax(-1)
        modeling.DeepseekV32Indexer.forward = every_key
        try:
            dense = model(ids).logits.log_softmax(-1)
        finally:
            modeling.DeepseekV32Indexer.forward = original
    delta = (sparse - dense).abs().amax(-1)[0]
    # Positions 0..7 see 1..8 keys: all kept, the future ones the top-8 picks beside them masked (float32 rounding
    # only: the experts' products batch other tokens once later positions differ).
    assert delta[:8].max().item() <= 1e-5
    assert delta[8:].max().item() > 1e-3  # position 8 sees 9 keys: the top-8 drops one
