"""One declaration per spec field (scaffold.spec.spec_field) and the one check every path holds values to."""

from __future__ import annotations

import dataclasses
import math

import pytest
from helpers import EXAMPLES, scaffold

from scaffold.errors import SpecError
from scaffold.spec import FIELD_INFO, FIELDS, GROUPS, PROBES, Source, Spec, field_problem, field_value
from scaffold.verify.probes import FEEDS

DEMOLM = EXAMPLES / "demolm"


def test_every_field_declares_its_meaning():
    assert FIELDS == [f.name for f in dataclasses.fields(Spec) if f.name not in ("provenance", "unknowns", "pinned")]
    for name, info in FIELD_INFO.items():
        assert info.group in GROUPS and info.doc, name
        assert set(info.probe) <= set(PROBES), name
    assert FIELD_INFO["qkv_layout"].choices == ("separate", "fused", "interleaved", "grouped", "blocked", "kv_pairs",
                                                "latent", "routed")
    assert FIELD_INFO["num_layers"].limit == 1024


def test_the_verifier_reads_its_suspects_from_the_declarations():
    assert set(FEEDS) == set(PROBES)
    assert "attn_logit_softcap" in FEEDS["self_attn"] and "norm_offset" in FEEDS["final_norm"]
    assert "gate_up_order" in FEEDS["mlp"]  # a field the old hand-written table left out
    for kind, names in FEEDS.items():
        assert all(kind in FIELD_INFO[n].probe for n in names)


def test_a_list_of_default_is_not_shared_between_specs():
    a, b = Spec(), Spec()
    a.sliding_window_layers.append(1)
    a.names["mlp"] = "ffn"
    assert b.sliding_window_layers == [] and b.names["mlp"] == "mlp"


@pytest.mark.parametrize("name, value, problem", [
    ("sliding_window_layers", 3, "field 'sliding_window_layers' must be list, not 3"),
    ("sliding_window_layers", ["0"], "field 'sliding_window_layers' must be list, not ['0']"),
    ("sliding_window_layers", [2000], "must list layer numbers from 0 to 1023"),
    ("num_heads", "four", "field 'num_heads' must be int, not 'four'"),
    ("num_heads", True, "field 'num_heads' must be int, not True"),
    ("num_layers", 10**9, "field 'num_layers' must be between 0 and 1024, not 1000000000"),
    ("qkv_layout", "diagonal",
     "must be one of ('separate', 'fused', 'interleaved', 'grouped', 'blocked', 'kv_pairs', 'latent', 'routed'), "
     "not 'diagonal'"),
    ("norm_eps", math.nan, "field 'norm_eps' must be float, not nan"),
    ("names", {"mlp": 3}, "field 'names' must be dict, not {'mlp': 3}"),
    ("rope_parameters", {"rope_theta": object}, "field 'rope_parameters' must be dict"),
])
def test_field_problem_holds_a_value_to_its_declaration(name, value, problem):
    assert problem in (field_problem(name, value) or "")


@pytest.mark.parametrize("name, value", [("sliding_window_layers", [0, 2]), ("sliding_window", None),
                                         ("attention_scale", 0.125), ("rope_parameters", {"rope_theta": 1e4}),
                                         ("gate_extra_bias", "gate_bias"), ("num_layers", 1024)])
def test_field_problem_passes_values_of_the_declared_type(name, value):
    assert field_problem(name, value) is None


def test_an_int_in_a_float_field_becomes_a_float():
    assert field_value("attention_scale", 1) == 1.0 and type(field_value("attention_scale", 1)) is float
    assert type(field_value("num_layers", 3)) is int and field_value("tie_word_embeddings", True) is True


def test_overrides_and_pinning_use_the_same_check():
    for apply in (lambda s: s.pin({"sliding_window_layers": 3}, "f.toml"),
                  lambda s: s.apply_overrides({"sliding_window_layers": 3}, "f.toml")):
        spec = Spec()
        spec.set("num_layers", 2, Source("config", "x"))
        with pytest.raises(SpecError, match="field 'sliding_window_layers' must be list, not 3"):
            apply(spec)


@pytest.mark.parametrize("line, problem", [
    ("sliding_window_layers = 3", "field 'sliding_window_layers' must be list, not 3."),
    ('qkv_layout = "diagonal"', "field 'qkv_layout' must be one of"),
    ("num_layers = 1_000_000_000", "field 'num_layers' must be between 0 and 1024"),
    ("norm_eps = nan", "field 'norm_eps' must be float, not nan."),
    ('code_helpers = ["def f(v):\\n    import os\\n    return v"]',
     "field 'code_helpers' holds 'def f(v):\\n    import os\\n    return v', which the port cannot carry: line 2 is not"),
])
def test_inspect_and_new_refuse_a_bad_spec_value_alike(tmp_path, line, problem):
    """`inspect --spec` once accepted `sliding_window_layers = 3` where `new` refused it: one check now."""
    spec_file = tmp_path / "spec.toml"
    spec_file.write_text(line + "\n")
    errors = []
    for command in (["inspect", DEMOLM], ["new", DEMOLM, "-o", tmp_path / "port"],
                    ["inspect", DEMOLM, "--spec-template", tmp_path / "template.toml"]):
        proc = scaffold(*command, "--spec", spec_file, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        errors.append(proc.stderr.strip())
    assert len(set(errors)) == 1 and problem in errors[0], errors
    assert not (tmp_path / "port").exists() and not (tmp_path / "template.toml").exists()
