"""MLP widths of each layer's own: config.json holds the width key as one value per layer (Gemma-3n's
intermediate_size) and the code builds each layer's MLP from its own entry, followed from the MLP's down projection
through the decoder layer's constructor call to the layer list's index (spec layer_intermediate_sizes, evaluated by
the port per layer); a list the code does not read per layer stays refused."""

from __future__ import annotations

import json
import re

import pytest
from ckpt_factory import Shape, config_for, tensors_for
from helpers import LAB_PRELUDE, detect_until, read, transformers_code

from scaffold.checkpoint import read_checkpoint
from scaffold.detect import layerwidths, mlp, sizes
from scaffold.errors import CheckpointError, UnsupportedArchitecture

# A lab's decoder written unlike Gemma-3n's: the width a local of the MLP's __init__, the layer's index handed on
# under other names (position `idx`, then keyword `which`), the list built from `n`, the MLP kept as feed_forward.
LAB = "\n" + LAB_PRELUDE + '''class LabAttention(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.wq = nn.Linear(config.hidden_size, config.num_attention_heads * config.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.wv = nn.Linear(config.hidden_size, config.num_key_value_heads * config.head_dim, bias=False)
        self.wo = nn.Linear(config.num_attention_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        q, k = apply_rope(self.wq(x), self.wk(x), cos, sin)
        return self.wo(F.scaled_dot_product_attention(q, k, self.wv(x), attn_mask=mask))


class LabFeedForward(nn.Module):
    def __init__(self, config, which=0):
        super().__init__()
        width = config.intermediate_size[which]
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.down_proj = nn.Linear(width, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LabLayer(nn.Module):
    def __init__(self, config, idx):
        super().__init__()
        self.self_attn = LabAttention(config, idx)
        self.feed_forward = LabFeedForward(config, which=idx)
        self.input_layernorm = LabRMSNorm(config.hidden_size)
        self.post_attention_layernorm = LabRMSNorm(config.hidden_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.feed_forward(self.post_attention_layernorm(x))


class LabModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList([LabLayer(config, n) for n in range(config.num_hidden_layers)])
        self.norm = LabRMSNorm(config.hidden_size)
'''
WIDTHS = [96, 160, 96]


def _lab(tmp_path, code=LAB, widths=WIDTHS, stored=None):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_widths", layers=len(widths))
    tensors = {k.replace(".mlp.", ".feed_forward."): v for k, v in tensors_for(shape).items()}
    for i, width in enumerate(stored or widths):
        p = f"model.layers.{i}.feed_forward."
        tensors.update({p + "gate_proj.weight": [width, shape.hidden], p + "up_proj.weight": [width, shape.hidden],
                        p + "down_proj.weight": [shape.hidden, width]})
    read(tmp_path, shape, tensors=tensors, config={**config_for(shape), "intermediate_size": widths})
    (tmp_path / "modeling_lab.py").write_text(code)
    return read_checkpoint(tmp_path)


def test_gemma3n_builds_each_layers_mlp_from_its_own_width():
    found = layerwidths.per_layer_widths(transformers_code("gemma3n"), "config.hidden_size")
    assert [(attr, key) for attr, key, _ in found] == [("mlp", "intermediate_size")]
    file, line = found[0][2].rsplit(":", 1)
    source = transformers_code("gemma3n")[file].splitlines()[int(line) - 1]
    assert "self.down_proj = nn.Linear(self.intermediate_size, self.hidden_size" in source


def test_a_lab_mlp_sized_per_layer_under_other_names_is_read_and_checked_per_layer(tmp_path):
    spec = detect_until(_lab(tmp_path), mlp)
    assert spec.layer_intermediate_sizes == WIDTHS and spec.intermediate_size == 96
    assert spec.source("layer_intermediate_sizes").expr == "config.intermediate_size[layer_idx]"
    assert "modeling_lab.py" in spec.source("layer_intermediate_sizes").detail
    # Every layer's tensors are checked against its own width: layer 1 stored at layer 0's width is refused.
    with pytest.raises(CheckpointError, match=r"layers\.1\.feed_forward\.gate_proj\.weight has shape \[96, 64\].*"
                                              r"intermediate size 160"):
        detect_until(_lab(tmp_path / "short", stored=[96, 96, 96]), mlp)


def test_a_per_layer_list_the_code_does_not_index_by_the_layer_is_refused(tmp_path):
    # The MLP takes the list's first entry in every layer: one width for all, not the list the config holds.
    one = LAB.replace("config.intermediate_size[which]", "config.intermediate_size[0]")
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer sizes: config key 'intermediate_size' holds one "
                                                      r"value per layer \(\[96, 160, 96\]\), where the port builds "
                                                      r"every layer from one value"):
        detect_until(_lab(tmp_path / "first", code=one), sizes)
    # Indexed by something other than the layer's own index (the next layer's width).
    shifted = LAB.replace("LabFeedForward(config, which=idx)", "LabFeedForward(config, which=idx + 1)")
    with pytest.raises(UnsupportedArchitecture, match=r"per-layer sizes"):
        detect_until(_lab(tmp_path / "shifted", code=shifted), sizes)
    # A list of another length than the layers.
    with pytest.raises(UnsupportedArchitecture, match=r"holds one value per layer \(\[96, 160\]\), but 3 layers"):
        ckpt = _lab(tmp_path / "short")
        config = json.loads((tmp_path / "short" / "config.json").read_text())
        (tmp_path / "short" / "config.json").write_text(json.dumps({**config, "intermediate_size": [96, 160]}))
        detect_until(read_checkpoint(tmp_path / "short"), sizes)
    del ckpt


def test_the_port_builds_each_layers_mlp_from_the_codes_expression(tmp_path):
    from scaffold.detect import detect
    from scaffold.render import render

    ckpt = _lab(tmp_path)
    files = render(detect(ckpt), ckpt).files
    model = next(text for name, text in files.items() if name.endswith("model.py"))
    assert "layer_idx = extract_layer_index(prefix)" in model
    assert "config.intermediate_size[layer_idx]," in model


def test_tensor_parallel_sizes_count_every_layers_width():
    """A TP size serves the checkpoint only where every layer's MLP width divides over it (layer 0's alone is what
    the twin's sharding proof loads)."""
    from scaffold.spec import Spec
    from scaffold.verify import _servable_at_real_sizes
    from scaffold.verify.report import PASS, Check

    spec = Spec(num_heads=8, num_kv_heads=8, intermediate_size=256, layer_intermediate_sizes=[256, 260, 256])
    check = Check("tensor-parallel sharding", PASS, "TP=2: ok")
    _servable_at_real_sizes(check, spec)
    assert check.data["servable_at_checkpoint_sizes"] == [2, 4]  # 260 rows do not divide over 8 ranks
    assert "256/260 MLP rows" in check.detail


# ---------------------------------------------------------------- widths computed from one value and the layer's index
# Gemma 4's double-wide MLP: config.json holds one intermediate_size; the MLP's __init__ doubles it in the KV-shared
# layers (`config.intermediate_size * (2 if use_double_wide_mlp and is_kv_shared_layer else 1)`).
GEMMA4_CONFIG = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 5, "num_kv_shared_layers": 2,
                 "use_double_wide_mlp": True}


def test_gemma4_double_wide_mlp_is_read_from_the_codes_expression():
    found = layerwidths.layer_dependent_widths(transformers_code("gemma4"), "config.hidden_size", "intermediate_size",
                                               GEMMA4_CONFIG, 5)
    assert [(attr, values) for attr, _expr, values, _where in found] == [("mlp", [256, 256, 256, 512, 512])]
    expr = found[0][1]
    assert "layer_idx" in expr and "config.use_double_wide_mlp" in expr and "config.num_kv_shared_layers" in expr
    # Where config.json turns it off, or shares no layer, every layer has one width: nothing of its own to port.
    for off in ({"use_double_wide_mlp": False}, {"num_kv_shared_layers": 0}):
        assert layerwidths.layer_dependent_widths(transformers_code("gemma4"), "config.hidden_size",
                                                  "intermediate_size", {**GEMMA4_CONFIG, **off}, 5) == []


# A lab's MLP written otherwise: the factor a local of the decoder layer handed down by keyword, the index named
# `depth`, the width kept on self under another name, the last layer three times as wide.
WIDENED = LAB.replace('''class LabFeedForward(nn.Module):
    def __init__(self, config, which=0):
        super().__init__()
        width = config.intermediate_size[which]''', '''class LabFeedForward(nn.Module):
    def __init__(self, config, which=0, factor=1):
        super().__init__()
        self.ffn_width = config.intermediate_size * factor
        width = self.ffn_width''').replace('''    def __init__(self, config, idx):
        super().__init__()
        self.self_attn = LabAttention(config, idx)
        self.feed_forward = LabFeedForward(config, which=idx)''', '''    def __init__(self, config, depth):
        super().__init__()
        last = depth == config.num_hidden_layers - 1
        self.self_attn = LabAttention(config, depth)
        self.feed_forward = LabFeedForward(config, which=depth, factor=3 if last else 1)''').replace(
    "LabLayer(config, n) for n in", "LabLayer(config, depth=n) for n in")


def _widened(tmp_path, stored=(96, 96, 288)):
    shape = Shape(architecture="LabForCausalLM", model_type="lab_widths", layers=3)
    tensors = {k.replace(".mlp.", ".feed_forward."): v for k, v in tensors_for(shape).items()}
    for i, width in enumerate(stored):
        p = f"model.layers.{i}.feed_forward."
        tensors.update({p + "gate_proj.weight": [width, shape.hidden], p + "up_proj.weight": [width, shape.hidden],
                        p + "down_proj.weight": [shape.hidden, width]})
    read(tmp_path, shape, tensors=tensors, config={**config_for(shape), "intermediate_size": 96})
    (tmp_path / "modeling_lab.py").write_text(WIDENED)
    return read_checkpoint(tmp_path)


def test_a_lab_mlp_widened_by_the_layers_index_is_ported_with_the_codes_expression(tmp_path):
    from scaffold.detect import detect
    from scaffold.render import render

    assert "factor=3 if last else 1" in WIDENED and "config.intermediate_size[" not in WIDENED
    ckpt = _widened(tmp_path)
    spec = detect_until(ckpt, mlp)
    assert spec.layer_intermediate_sizes == [96, 96, 288] and spec.intermediate_size == 96
    expr = spec.source("layer_intermediate_sizes").expr
    assert expr == "config.intermediate_size * (3 if layer_idx == config.num_hidden_layers - 1 else 1)"
    assert "modeling_lab.py" in spec.source("layer_intermediate_sizes").detail
    model = next(text for name, text in render(detect(ckpt), ckpt).files.items() if name.endswith("model.py"))
    assert "layer_idx = extract_layer_index(prefix)" in model and "config.num_hidden_layers - 1" in model
    # The last layer stored at the others' width contradicts what the code builds there.
    with pytest.raises(CheckpointError, match=r"layers\.2\.feed_forward\.gate_proj\.weight has shape \[96, 64\].*"
                                              r"intermediate size 288"):
        detect_until(_widened(tmp_path / "narrow", stored=(96, 96, 96)), mlp)


def test_widths_from_the_layers_index_under_a_fused_gate_up_are_cut_per_layer(tmp_path):
    # One gate/up tensor per layer, of that layer's width: the port cuts it with split_sizes(layer_idx), the code's
    # expression evaluated for the layer (OpenELM's proj_1).
    from scaffold.detect import detect
    from scaffold.render import render

    fused = WIDENED.replace('''        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, width, bias=False)''', '''        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * width, bias=False)''').replace(
        "F.silu(self.gate_proj(x)) * self.up_proj(x)", "F.silu(self.gate_up_proj(x).chunk(2, -1)[0]) * "
                                                       "self.gate_up_proj(x).chunk(2, -1)[1]")
    shape = Shape(architecture="LabForCausalLM", model_type="lab_widths", layers=3)
    tensors = {k: v for k, v in tensors_for(shape).items() if ".mlp." not in k}
    for i, width in enumerate((96, 96, 288)):
        p = f"model.layers.{i}.feed_forward."
        tensors.update({p + "gate_up_proj.weight": [2 * width, shape.hidden], p + "down_proj.weight": [shape.hidden, width]})
    read(tmp_path, shape, tensors=tensors, config={**config_for(shape), "intermediate_size": 96})
    (tmp_path / "modeling_lab.py").write_text(fused)
    ckpt = read_checkpoint(tmp_path)
    spec = detect_until(ckpt, mlp)
    assert (spec.gate_up_layout, spec.layer_intermediate_sizes) == ("fused", [96, 96, 288])
    model = next(text for name, text in render(detect(ckpt), ckpt).files.items() if name.endswith("model.py"))
    assert "def split_sizes(self, layer_idx: int)" in model
    sizes = model.split("def split_sizes")[1].split("def split_fused")[0]
    assert re.search(r"""["']feed_forward\.gate_up_proj["']: \[""", sizes) and "config.num_hidden_layers - 1" in sizes
