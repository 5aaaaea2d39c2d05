"""Latent attention's own norms' eps and its projections' bias switch (scaffold.detect.latentnorm), and the config
keys GLM-5 and DBRX read that verify must find accounted for (configreads, keyselect, subconfigs).

GLM-5's (glm_moe_dsa), GLM-4-MoE-Lite's and MiniCPM3's attention build q_a_layernorm and kv_a_layernorm without an
eps: their RMSNorm class's default 1e-6, beside rms_norm_eps 1e-5 for every other norm. A lab's attention written
otherwise (its config called cfg, its own norm class and eps parameter, the eps handed as a config key) is read the
same way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import LAB_PRELUDE, transformers_code

from scaffold.checkpoint import Checkpoint, TokenizerInfo, read_checkpoint
from scaffold.detect import detect, latentnorm
from scaffold.detect.configreads import accounted_keys, unaccounted_reads
from scaffold.errors import ScaffoldError
from scaffold.spec import Source, Spec
from scaffold.tiny import build_tiny

GLM5 = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 64, "q_lora_rank": 96, "qk_nope_head_dim": 32,
        "v_head_dim": 32, "num_key_value_heads": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 64, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "index_topk": 256,
        "index_n_heads": 4, "indexer_types": ["full", "shared", "full"]}


@pytest.fixture(scope="module")
def glm5(tmp_path_factory) -> Path:
    return build_tiny("glm_moe_dsa", tmp_path_factory.mktemp("glm5") / "ckpt", architecture="LabGlmMoeDsaForCausalLM",
                      overrides=GLM5)


def test_glm5_latent_norms_take_their_class_default_not_rms_norm_eps(glm5):
    assert json.loads((glm5 / "config.json").read_text())["rms_norm_eps"] == 1e-5
    ckpt = read_checkpoint(glm5)
    spec = detect(ckpt)
    assert (spec.norm_eps, spec.latent_norm_eps) == (1e-5, 1e-6)
    detail = spec.source("latent_norm_eps").detail
    assert "GlmMoeDsaRMSNorm(self.q_lora_rank), the default eps of GlmMoeDsaRMSNorm" in detail
    # attention_bias (the latent projections' bias switch, false), indexer_types (which layers build their own
    # selector: the port computes none) and num_local_experts (attribute_map's n_routed_experts) are accounted for.
    assert unaccounted_reads(ckpt, accounted_keys(spec.provenance)) == {}
    assert "bias=config.attention_bias" in spec.source("qkv_bias").detail
    assert "indexer_types" in spec.source("key_selector").detail


def test_deepseek_latent_norms_keep_the_one_norm_eps():
    """DeepSeek-V3's class default and rms_norm_eps are both 1e-6: nothing to set (its ports unchanged)."""
    ckpt = _lab_ckpt(transformers_code("deepseek_v3"), {"rms_norm_eps": 1e-6})
    spec = _latent_spec(ckpt, "q_a_layernorm", "kv_a_layernorm", 1e-6)
    latentnorm.detect(ckpt, spec)
    assert spec.latent_norm_eps is None


LAB = LAB_PRELUDE + '''
class Squash(nn.Module):
    def __init__(self, width, epsilon=1e-5):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.epsilon = epsilon


class CompressedAttention(nn.Module):
    def __init__(self, cfg, idx):
        super().__init__()
        self.down_q = nn.Linear(cfg.hidden_size, cfg.q_rank, bias=cfg.proj_bias)
        self.down_q_norm = Squash(cfg.q_rank{q_eps})
        self.down_kv = nn.Linear(cfg.hidden_size, cfg.kv_rank + 64, bias=cfg.proj_bias)
        self.down_kv_norm = Squash(cfg.kv_rank{kv_eps})
'''


def _lab_ckpt(sources: dict[str, str], config: dict) -> Checkpoint:
    return Checkpoint(Path("/lab"), config, {}, [], None, TokenizerInfo(), sources)


def _latent_spec(ckpt: Checkpoint, q_norm: str, kv_norm: str, eps: float) -> Spec:
    spec = Spec()
    spec.set("qkv_layout", "latent", Source("tensor", "lab"))
    spec.set("names", {**spec.names, "q_a_norm": q_norm, "kv_a_norm": kv_norm}, Source("tensor", "lab"))
    spec.set("norm_eps", eps, Source("config", "config.json rms_norm_eps", "config.rms_norm_eps"))
    return spec


def _lab(q_eps: str = "", kv_eps: str = "", **config) -> tuple[Checkpoint, Spec]:
    code = LAB.replace("{q_eps}", q_eps).replace("{kv_eps}", kv_eps)
    ckpt = _lab_ckpt({"modeling_lab.py": code}, {"rms_norm_eps": 1e-6, "proj_bias": False, **config})
    spec = _latent_spec(ckpt, "down_q_norm", "down_kv_norm", 1e-6)
    latentnorm.detect(ckpt, spec)
    return ckpt, spec


def test_a_labs_norm_class_default_under_its_own_parameter_name():
    _, spec = _lab()
    assert spec.latent_norm_eps == 1e-5
    assert "the default eps of Squash (modeling_lab.py:" in spec.source("latent_norm_eps").detail
    assert "bias=config.proj_bias" in spec.source("qkv_bias").detail


def test_a_labs_eps_handed_as_a_config_key_is_read_at_run_time():
    _, spec = _lab(", epsilon=cfg.latent_eps", ", cfg.latent_eps", latent_eps=3e-6)
    assert spec.latent_norm_eps == 3e-6
    assert spec.source("latent_norm_eps").expr == "config.latent_eps"


def test_a_labs_eps_equal_to_the_other_norms_sets_nothing():
    _, spec = _lab(", 1e-6", ", epsilon=1e-6")
    assert spec.latent_norm_eps is None


@pytest.mark.parametrize(("q_eps", "kv_eps", "config", "why"), [
    (", 1e-5", ", 1e-4", {}, "latent attention norms built with different eps"),
    (", epsilon=compute_eps()", "", {}, "whose eps the reader does not follow"),
    ("", "", {"proj_bias": True}, "built with bias=config.proj_bias (modeling_lab.py:"),
])
def test_what_the_port_cannot_build_so_is_refused_by_name(q_eps, kv_eps, config, why):
    with pytest.raises(ScaffoldError, match=why.replace("(", r"\(")):
        _lab(q_eps, kv_eps, **config)

