"""Attention projections kept on the decoder layer itself (OLMo v1's att_proj, attn_out; spec.attn_on_layer), beside
an MLP whose fused gate/up projection is on the layer too (ff_proj): mapped into the port's attention and MLP modules
and cut into their shards on load."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from olmo_v1_layout import D_MODEL, FFN, write_layout

from scaffold.analysis import analyze


def test_olmo_v1_projections_on_the_block_load_into_the_ports_attention_and_mlp(tmp_path):
    ckpt, spec_file = write_layout(tmp_path / "olmo")
    analysis = analyze(ckpt, spec_file)
    spec = analysis.spec
    assert spec.attn_on_layer and spec.mlp_on_layer
    loads = {}
    for row in analysis.rows:
        loads.setdefault(row.checkpoint, []).append((row.param, row.shard))
    att = "model.transformer.blocks.1.att_proj.weight"
    assert loads[att] == [("model.blocks.1.self_attn.att_proj.weight", s) for s in ("q", "k", "v")]
    assert loads["model.transformer.blocks.1.attn_out.weight"] == [("model.blocks.1.self_attn.attn_out.weight", None)]
    # silu(gate) * x over (x, gate) halves: the first half is the up projection (shard 1), the second the gate (0).
    assert sorted(loads["model.transformer.blocks.0.ff_proj.weight"], key=str) == [
        ("model.blocks.0.mlp.ff_proj.weight", 0), ("model.blocks.0.mlp.ff_proj.weight", 1)]
    assert loads["model.transformer.blocks.0.ff_out.weight"] == [("model.blocks.0.mlp.ff_out.weight", None)]


def test_the_rendered_loader_cuts_a_fused_projection_kept_on_the_layer(tmp_path):
    """param_for renames att_proj / ff_proj into the port's modules, and split_fused must find their shard sizes under
    those names (it looked them up under the checkpoint's bare module name: KeyError 'att_proj' at load)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    from scaffold.render import render

    ckpt_dir, spec_file = write_layout(tmp_path / "olmo")
    analysis = analyze(ckpt_dir, spec_file)
    out = tmp_path / "port"
    for relative, text in render(analysis.spec, analysis.ckpt).files.items():
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / relative).write_text(text)
    package = next(p for p in out.iterdir() if (p / "model.py").exists())
    spec = importlib.util.spec_from_file_location(f"{package.name}.model", package / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    cls = module.OLMoForCausalLM
    # Names as load_weights sees them, after hf_to_vllm_mapper (model.transformer.blocks -> model.blocks).
    assert cls.param_for("model.blocks.1.att_proj.weight") == ("model.blocks.1.self_attn.att_proj.weight", ("q", "k", "v"))
    assert cls.param_for("model.blocks.0.ff_proj.weight") == ("model.blocks.0.mlp.ff_proj.weight", (1, 0))
    fake = type("Fake", (), {"split_sizes": {"self_attn.att_proj": [D_MODEL] * 3, "mlp.ff_proj": [FFN] * 2}})()
    pieces = cls.split_fused(fake, "model.blocks.1.att_proj.weight", torch.zeros(3 * D_MODEL, D_MODEL))
    assert [p.shape[0] for p in pieces] == [D_MODEL] * 3
    pieces = cls.split_fused(fake, "model.blocks.1.ff_proj.weight", torch.zeros(2 * FFN, D_MODEL))
    assert [p.shape[0] for p in pieces] == [FFN] * 2


def _remote_code_checkpoint(out, modeling: str):
    import json

    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LabForCausalLM"], "model_type": "lab_outside", "d_model": 128, "n_heads": 2,
        "n_layers": 2, "vocab_size": 1000, "torch_dtype": "float32",
        "auto_map": {"AutoModelForCausalLM": "modeling_lab.LabForCausalLM"}}))
    (out / "modeling_lab.py").write_text(modeling)
    save_file({"model.transformer.wte.weight": torch.zeros(1000, 128),
               **{f"model.transformer.blocks.{i}.att_proj.weight": torch.zeros(384, 128) for i in range(2)}},
              out / "model.safetensors")
    return out


OUTSIDE = '''from torch import nn
from transformers import PreTrainedModel

from labcore.model import Core


class LabForCausalLM(PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = Core(config)
'''


def test_a_model_built_by_a_package_outside_the_checkpoint_is_named_in_the_refusal(tmp_path):
    """OLMo v1's hf_olmo form: the causal-LM class builds its model with a class imported from a package the checkpoint
    does not hold. The refusal names the construction and the import (file:line), not a field-by-field account of
    config keys the code would have read."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import detect
    from scaffold.errors import ScaffoldError

    ckpt = read_checkpoint(_remote_code_checkpoint(tmp_path / "outside", OUTSIDE))
    with pytest.raises(ScaffoldError) as refused:
        detect(ckpt)
    problem = refused.value.problem
    assert "the model's code is not in it: LabForCausalLM.__init__ builds self.model = Core(...) (modeling_lab.py:10)" \
        in problem
    assert "from the package labcore (modeling_lab.py:4: from labcore.model import Core)" in problem
    assert "Describe the model in a spec file (--spec)" in problem and "config.json has none of the keys" not in problem


def test_modules_of_torch_or_of_the_checkpoints_own_files_are_not_outside_code(tmp_path):
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect.external import outside_code

    own = OUTSIDE.replace("from labcore.model import Core", "from modeling_core import Core").replace(
        "self.model = Core(config)", "self.model = Core(config)\n        self.head = nn.Linear(128, 1000)")
    out = _remote_code_checkpoint(tmp_path / "own", own)
    (out / "modeling_core.py").write_text("from torch import nn\n\n\nclass Core(nn.Module):\n    pass\n")
    assert outside_code(read_checkpoint(out)) is None


CONFIG_WITH_PROPERTIES = '''from transformers import PretrainedConfig


class LabConfig(PretrainedConfig):
    model_type = "lab_outside"

    @property
    def num_hidden_layers(self):
        """The layer count, under transformers' name."""
        return self.n_layers

    @property
    def hidden_size(self):
        return self.d_model

    @property
    def num_attention_heads(self):
        return self.n_heads

    @property
    def effective_heads(self):
        if self.n_heads:
            return self.n_heads
        return 1
'''


def test_a_config_class_naming_its_sizes_by_properties_is_read_as_attribute_map(tmp_path):
    """OLMo v1's configuration_olmo.py gives the standard names as properties (num_hidden_layers returns n_layers), not
    attribute_map: the sizes are config.json's n_layers, d_model, n_heads, read at run time under those keys (before:
    num_layers unknown, 'config.json has none of the keys num_hidden_layers, n_layer, num_layers')."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import understand
    from scaffold.detect.codekeys import attribute_map

    out = _remote_code_checkpoint(tmp_path / "props", OUTSIDE)
    (out / "configuration_lab.py").write_text(CONFIG_WITH_PROPERTIES)
    ckpt = read_checkpoint(out)
    assert attribute_map(ckpt) == {"num_hidden_layers": "n_layers", "hidden_size": "d_model",
                                   "num_attention_heads": "n_heads"}
    spec = understand(ckpt)
    assert (spec.num_layers, spec.hidden_size, spec.num_heads) == (2, 128, 2)
    assert [spec.source(f).expr for f in ("num_layers", "hidden_size", "num_heads")] == [
        "config.n_layers", "config.d_model", "config.n_heads"]
