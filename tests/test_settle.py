"""Settling by computing what reading the code leaves open (scaffold.settle).

The finch lab example (examples/labs/finch) keeps gate and up in one projection and cuts it by position
inside a helper (`unflatten`, then `select`) that the static analysis does not follow: the tensors say
the MLP is gated (twice the rows the down projection takes), the code reading cannot say which half is
the gate. Without --trust-remote-code the tool refuses, naming the field, both candidates and how to
settle it; with it, it runs layer 0's MLP of the reference on random weights and keeps the candidate
that reproduces it, recording the evidence in the field's source (REVIEW.md's spec table).

The variants below edit the built checkpoint's code so that the other half is the gate, or that neither
reading holds: the choice follows what the code computes, and an answer no candidate gives stays unknown.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib
from helpers import EXAMPLES, scaffold, verified_at_parity

# Each test builds the finch checkpoint in transformers (~10 s) and runs the CLI a few times: the full suite only.
pytestmark = pytest.mark.slow

GATE_SECOND = "return halves.select(-2, 0) * F.silu(halves.select(-2, 1))"


@pytest.fixture(scope="module")
def finch(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("settle")
    proc = subprocess.run([sys.executable, str(EXAMPLES / "labs" / "build.py"), str(out), "finch"],
                          capture_output=True, text=True, check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "finch"


def variant(finch: Path, where: Path, forward: str) -> Path:
    """A copy of the finch checkpoint whose swiglu returns `forward` instead (the same weights)."""
    import shutil

    shutil.copytree(finch, where)
    code = where / "modeling_finch.py"
    text = code.read_text()
    assert GATE_SECOND in text
    code.write_text(text.replace(GATE_SECOND, forward))
    return where


def spec_of(port: Path) -> dict:
    return tomllib.loads((port / "scaffold_spec.toml").read_text())["spec"]


def test_without_consent_the_refusal_names_the_field_and_how_to_settle_it(finch, tmp_path):
    out = tmp_path / "port"
    proc = scaffold("new", finch, "-o", out, "--impl", "native", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "gate_up_order: which half of ffn.w_in is the gate" in proc.stderr
    assert "--trust-remote-code" in proc.stderr and not out.exists()
    shown = json.loads(scaffold("inspect", finch, "--json", check=False).stdout)
    unknown = next(u for u in shown["unknowns"] if u["field"] == "gate_up_order")
    assert [c["candidate"] for c in unknown["candidates"]] == ["gate_first", "up_first"]


def test_with_consent_the_mlp_is_run_and_the_reading_that_reproduces_it_kept(finch, tmp_path):
    out = tmp_path / "port"
    scaffold("new", finch, "-o", out, "--trust-remote-code")
    assert spec_of(out)["gate_up_order"] == "up_first"
    row = next(line for line in (out / "REVIEW.md").read_text().splitlines() if line.startswith("| gate_up_order |"))
    assert "computed: ran net.h.0.ffn (FinchFFN, the reference's code)" in row
    assert "gate_first" in row and "up_first 0.0e+00" in row and "up_first reproduces it" in row


def test_the_choice_follows_what_the_code_computes(finch, tmp_path):
    gate_first = variant(finch, tmp_path / "gate-first", "return F.silu(halves.select(-2, 0)) * halves.select(-2, 1)")
    out = tmp_path / "port-gate-first"
    scaffold("new", gate_first, "-o", out, "--trust-remote-code")
    assert spec_of(out)["gate_up_order"] == "gate_first"
    # tanh is neither candidate's activation (silu): no reading reproduces it, so nothing is guessed.
    neither = variant(finch, tmp_path / "neither", "return halves.select(-2, 0) * torch.tanh(halves.select(-2, 1))")
    proc = scaffold("new", neither, "-o", tmp_path / "port-neither", "--trust-remote-code", "--impl", "native",
                    check=False)
    assert proc.returncode == 2 and "gate_up_order" in proc.stderr
    shown = json.loads(scaffold("inspect", neither, "--json", "--trust-remote-code", check=False).stdout)
    reason = next(u for u in shown["unknowns"] if u["field"] == "gate_up_order")["reason"]
    assert "none reproduces it" in reason


def test_a_spec_file_settles_it_without_running_anything(finch, tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('gate_up_order = "up_first"\n')
    out = tmp_path / "port"
    scaffold("new", finch, "-o", out, "--spec", spec)
    assert spec_of(out)["gate_up_order"] == "up_first"
    assert "computed:" not in (out / "REVIEW.md").read_text()


@pytest.mark.engine
def test_the_settled_port_is_at_parity(finch, tmp_path):
    out = tmp_path / "port"
    scaffold("new", finch, "-o", out, "--trust-remote-code")
    verified_at_parity(out, "--trust-remote-code")
