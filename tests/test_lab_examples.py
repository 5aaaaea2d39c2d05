"""Issue 14's acceptance examples: seven remote-code models of the project's own making (examples/labs/).

Each is written the way a lab ships its code (its own norm, rotary or ALiBi, attention and config
keys; module names and config keys that no transformers model uses) and exercises one thing a
port must read from the code rather than from a transformers model it resembles. The quick tier
builds them and checks that transformers reloads each with the logits it saved; the engine tier
ports each with no --spec and verifies it against transformers (float32: max |dlogp| <= 1e-4
over the top 20 at every position, identical greedy continuations).

A model that does not port yet carries a strict xfail naming what its refusal says it needs: the
day it ports the test fails loudly, and the marker comes off.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, own_weight_tests_pass, scaffold, verified_at_parity

LABS = EXAMPLES / "labs"
# The size keys transformers' decoders (and their GPT-2 era aliases) store: none of the labs' config.json has one.
STANDARD_KEYS = {"hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "num_layers",
                 "num_attention_heads", "n_head", "num_key_value_heads", "intermediate_size", "n_inner", "vocab_size",
                 "head_dim", "rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta",
                 "max_position_embeddings", "n_positions"}

# name: what `scaffold new --trust-remote-code` refuses it for today (None: it ports)
NOT_YET = {
    "kestrel": None,
    "osprey": None,
    "heron": None,
    "plover": None,
    "wren": None,
    "shrike": None,
    "finch": None,
}


# The labs whose parity the full suite runs (about 50 s apiece); the others are `extended`, their forms covered in the
# full suite elsewhere: kestrel's parallel block (the gpt_neox row), osprey's Conv1D layout (the gpt2 row), heron's
# grouped qkv (the real InternLM2), finch's gate/up cut settled by running its MLP (tests/test_settle.py).
SUITE_LABS = ("wren", "shrike", "plover")


def lab_params():
    return [pytest.param(name, marks=[*([pytest.mark.xfail(strict=True, reason=reason)] if reason else []),
                                      *([] if name in SUITE_LABS else [pytest.mark.extended])])
            for name, reason in NOT_YET.items()]


@pytest.fixture(scope="session")
def labs(tmp_path_factory) -> Path:
    """All seven checkpoints, built once per session by examples/labs/build.py (which checks each reload)."""
    out = tmp_path_factory.mktemp("labs")
    proc = subprocess.run([sys.executable, str(LABS / "build.py"), str(out)], capture_output=True, text=True,
                          check=False, timeout=600)
    assert proc.returncode == 0, f"examples/labs/build.py failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    (out / "build.log").write_text(proc.stdout)
    return out


def test_every_lab_has_its_sources_and_an_expectation():
    folders = sorted(p.name for p in LABS.iterdir() if p.is_dir() and not p.name.startswith("_"))
    assert folders == sorted(NOT_YET)
    for name in folders:
        assert {p.name for p in (LABS / name).glob("*.py")} == {f"configuration_{name}.py", f"modeling_{name}.py"}


@pytest.mark.slow  # builds and reloads seven models in transformers: ~50 s here
@pytest.mark.parametrize("name", sorted(NOT_YET))
def test_lab_example_builds_and_reloads(name, labs):
    """The build saved a loadable remote-code checkpoint; transformers reloaded it with the same logits."""
    ckpt = labs / name
    config = json.loads((ckpt / "config.json").read_text())
    assert config["model_type"] == name
    assert config["auto_map"]["AutoModelForCausalLM"] == f"modeling_{name}.{config['architectures'][0]}"
    for kind in ("configuration", "modeling"):
        assert (ckpt / f"{kind}_{name}.py").read_bytes() == (LABS / name / f"{kind}_{name}.py").read_bytes()
    assert (ckpt / "model.safetensors").stat().st_size > 0
    line = next(li for li in (labs / "build.log").read_text().splitlines() if li.startswith(f"{name}: "))
    assert "reload delta 0.0e+00" in line, line


@pytest.mark.slow
def test_lab_model_types_and_keys_are_no_transformers_models(labs):
    """The point of these examples: neither the model type nor a size key can be looked up by a standard name."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    for name in NOT_YET:
        config = json.loads((labs / name / "config.json").read_text())
        assert name not in CONFIG_MAPPING_NAMES
        assert not set(config) & STANDARD_KEYS, (name, sorted(set(config) & STANDARD_KEYS))


@pytest.mark.engine
@pytest.mark.parametrize("name", lab_params())
def test_lab_example_ports_at_parity(name, labs, workdir):
    out = workdir / f"port-lab-{name}"
    new = scaffold("new", labs / name, "-o", out, "--trust-remote-code", check=False)
    assert new.returncode == 0, f"scaffold new refused {name}:\n{new.stderr[-3000:]}"
    verified_at_parity(out, "--trust-remote-code")
    # The port's own tests too: a lab's norm scale named `scale` (wren) was once taken there for a quantized tensor.
    own_weight_tests_pass(out)
