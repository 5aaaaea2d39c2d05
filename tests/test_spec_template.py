"""A model the tool does not understand: inspect shows what it did, the spec template, a --spec file completing it.

examples/lab_dmodel is a lab-style remote-code model (config keys d_model / n_layers / n_heads / d_ff, modules
transformer.tok_emb, blocks, attn.wq/wk/wv/wo, ffn.w_gate/w_in/w_out); its checkpoint is built at test time, here
without its modeling source (as weights shared without code), and examples/lab_dmodel/spec.toml completes it.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import tomllib
from helpers import EXAMPLES, scaffold

LAB = EXAMPLES / "lab_dmodel"
TOLERANCE = 1e-4


def _build(out, source: bool):
    spec = importlib.util.spec_from_file_location("_lab_dmodel_build", LAB / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build(out, source=source)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """The lab checkpoint without its modeling source."""
    return _build(tmp_path_factory.mktemp("lab") / "ckpt", source=False)


def _clean(proc):
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr


def test_inspect_shows_the_partial_spec_and_exits_2(lab):
    proc = scaffold("inspect", lab, check=False)
    _clean(proc)
    assert proc.returncode == 2, proc.stderr
    # What it understood, with sources; what it did not, with the candidates considered.
    assert re.search(r"hidden_size +64 +config: config.json d_model", proc.stdout), proc.stdout
    assert re.search(r"num_layers +UNKNOWN", proc.stdout)
    assert "considered num_hidden_layers: not in config.json" in proc.stdout
    # The refusal: a few lines naming the missing fields and how to supply them.
    assert proc.stderr.startswith(f"error: {lab / 'config.json'}: cannot port this checkpoint")
    assert "num_layers" in proc.stderr and "names," in proc.stderr and "--spec-template" in proc.stderr
    assert len(proc.stderr.splitlines()) <= 10, proc.stderr


def test_inspect_json_emits_the_partial_spec_and_unknowns(lab):
    proc = scaffold("inspect", lab, "--json", check=False)
    _clean(proc)
    assert proc.returncode == 2
    report = json.loads(proc.stdout)
    assert report["complete"] is False
    assert report["spec"]["hidden_size"] == 64 and report["spec"]["vocab_size"] == 256
    assert report["provenance"]["hidden_size"] == "config: config.json d_model"
    assert "num_layers" not in report["spec"] and "names" not in report["spec"]
    unknowns = {u["field"]: u for u in report["unknowns"]}
    assert {"num_layers", "num_heads", "names", "block"} <= set(unknowns)
    assert {"candidate": "n_layer", "rejected": "not in config.json"} in unknowns["num_layers"]["candidates"]


def test_complete_spec_ports_the_model_reading_its_own_config_keys(lab, tmp_path):
    out = tmp_path / "port"
    scaffold("new", lab, "--spec", LAB / "spec.toml", "-o", out)
    model = (out / "lab_dm_vllm" / "model.py").read_text()
    for expr in ("config.d_model", "config.n_layers", "config.n_heads", "config.d_ff", "config.max_seq_len"):
        assert expr in model, expr
    assert "self.tok_emb" in model and "self.blocks" in model and '"wqkv": ["wq", "wk", "wv"]' in model
    # The port's recorded spec regenerates the same port (it keeps the config keys the spec file named).
    again = tmp_path / "again"
    scaffold("new", lab, "--spec", out / "scaffold_spec.toml", "-o", again)
    assert (again / "lab_dm_vllm" / "model.py").read_text() == model


@pytest.mark.parametrize("drop, named", [
    ('block = "pre_norm"\n', "block"),
    ('num_layers = "n_layers"\n', "num_layers"),
    ('embed_tokens = "tok_emb"\n', "embed_tokens"),
])
def test_spec_missing_one_field_is_refused_naming_it(lab, tmp_path, drop, named):
    text = (LAB / "spec.toml").read_text()
    assert drop in text
    spec = tmp_path / "spec.toml"
    spec.write_text(text.replace(drop, "", 1))
    proc = scaffold("new", lab, "--spec", spec, "-o", tmp_path / "port", check=False)
    _clean(proc)
    assert proc.returncode == 2 and named in proc.stderr and str(spec) in proc.stderr, proc.stderr
    assert not (tmp_path / "port").exists()


def test_user_values_are_checked_against_the_tensors(lab, tmp_path):
    """A spec value that contradicts the checkpoint is an error about the data, not an unknown."""
    spec = tmp_path / "spec.toml"
    spec.write_text((LAB / "spec.toml").read_text().replace('intermediate_size = "d_ff"', 'intermediate_size = "d_model"'))
    proc = scaffold("new", lab, "--spec", spec, "-o", tmp_path / "port", check=False)
    _clean(proc)
    assert proc.returncode == 2 and "transformer.blocks.0.ffn.w_gate.weight has shape [160, 64]" in proc.stderr, \
        proc.stderr


# The lab model's facts, as a user reads them from its code, to fill in the template's UNKNOWN lines.
FILL = {"qkv_layout": '"separate"', "qkv_bias": "false", "o_bias": "false", "qk_norm": '"none"',
        "mlp_kind": '"gated"', "gate_up_layout": '"separate"', "mlp_bias": "false", "block": '"pre_norm"',
        "norm_kind": '"rms"', "norm_offset": "0.0", "norm_bias": "false", "tie_word_embeddings": "false",
        "lm_head_bias": "false"}
NAMES = {"model": "transformer", "embed_tokens": "tok_emb", "layers": "blocks", "norm": "norm_f",
         "lm_head": "lm_head", "self_attn": "attn", "q_proj": "wq", "k_proj": "wk", "v_proj": "wv",
         "qkv_proj": "wqkv", "o_proj": "wo", "mlp": "ffn", "gate_proj": "w_gate", "up_proj": "w_in",
         "gate_up_proj": "w_gate_in", "down_proj": "w_out", "attn_norm": "attn_norm", "mlp_norm": "ffn_norm"}
KEYS = {"num_layers": "n_layers", "num_heads": "n_heads", "intermediate_size": "d_ff"}


def _fill(template: str) -> str:
    """The template with each UNKNOWN placeholder replaced, the way a user edits it."""
    out, table = [], None
    for line in template.splitlines():
        table = line if line.startswith("[") else table
        value = re.fullmatch(r"# (\w+) = .*", line)
        role = re.fullmatch(r"# UNKNOWN (\w+) = .*", line)
        if table == "[spec]" and value and value.group(1) in FILL:
            line = f"{value.group(1)} = {FILL[value.group(1)]}"
        elif table == "[spec.names]" and role:
            line = f'{role.group(1)} = "{NAMES[role.group(1)]}"' if role.group(1) in NAMES else ""
        elif table == "[spec.config_keys]" and role:
            line = f'{role.group(1)} = "{KEYS[role.group(1)]}"' if role.group(1) in KEYS else ""
        elif line == "max_position = 2048":  # a default the user corrects: the model's own key says 256
            line = ""
        elif line.startswith("# max_position: default"):
            line = 'max_position = "max_seq_len"'
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.slow  # 4 to 5 s (builds transformers models, runs the CLI): the full suite keeps it, not the quick tier
def test_spec_template_marks_unknowns_and_filled_in_is_accepted(lab, tmp_path):
    template = tmp_path / "template.toml"
    proc = scaffold("inspect", lab, "--spec-template", template)
    assert "20 field(s) marked UNKNOWN" in proc.stdout, proc.stdout
    text = template.read_text()
    values = tomllib.loads(text)["spec"]  # valid TOML as written
    assert values["hidden_size"] == 64 and values["config_keys"]["hidden_size"] == "d_model"
    assert "num_layers" not in values and "names" not in values or not values["names"]
    assert "# config: config.json d_model\nhidden_size = 64" in text  # detected values carry their source
    assert "# UNKNOWN: config.json has none of the keys num_hidden_layers" in text
    # As written, it pins what was detected and leaves the unknowns unknown: refused, naming them.
    proc = scaffold("new", lab, "--spec", template, "-o", tmp_path / "port", check=False)
    _clean(proc)
    assert proc.returncode == 2 and "num_layers" in proc.stderr
    # Filled in, it is a complete spec: the same port as the shipped spec.toml gives.
    filled = tmp_path / "filled.toml"
    filled.write_text(_fill(text))
    scaffold("new", lab, "--spec", filled, "-o", tmp_path / "port")
    scaffold("new", lab, "--spec", LAB / "spec.toml", "-o", tmp_path / "shipped")
    assert (tmp_path / "port" / "lab_dm_vllm" / "model.py").read_text() == \
        (tmp_path / "shipped" / "lab_dm_vllm" / "model.py").read_text()
    # The template never overwrites a file.
    proc = scaffold("inspect", lab, "--spec-template", filled, check=False)
    _clean(proc)
    assert proc.returncode == 2 and "exists" in proc.stderr and filled.read_text() == _fill(text)


@pytest.mark.slow  # 4 to 5 s (builds transformers models, runs the CLI): the full suite keeps it, not the quick tier
def test_spec_template_of_a_known_model_round_trips(tmp_path):
    """Every field detected: the template, as written, regenerates the port byte for byte."""
    template = tmp_path / "demolm.toml"
    proc = scaffold("inspect", EXAMPLES / "demolm", "--spec-template", template)
    assert "UNKNOWN" not in proc.stdout and "# UNKNOWN" not in template.read_text()
    scaffold("new", EXAMPLES / "demolm", "-o", tmp_path / "plain")
    scaffold("new", EXAMPLES / "demolm", "--spec", template, "-o", tmp_path / "templated")
    for name in ("model.py", "configuration.py", "__init__.py"):
        assert (tmp_path / "plain" / "demo_lm_vllm" / name).read_text() == \
            (tmp_path / "templated" / "demo_lm_vllm" / name).read_text(), name
    assert scaffold("inspect", EXAMPLES / "demolm", "--spec-template", "-").stdout == template.read_text()


@pytest.mark.engine
def test_lab_port_from_spec_verifies_against_the_checkpoint_with_its_source(lab, tmp_path):
    """Ported without the model's code; checked, float32, against that code run by transformers."""
    with_source = _build(tmp_path / "with-source", source=True)
    out = tmp_path / "port"
    scaffold("new", lab, "--spec", LAB / "spec.toml", "-o", out)
    report = json.loads(scaffold("verify", out, "--checkpoint", with_source, "--trust-remote-code",
                                 "--json").stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert report["passed"], json.dumps(report, indent=2)
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"


def test_each_stopping_detector_names_the_fields_it_decides():
    """scaffold.detect.DECIDES lists what sizes and layout decide, so that those a stopped detector left open are
    named: on a checkpoint they understand, each decides exactly its list (layout also the MoE and extra-bias
    features, which a spec adds with their names)."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.detect import DECIDES, DETECTORS
    from scaffold.spec import Spec

    # Features a spec file leaves out when the model has none (weightless norms, a norm on the embeddings too,
    # attention sinks, a gate on the attention output).
    optional = {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_renormalize",
                "shared_expert_intermediate_size", "dense_layers", "gate_extra_bias", "norm_weightless",
                "embedding_norm", "attention_sinks", "attn_output_gate", "attn_gate_act", "attn_gate_bias",
                "attn_temperature_floor_scale", "attn_temperature_scale", "attn_temperature_nope_only",
                "layer_head_dim", "layer_num_kv_heads", "layer_intermediate_sizes", "v_norm", "layer_scalar",
                "per_layer_input_size", "code_helpers",
                # TeleChat's MLP: a bias on the down projection alone.
                "mlp_down_bias_only",
                # Doge's bias per key and residual scales.
                "key_bias_proj", "key_bias_param", "key_bias_proj_bias", "key_bias_window", "residual_scale_attn",
                "residual_scale_mlp",
                # A.X-K2's norms gated by a small MLP of their output.
                "gated_norms", "gated_norms_conditional", "gated_norm_condition", "gated_norm_layers",
                "gated_norm_parts", "gated_norm_acts", "gated_norm_rank"}
    ckpt, spec = read_checkpoint(EXAMPLES / "demolm"), Spec()
    for detector in DETECTORS:
        before = set(spec.provenance)
        detector.detect(ckpt, spec)
        if detector in DECIDES:
            assert set(spec.provenance) - before - optional == set(DECIDES[detector]), detector.__name__


@pytest.mark.parametrize("keys, expect", [
    ('num_layers = "n_layer"', "config.json has no number under that key"),
    ('qkv_layout = "d_model"', "only the sizes can name a config key"),
])
def test_config_keys_are_checked(lab, tmp_path, keys, expect):
    spec = tmp_path / "spec.toml"
    spec.write_text((LAB / "spec.toml").read_text().replace('num_layers = "n_layers"', keys))
    proc = scaffold("new", lab, "--spec", spec, "-o", tmp_path / "port", check=False)
    _clean(proc)
    assert proc.returncode == 2 and expect in proc.stderr and str(spec) in proc.stderr, proc.stderr
