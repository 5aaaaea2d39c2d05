"""The filters through which checkpoint values reach generated files: py, md, checked_expr, toml; and how the
templates are put together: partials, and the flags and imports computed for them (scaffold.model_context)."""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import jinja2
import pytest
import tomllib

from scaffold.errors import ScaffoldError
from scaffold.model_context import IMPORT_LINE_LENGTH, Import, choices, imports, logits_processor_arguments
from scaffold.render import MAX_LITERAL_DEPTH, checked_expr, environment, is_partial, py_literal, templates_dir
from scaffold.spec import Source, Spec, omitted
from scaffold.text import markdown_text
from scaffold.tomlio import comment_text as toml_comment
from scaffold.tomlio import spec_toml as to_toml
from scaffold.tomlio import string as toml_string

NASTY = "a'b\"c\\d\ne\tf\x00g\u2028h</script>`|"


@pytest.mark.parametrize("value", [None, True, False, 0, -7, 2**70, 0.1, -1e-300, "", NASTY, [1, [2, (3,)]],
                                   (), ("x",), {"k": [1.5, None], 3: "v"}, {"rope_type": "linear", "factor": 2.0}])
def test_py_literal_reads_back_as_the_same_value(value):
    text = py_literal(value)
    assert ast.literal_eval(text) == value and type(ast.literal_eval(text)) is type(value)


def test_non_finite_floats_become_literals_no_name_can_shadow():
    assert py_literal(float("inf")) == "1e999" and py_literal(-float("inf")) == "-1e999"  # no name to shadow
    assert math.isnan(eval(py_literal(float("nan"))))
    assert py_literal({1, "a"}) == "{'a', 1}" and py_literal(set()) == "set()"  # sorted: the same text every run


@pytest.mark.parametrize("value", [object(), b"bytes", {(1, 2): "tuple key"}, Source("config", "x")])
def test_py_literal_refuses_anything_but_plain_data(value):
    with pytest.raises(ScaffoldError, match="refusing to render"):
        py_literal(value)


def test_py_literal_refuses_deep_nesting():
    value: list = []
    for _ in range(MAX_LITERAL_DEPTH + 2):
        value = [value]
    with pytest.raises(ScaffoldError, match="nested more than"):
        py_literal(value)


def test_markdown_text_stays_on_one_line_and_out_of_markup():
    text = markdown_text("x`y|z<b>\nnext\x1b[31m")
    assert text == "x'y/z(b>\\nnext\\x1b[31m"  # no tag can open: '<' is gone, '>' alone is text
    assert markdown_text(3.5) == "3.5"
    # A `<` before a space opens no tag or autolink (mail ones included): a comparison reads as written.
    assert markdown_text("layer_idx < config.k, a<=b, <a@b.c>, <http://x>, <!--") == \
        "layer_idx < config.k, a(=b, (a@b.c>, (http://x>, (!--"


@pytest.mark.parametrize("expr", ["config.hidden_size // config.num_attention_heads",
                                  "getattr(config, 'head_dim', 64)", "1.0 / config.logits_scaling",
                                  "config.rope_parameters['rope_theta']", "config.hidden_size**0.5"])
def test_checked_expr_passes_plain_reads_of_the_config(expr):
    assert checked_expr(expr, "field") == expr


@pytest.mark.parametrize("expr", ["__import__('os').system('x')", "config.__class__", "open('f')",
                                  "getattr(config, '__dict__')", "lambda: 1", "config.a\n", "x.y", "config.a +"])
def test_checked_expr_refuses_anything_that_would_run_code(expr):
    with pytest.raises(ScaffoldError, match="not a plain read of the config"):
        checked_expr(expr, "field")


@pytest.mark.parametrize("value", ["", "plain", NASTY, "\x7f\x01", "tab\tand \U0001f600", "C:\\path\\"])
def test_toml_string_reads_back_exactly(value):
    assert tomllib.loads(f"v = {toml_string(value)}")["v"] == value


def test_toml_string_refuses_a_lone_surrogate():
    with pytest.raises(ScaffoldError, match="surrogate"):
        toml_string("a\ud800b")


def test_toml_comment_cannot_end_the_comment():
    line = "# " + toml_comment("detail\nevil = true")
    assert tomllib.loads(line + "\n") == {}


def test_to_toml_round_trips_every_field_it_writes():
    spec = Spec(architecture="XForCausalLM", model_type="x", class_prefix="X", package="x_vllm", hidden_size=64,
                rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}, sliding_window=None,
                sliding_window_layers=[0, 2], attention_scale=0.125)
    spec.set("hidden_size", 64, Source("config", "config.json hidden_size\nwith a newline"))
    written = tomllib.loads(to_toml(spec))["spec"]
    assert "sliding_window" not in written  # None is left out: TOML has no null
    expected = {name: value for name, value in spec.to_dict().items()
                if value is not None and not omitted(name, value)}
    assert written == expected


# ------------------------------------------------------------------ templates: partials, computed context
def test_every_partial_is_included_by_name_and_every_include_exists():
    """A partial nobody includes is dead; an include of a missing file fails only for the ports that reach it."""
    env, root = environment(), templates_dir()
    included = set()
    for path in root.rglob("*.j2"):
        for node in env.parse(path.read_text(encoding="utf-8")).find_all(jinja2.nodes.Include):
            assert isinstance(node.template, jinja2.nodes.Const), f"{path}: include names its partial literally"
            included.add(node.template.value)
    package = root / "package"
    partials = {p.relative_to(root).as_posix() for p in package.rglob("*.j2") if is_partial(p.relative_to(package))}
    assert partials, "no partials found under templates/package/"
    assert included == partials


def test_partials_are_never_files_of_the_package():
    assert is_partial(Path("__package__/_parts/mlp.py.j2"))
    assert not is_partial(Path("__package__/model.py.j2")) and not is_partial(Path("tests/conftest.py.j2"))
    assert not is_partial(Path("README.md.j2"))


def test_templates_leave_whitespace_to_trim_blocks_and_lstrip_blocks():
    """Control tags sit on lines of their own (or inside a line of code); no hand-made whitespace control."""
    for path in templates_dir().rglob("*.j2"):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not re.search(r"\{%-|-%\}|\+%\}|\{#-|-#\}", line), f"{path}:{number}: {line.strip()}"


def test_import_text_is_one_line_unless_long_or_asked():
    assert Import("re").text == "import re"
    assert Import("torch", ("nn",)).text == "from torch import nn"
    assert Import("m", ("a", "b"), one_per_line=True).text == "from m import (\n    a,\n    b,\n)"
    long = Import("vllm.model_executor.layers.fused_moe", ("GateLinear", "fused_moe_make_expert_params_mapping"))
    assert len(f"from {long.module} import {', '.join(long.names)}") > IMPORT_LINE_LENGTH
    assert long.text.splitlines() == ["from vllm.model_executor.layers.fused_moe import (", "    GateLinear,",
                                      "    fused_moe_make_expert_params_mapping,", ")"]


def imported_names(spec: Spec, act_and_mul: bool = True) -> set[str]:
    flags = choices(spec, set())
    stdlib, third_party = imports(spec, flags, act_and_mul)
    return {name for imp in stdlib + third_party for name in (imp.names or (imp.module,))}


def test_imports_follow_the_choices_that_use_them():
    dense = Spec(mlp_kind="gated")
    names = imported_names(dense)
    assert {"SupportsLoRA", "MergedColumnParallelLinear", "get_act_and_mul_fn", "get_rope", "RMSNorm"} <= names
    assert not names & {"math", "ColumnParallelLinear", "GateLinear", "ReplicatedLinear", "set_weight_attrs",
                        "get_tensor_model_parallel_rank", "tensor_model_parallel_all_gather", "LayerNorm"}
    assert "get_act_fn" in imported_names(dense, act_and_mul=False)
    plain = imported_names(Spec(mlp_kind="plain", norm_kind="layer", position_scheme="alibi", qk_norm="full"))
    assert {"ColumnParallelLinear", "get_act_fn", "LayerNorm", "math", "get_tensor_model_parallel_rank",
            "tensor_model_parallel_all_gather", "split_tensor_along_last_dim"} <= plain
    assert not plain & {"MergedColumnParallelLinear", "get_rope", "RMSNorm"}
    offset = imported_names(Spec(norm_kind="layer", norm_offset=1.0))
    assert "LayerNorm" not in offset and "LayerNorm1P" not in offset  # the port's own class
    assert "GemmaRMSNorm" in imported_names(Spec(norm_offset=1.0))
    assert {"sharded_weight_loader", "set_weight_attrs"} <= imported_names(Spec(gate_extra_bias="gating_bias"))


def test_moe_ports_import_and_declare_the_same_interfaces():
    moe = Spec(mlp_kind="gated")
    moe.names = {**moe.names, "experts": "experts", "router": "gate"}
    assert moe.is_moe
    flags = choices(moe, set())
    assert "SupportsLoRA" not in flags["interfaces"] and "SupportsLoRA" not in imported_names(moe)
    assert "SupportsLoRA" in choices(Spec(), set())["interfaces"] and "SupportsLoRA" in imported_names(Spec())


def test_packed_modules_name_the_checkpoint_modules_a_parameter_packs():
    assert choices(Spec(mlp_kind="gated"), set())["packed_modules"] == {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    fused = Spec(mlp_kind="gated", qkv_layout="fused", gate_up_layout="fused")
    assert choices(fused, set())["packed_modules"] == {"qkv_proj": ["qkv_proj"], "gate_up_proj": ["gate_up_proj"]}
    assert choices(Spec(mlp_kind="plain"), set())["packed_modules"] == {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}


def test_overridden_values_become_literals():
    flags = choices(Spec(), {"tie_word_embeddings", "sliding_window_layers"})
    assert flags["literal_tie"] and flags["TIED"] == "TIE_WORD_EMBEDDINGS" and flags["literal_layers"]
    assert not flags["literal_rope"] and choices(Spec(), {"partial_rotary_factor"})["literal_rope"]
    assert choices(Spec(), set())["TIED"] == "config.tie_word_embeddings"


def test_logits_processor_takes_scale_and_soft_cap_only_where_the_model_has_them():
    def cfg(name):
        return f"<{name}>"

    assert logits_processor_arguments(Spec(), cfg) == ["<vocab_size>"]
    assert logits_processor_arguments(Spec(logits_scale=0.5, final_logit_softcap=30.0), cfg) == [
        "<vocab_size>", "scale=<logits_scale>", "soft_cap=<final_logit_softcap>"]
