"""scaffold.tomlio, the one TOML writer: what it writes reads back through tomllib as the same values, and text
from a checkpoint stays inside its string or its comment."""

from __future__ import annotations

import math

import pytest
import tomllib
from helpers import EXAMPLES

from scaffold import tomlio
from scaffold.checkpoint import read_checkpoint
from scaffold.detect import understand
from scaffold.errors import SpecError
from scaffold.spec import FIELDS, Source, Spec, Unknown, omitted

STRINGS = ["", "plain", 'q"uote', "it's", "back\\slash", "new\nline", "cr\r\ntab\t", "nul\x00 esc\x1b del\x7f",
           "caf\u00e9 \u2028 \U0001f600 \u4e2d\u6587", "\\u0041 not an escape", "'''", '"""', "# not a comment",
           "[spec]\nhidden_size = 1"]


@pytest.mark.parametrize("text", STRINGS)
def test_a_string_reads_back_exactly(text):
    assert tomllib.loads(f"v = {tomlio.string(text)}\n")["v"] == text
    doc = tomlio.document(["header"], {"t": tomlio.table({text: text, "list": [text, 1], "inline": {text: [text]}})})
    assert tomllib.loads(doc) == {"t": {text: text, "list": [text, 1], "inline": {text: [text]}}}


@pytest.mark.parametrize("text", ["detail\nevil = true", "a\r[spec]\rb = 1", "x\x00\x1b\u2028y = 2", "é\n#\n"])
def test_a_comment_stays_one_comment(text):
    doc = tomlio.document([text], {"t": tomlio.table({"k": 1}, note=text)})
    assert tomllib.loads(doc) == {"t": {"k": 1}}
    line = "# " + tomlio.comment_text(text)
    assert [row for row in doc.splitlines() if row] == [line, "[t]", line, "k = 1"], doc


def test_numbers_booleans_and_none():
    values = {"t": True, "f": False, "i": -7, "big": 2**62, "x": 0.1, "tiny": 1e-300, "e": 1e16, "inf": math.inf,
              "ninf": -math.inf, "none": None, "d": {"a": None, "b": 1}, "empty": {}, "nested": {"a": {"b": [1.5]}}}
    data = tomllib.loads(tomlio.document([], {"t": tomlio.table(values)}))["t"]
    expected = {k: v for k, v in values.items() if v is not None}
    expected["d"] = {"b": 1}
    assert data == expected and type(data["x"]) is float and type(data["i"]) is int


def test_what_toml_cannot_hold_is_refused():
    with pytest.raises(SpecError, match="surrogate"):
        tomlio.string("a\ud800b")
    with pytest.raises(SpecError, match="null"):
        tomlio.value([1, None])
    with pytest.raises(SpecError, match="cannot be written"):
        tomlio.value(object())


def test_spec_toml_round_trips_every_field_with_hostile_sources():
    spec = Spec(architecture="XForCausalLM", model_type="x", class_prefix="X", package="x_vllm",
                rope_parameters={"rope_type": 'li"near\n', "factor": 2.0, "ünï": "çødé", "nan": math.nan},
                sliding_window_layers=[0, 2], attention_scale=0.125, skipped_tensors=["a.inv_freq"])
    spec.set("hidden_size", 64, Source("config", "config.json hidden_size\nhidden_size = 999\n# "))
    spec.set("norm_eps", 1e-5, Source("override", "spec \u2028 file\r[port]"))
    port = {"checkpoint": "/tmp/ck\"pt\n", "scaffold_version": "0.1.0", "trust_remote_code": False}
    data = tomllib.loads(tomlio.spec_toml(spec, port=port))
    written, expected = data["spec"], {n: v for n, v in spec.to_dict().items()
                                       if v is not None and not omitted(n, v)}
    assert math.isnan(written["rope_parameters"].pop("nan")) and math.isnan(expected["rope_parameters"].pop("nan"))
    assert written == expected and data["port"] == port
    assert set(written) <= set(FIELDS)


def test_spec_template_reads_back_and_keeps_unknowns_commented():
    ckpt = read_checkpoint(EXAMPLES / "demolm")
    spec = understand(ckpt)
    spec.unknowns["num_layers"] = Unknown("num_layers", "reason\nnum_layers = 7", (("n\nlayers = 1", "why\n"),))
    text = tomlio.spec_template(spec, "/ckpt\n[spec]", ckpt.config, list(ckpt.tensors))
    data = tomllib.loads(text)["spec"]
    assert "num_layers" not in data and data["hidden_size"] == spec.hidden_size
    assert data["names"] == spec.names and data["config_keys"]["hidden_size"] == "hidden_size"
    assert "# num_layers = " in text
