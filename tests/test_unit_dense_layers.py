"""The layers of a mixture-of-experts model that keep a dense MLP, read as the decoder layer's own condition
(scaffold.detect.denselayers), so that the port evaluates it on each checkpoint's config instead of keeping one
checkpoint's list."""

from __future__ import annotations

from helpers import LAB_PRELUDE, transformers_code

from scaffold.detect import denselayers

# A lab's decoder unlike transformers' files: the layer's index under another name, the choice made through an
# attribute set from a config period (every moe_every-th layer routes, counted from 1), the config under
# another name inside the block, the MoE module under its own name, and the list built by a loop variable named
# otherwise.
LAB_CODE = "\n" + LAB_PRELUDE + '''class LabFFN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.w_in = nn.Linear(cfg.hidden_size, cfg.intermediate_size)


class LabRouted(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.router = nn.Linear(cfg.hidden_size, cfg.n_experts)


class LabBlock(nn.Module):
    def __init__(self, cfg, block_no):
        super().__init__()
        self.routed = (block_no + 1) % cfg.moe_every == 0
        self.ffn = LabRouted(cfg) if self.routed else LabFFN(cfg)


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.blocks = nn.ModuleList([LabBlock(config, n) for n in range(config.num_hidden_layers)])
'''


def test_deepseek_v3_first_k_dense_layers_are_its_condition_negated():
    found = denselayers.code_dense_layers(transformers_code("deepseek_v3"), {"first_k_dense_replace": 2}, "layers",
                                          "mlp", 5, [0, 1])
    assert found.expr == "layer_idx < config.first_k_dense_replace"
    assert found.evidence.startswith("modeling_deepseek_v3.py:") and "layer_idx >= config.first_k_dense_replace" \
        in found.evidence


def test_mimo_v2_layer_types_list_is_read_per_layer():
    config = {"mlp_layer_types": ["dense", "sparse", "sparse", "dense"]}
    found = denselayers.code_dense_layers(transformers_code("mimo_v2_flash"), config, "layers", "mlp", 4, [0, 3])
    assert found.expr == "config.mlp_layer_types[layer_idx] != 'sparse'"


def test_a_lab_period_through_an_attribute_is_followed_to_the_layer_index():
    config = {"moe_every": 2}
    found = denselayers.code_dense_layers({"modeling_lab.py": LAB_CODE}, config, "blocks", "ffn", 6, [0, 2, 4])
    assert found.expr == "(layer_idx + 1) % config.moe_every != 0"
    assert "modeling_lab.py:" in found.evidence and "self.routed" in found.evidence


def test_a_condition_config_json_does_not_decide_or_the_tensors_contradict_keeps_the_list():
    lab = {"modeling_lab.py": LAB_CODE}
    # moe_every missing from config.json: its value is the config class's, which is not read here.
    assert denselayers.code_dense_layers(lab, {}, "blocks", "ffn", 6, [0, 2, 4]) is None
    # The tensors hold experts where the code would build a dense MLP: the checkpoint's list stays the port's.
    assert denselayers.code_dense_layers(lab, {"moe_every": 3}, "blocks", "ffn", 6, [0, 2, 4]) is None
    # Another module's choice is not this one's.
    assert denselayers.code_dense_layers(lab, {"moe_every": 2}, "blocks", "mlp", 6, [0, 2, 4]) is None
