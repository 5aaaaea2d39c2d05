"""The whole transformers catalogue, one test per model_type (tests/catalogue.py says how each is measured).

The full catalogue is marked `slow` and `engine`: it is what scripts/catalogue.py runs to write
docs/catalogue.md. A small fixed subset (PER_COMMIT) carries only `engine`, so the per-commit suite
ports and verifies a few families and stays cheap. SCAFFOLD_CATALOGUE_VERIFY=0 ports without verifying
(rows then say "ports; parity not measured yet"). When SCAFFOLD_CATALOGUE_RESULTS names a file, each
test writes the rows measured so far there (after every test, so an interrupted run keeps its rows).

The quick tier checks the document: it lists every model type of the installed catalogue, says what
its rows say (totals included), and its out-of-scope reasons are what the config and code give today.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from catalogue import CATALOGUE, TOLERANCE, catalogue, out_of_scope, recorded_rows, render, summary_lines, totals
from catalogue import measure as measure_type

# Families the per-commit suite measures: a plain dense decoder, one with q/k norms, one MoE.
PER_COMMIT = ("qwen3",)  # one family per commit: test_architectures already runs llama and qwen2_moe shapes
RESULTS_FILE = "SCAFFOLD_CATALOGUE_RESULTS"  # environment variable scripts/catalogue.py sets
RESULTS: dict[str, dict] = {}
CATALOGUE_TYPES = catalogue()


def _params():
    return [pytest.param(t, marks=[pytest.mark.engine] if t in PER_COMMIT else [pytest.mark.engine, pytest.mark.slow, pytest.mark.catalogue])
            for t in CATALOGUE_TYPES]


@pytest.mark.slow  # imports transformers' auto mappings (~13 s of torch imports)
def test_catalogue_read_from_source_is_transformers_mapping():
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert CATALOGUE_TYPES == dict(sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()))


@pytest.mark.parametrize("model_type", _params())
def test_catalogue_type(model_type, workdir):
    """Out of scope with a reason, refused naming the feature, or ported and at parity with transformers."""
    run_verify = os.environ.get("SCAFFOLD_CATALOGUE_VERIFY", "1") != "0"
    row = RESULTS[model_type] = measure_type(model_type, CATALOGUE_TYPES[model_type], workdir / "catalogue",
                                             run_verify=run_verify)
    target = os.environ.get(RESULTS_FILE)
    if target:
        Path(target).write_text(json.dumps({"order": list(CATALOGUE_TYPES), "rows": RESULTS}, sort_keys=True),
                                encoding="utf-8")
    assert row["status"] in ("out of scope", "refused", "ports", "parity"), json.dumps(row, indent=2)
    if row["status"] == "refused":
        assert row["feature"] and "Traceback" not in row["detail"], row
        assert "failed unexpectedly" not in row["detail"], row  # a crash is not a refusal
    if row["status"] == "parity":
        assert row["max_delta"] <= TOLERANCE


@pytest.fixture(autouse=True)
def _catalogue_workdir(workdir):
    (workdir / "catalogue").mkdir(exist_ok=True)


# ------------------------------------------------------------------ docs/catalogue.md (quick tier)
def test_catalogue_doc_lists_every_installed_type():
    rows = recorded_rows()
    missing = sorted(set(CATALOGUE_TYPES) - set(rows))
    gone = sorted(set(rows) - set(CATALOGUE_TYPES))
    assert not missing and not gone, (f"{CATALOGUE.name} is stale (missing {missing}, no longer installed {gone}); "
                                      "run python scripts/catalogue.py")
    for name, row in rows.items():
        assert row["class"] == CATALOGUE_TYPES[name], name
        assert row["measured"], name


def test_catalogue_doc_is_what_the_script_renders_and_totals_match_rows():
    rows = recorded_rows()
    text = CATALOGUE.read_text(encoding="utf-8")
    assert text == render(rows), f"{CATALOGUE.name} was edited by hand; run python scripts/catalogue.py"
    t = totals(rows)
    assert t["parity"] + t["fail"] + t["ports"] + t["refused"] + t["build_failed"] == t["in_scope"]
    assert t["in_scope"] + t["out_of_scope"] == len(CATALOGUE_TYPES)
    assert sum(n for _, n in t["by_feature"]) == t["refused"]
    for line in summary_lines(t):
        assert line in text


@pytest.mark.slow  # reads the config and modeling code of all 178 types: the longest quick-tier test (24 s under load)
def test_catalogue_out_of_scope_reasons_are_current():
    """The reasons come from the installed config and modeling code; a row must say what they say today."""
    rows = recorded_rows()
    for name in CATALOGUE_TYPES:
        reason = out_of_scope(name)
        row = rows.get(name)
        if row is None:
            continue
        if reason:
            assert row["status"] == "out of scope" and row["detail"] == reason, (name, reason, row["detail"])
        else:
            assert row["status"] != "out of scope", (name, row["detail"])


def test_decoder_half_of_an_encoder_decoder_is_read_from_the_causal_lm_class():
    """TrOCR's config is the decoder's alone (no is_encoder_decoder); its causal-LM class says what it is."""
    from catalogue import decoder_of_encoder_decoder

    lab = '''
class LabDecoderForCausalLM(LabPreTrainedModel):
    def __init__(self, config):
        config = copy.deepcopy(config)
        config.is_decoder = True
        config.is_encoder_decoder = False
        super().__init__(config)
'''
    assert decoder_of_encoder_decoder(lab, "modeling_lab.py") == (
        "its decoder half: LabDecoderForCausalLM.__init__ sets config.is_encoder_decoder = False (modeling_lab.py:6)")
    # A decoder-only model whose layers may build cross-attention by config (GPT-2's add_cross_attention) is not one.
    plain = lab.replace("config.is_encoder_decoder = False", "config.add_cross_attention = False")
    assert decoder_of_encoder_decoder(plain, "modeling_lab.py") is None
    assert out_of_scope("gpt2") is None
