"""The filters through which checkpoint values reach generated files: py, md, checked_expr, toml."""

from __future__ import annotations

import ast
import math

import pytest
import tomllib

from scaffold.errors import ScaffoldError
from scaffold.render import MAX_LITERAL_DEPTH, checked_expr, py_literal
from scaffold.spec import OMITTED_WHEN_EMPTY, Source, Spec
from scaffold.tomlio import comment_text as toml_comment
from scaffold.tomlio import spec_toml as to_toml
from scaffold.tomlio import string as toml_string
from scaffold.text import markdown_text

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
                if value is not None and (value or name not in OMITTED_WHEN_EMPTY)}
    assert written == expected
