"""Property-based: random valid Llama-family checkpoints generate sound ports; random corruptions fail cleanly.

Valid checkpoints vary the family (llama / mistral / qwen2 / qwen3 layouts),
heads, KV heads, head_dim (explicit or derived), layers, biases, tying, sliding
windows, a model_type transformers does not know (so the port declares its own
config class), and extra config.json keys holding arbitrary JSON. Each must give a
package whose Python parses and lints clean, whose pure-python parts import and
reproduce config.json, and that passes verify's own static mapping checks.

Corruptions of valid checkpoints (truncated shards, overwritten header bytes,
dropped / duplicated / reshaped tensors, bad index entries, bad config values)
must each make `scaffold new` exit 2 with one line naming a file of the
checkpoint, no traceback, and nothing written.

The CLI runs in-process through click's CliRunner (a subprocess per example would
cost most of the time budget); an exception escaping the CLI shows up as
`result.exception`, which is what a traceback would be. tests/test_robustness.py
runs the fixed catalogue through real subprocesses. One fixed example runs the
generated package's own weight-mapping tests in the real vLLM engine.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib
from ckpt_factory import FAMILIES, Shape, read_header, shard_of, write_checkpoint
from click.testing import CliRunner
from helpers import own_weight_tests_pass
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from robustness_doc import record

from scaffold.cli import main

SETTINGS = {"deadline": None, "derandomize": True, "suppress_health_check": [HealthCheck.too_slow],
            "database": None}


# ---------------------------------------------------------------- strategies
IDENT = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)
JSON_LEAF = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
             | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=3)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


@st.composite
def shapes(draw) -> Shape:
    family = draw(st.sampled_from(FAMILIES))
    kv = draw(st.sampled_from([1, 2, 4]))
    heads = kv * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    explicit = draw(st.booleans())
    hidden = draw(st.sampled_from([16, 32, 48, 64, 96])) if explicit else heads * head_dim
    layers = draw(st.integers(1, 3))
    window = None
    sliding_layers = None
    if family != "llama" and draw(st.booleans()):
        window = draw(st.integers(1, 64))
        if family in ("qwen2", "qwen3"):
            sliding_layers = tuple(i for i in range(layers) if draw(st.booleans()))
    custom = draw(st.booleans())
    extra = draw(st.dictionaries(IDENT.map(lambda k: "x_" + k), JSON_VALUE, max_size=3))
    if custom and draw(st.booleans()):
        extra["not an identifier"] = draw(JSON_VALUE)
    return Shape(
        family=family, hidden=hidden, heads=heads, kv_heads=kv, head_dim=head_dim, explicit_head_dim=explicit,
        layers=layers, intermediate=draw(st.integers(1, 12)) * 8, vocab=draw(st.integers(16, 200)),
        tie=draw(st.booleans()), attention_bias=family in ("llama", "qwen3") and draw(st.booleans()),
        mlp_bias=family == "llama" and draw(st.booleans()), sliding_window=window, sliding_layers=sliding_layers,
        model_type=f"prop_{family}" if custom else None, architecture=f"Prop{family.capitalize()}ForCausalLM",
        rope_theta=draw(st.floats(100.0, 1e6)), rms_norm_eps=draw(st.floats(1e-7, 1e-3)), extra=extra,
    )


# ------------------------------------------------------------------- helpers
def run_cli(*args) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    exc = result.exception if not isinstance(result.exception, SystemExit) else None
    return result.exit_code, result.stderr, exc


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


def static_checks(port: Path) -> dict[str, tuple[str, str]]:
    """verify's static checks (what `verify --static-only` runs, without its engine subprocesses)."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.verify.port import load_port
    from scaffold.verify.report import Report
    from scaffold.verify.static import run_static

    loaded = load_port(port)
    report = Report(str(port), str(loaded.checkpoint))
    run_static(report, loaded, read_checkpoint(loaded.checkpoint))
    return {c.name: (c.status, c.detail) for c in report.checks}


COUNTS = {"valid": 0, "register_config": 0, "corrupt": {}}
ROWS: list[list] = []
VALID_EXAMPLES, CORRUPT_EXAMPLES = 24, 9


# ------------------------------------------------------------- valid inputs
@settings(max_examples=VALID_EXAMPLES, **SETTINGS)
@given(shape=shapes(), shards=st.sampled_from([1, 2]))
@pytest.mark.slow  # ~19 s on 2 cores: 24 drawn checkpoints, each through `scaffold new`
def test_valid_checkpoints_give_sound_ports(shape, shards):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = write_checkpoint(root / "ckpt", shape, shards=shards, data="zeros")
        out = root / "port"
        code, err, exc = run_cli("new", ckpt, "-o", out)
        assert exc is None and code == 0, (code, err, exc)
        config = json.loads((ckpt / "config.json").read_text())
        package = next(p for p in out.iterdir() if (p / "model.py").exists())

        # Every Python file parses and lints clean on its own (not only inside write_package).
        files = sorted(out.rglob("*.py"))
        for path in files:
            ast.parse(path.read_text(encoding="utf-8"))
        lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", *map(str, files)],
                              check=False, capture_output=True, text=True)
        assert lint.returncode == 0, lint.stdout

        # The pure-python parts import; a generated config class reproduces config.json.
        tag = f"prop_{os.getpid()}_{COUNTS['valid']}"
        init = load_module(package / "__init__.py", tag)
        assert init.ARCHITECTURE == shape.architecture and callable(init.register)
        if (package / "configuration.py").exists():
            COUNTS["register_config"] += 1
            module = load_module(package / "configuration.py", tag + "_configuration")
            cls = next(v for k, v in vars(module).items() if k.endswith("Config") and k != "PretrainedConfig")
            assert cls.model_type == config["model_type"]
            default, loaded = cls(), cls(**config)
            declared = cls.__init__.__code__.co_varnames[1:cls.__init__.__code__.co_argcount]
            assert set(declared) >= {"hidden_size", "num_attention_heads", "vocab_size"}
            for key in declared:
                assert same(getattr(default, key), config[key]), key
                assert same(getattr(loaded, key), config[key]), key
            if "not an identifier" in config:
                assert "not an identifier" not in declared
                assert same(getattr(loaded, "not an identifier"), config["not an identifier"])

        # The recorded spec is valid TOML and says what the checkpoint says.
        recorded = tomllib.loads((out / "scaffold_spec.toml").read_text())
        spec = recorded["spec"]
        assert (spec["num_heads"], spec["num_kv_heads"], spec["head_dim"], spec["num_layers"]) == (
            shape.heads, shape.kv_heads, shape.head_dim, shape.layers)
        assert spec["tie_word_embeddings"] == shape.tie and recorded["port"]["checkpoint"] == str(ckpt.resolve())
        if shape.sliding_window:
            expected = (list(range(shape.layers)) if shape.sliding_layers is None else list(shape.sliding_layers))
            assert spec["sliding_window"] == shape.sliding_window
            assert spec["sliding_window_layers"] == expected

        # verify's own static checks pass.
        checks = static_checks(out)
        for name in ("mapping coverage", "per-shard shapes", "q/k/v and gate/up order", "vocabulary",
                     "tied embeddings", "spec matches checkpoint"):
            assert checks[name][0] == "pass", (name, checks[name])
        assert sorted(p.name for p in root.iterdir()) == ["ckpt", "port"]
        COUNTS["valid"] += 1


# --------------------------------------------------------------- corruptions
def shard_files(root: Path) -> list[Path]:
    return sorted(root.glob("*.safetensors"))


def truncate_shard(root: Path, draw) -> str:
    path = draw(st.sampled_from(shard_files(root)))
    size = path.stat().st_size
    keep = draw(st.integers(0, size - 1))
    with open(path, "r+b") as f:
        f.truncate(keep)
    return f"truncate {path.name} to {keep} of {size} bytes"


def overwrite_header_byte(root: Path, draw) -> str:
    path = draw(st.sampled_from(shard_files(root)))
    blob = bytearray(path.read_bytes())
    _, n = read_header(path)
    pos = draw(st.integers(0, 8 + n - 1))
    new = draw(st.integers(0, 255).filter(lambda b: b != blob[pos]))
    blob[pos] = new
    path.write_bytes(bytes(blob))
    return f"byte {pos} of {path.name} set to {new}"


def _rewrite(root: Path, tensor: str, fn) -> None:
    """Apply fn(tensors) to the shard holding `tensor`, rewriting it with a consistent header and data."""
    from ckpt_factory import write_shard

    path = shard_of(root, tensor)
    entries, _ = read_header(path)
    table = {name: e["shape"] for name, e in entries.items()}
    fn(table)
    write_shard(path, table, data="zeros")


def _index_update(root: Path, fn) -> None:
    index = root / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        fn(data["weight_map"])
        index.write_text(json.dumps(data))


def drop_tensor(root: Path, draw) -> str:
    names = sorted(n for p in shard_files(root) for n in read_header(p)[0])
    name = draw(st.sampled_from(names))
    _rewrite(root, name, lambda t: t.pop(name))
    _index_update(root, lambda m: m.pop(name))
    return f"drop {name}"


def duplicate_tensor(root: Path, draw) -> str:
    names = sorted(n for p in shard_files(root) for n in read_header(p)[0])
    name = draw(st.sampled_from(names))
    source = shard_of(root, name)
    target = draw(st.sampled_from(shard_files(root)))
    shape = read_header(source)[0][name]["shape"]
    if target == source:  # the same name twice in one header
        entries, _ = read_header(target)
        blob = target.read_bytes()
        import struct

        (n,) = struct.unpack("<Q", blob[:8])
        text = blob[8:8 + n].decode()
        raw = (text[:-1] + "," + json.dumps({name: entries[name]}, separators=(",", ":"))[1:-1] + "}").encode()
        target.write_bytes(struct.pack("<Q", len(raw)) + raw + blob[8 + n:])
        return f"{name} twice in the header of {target.name}"
    other = next(n for n in read_header(target)[0])
    _rewrite(root, other, lambda t: t.update({name: shape}))
    return f"{name} also stored in {target.name}"


def reshape_tensor(root: Path, draw) -> str:
    names = sorted(n for p in shard_files(root) for n in read_header(p)[0])
    name = draw(st.sampled_from(names))
    entries, _ = read_header(shard_of(root, name))
    shape = list(entries[name]["shape"])
    axis = draw(st.integers(0, len(shape) - 1))
    shape[axis] += draw(st.sampled_from([-2, -1, 1, 2, 3]))
    if shape[axis] < 0:
        shape[axis] = shape[axis] + 5
    _rewrite(root, name, lambda t: t.update({name: shape}))
    return f"{name} reshaped to {shape}"


def bad_index_entry(root: Path, draw) -> str:
    index = root / "model.safetensors.index.json"
    if not index.exists():
        return overwrite_header_byte(root, draw)
    data = json.loads(index.read_text())
    names = sorted(data["weight_map"])
    name = draw(st.sampled_from(names))
    shards = sorted(set(data["weight_map"].values()))
    kind = draw(st.sampled_from(["dotdot", "absolute", "missing", "wrong", "drop", "phantom", "empty", "number"]))
    if kind == "drop":
        data["weight_map"].pop(name)
    elif kind == "phantom":
        data["weight_map"]["model.layers.99.mlp.up_proj.weight"] = shards[0]
    else:
        other = next(s for s in shards if s != data["weight_map"][name])
        data["weight_map"][name] = {"dotdot": "../" + shards[0], "absolute": str(root / shards[0]),
                                    "missing": "model-00009-of-00009.safetensors", "wrong": other, "empty": "",
                                    "number": 7}[kind]
    index.write_text(json.dumps(data))
    return f"index entry {name}: {kind}"


BAD_CONFIG = {
    "hidden_size": ["abc", -1, 0, 2.5, True, [64], None],
    "num_hidden_layers": ["3", -1, 0, 1.0, False, None, 99],
    "num_attention_heads": [0, -4, "4", 3.0, None, 7],
    "num_key_value_heads": [0, "2", 2.0, 3, 5],
    "vocab_size": [0, "128", 1e3, 7],
    "intermediate_size": [0, "96", [96], 13],
    "head_dim": [0, "16", 15, 4.0],
    "rms_norm_eps": [0, -1e-6, "1e-6", float("nan"), float("inf"), True],
    "rope_theta": [0, -1.0, "10000", float("nan"), float("inf")],
    "max_position_embeddings": [0, -1, "512", 1.5],
    "tie_word_embeddings": ["yes", 1, [True]],
    "layer_types": ["full_attention", [1, 2], {"a": 1}],
    "architectures": ["X", [], ["X(); import os"], ["Bad Name ForCausalLM"], [7], ["Model"]],
    "model_type": [7, "", 'a"b', "a\nb", "../../x", None],
    "rope_scaling": ["linear", [1], {"rope_type": 7}, {"rope_type": "linear", "factor": float("nan")}],
    "partial_rotary_factor": [0, 1.5, "half", float("nan")],
    "self": [1],
    "quantization_config": [{"quant_method": "awq"}],
}


def bad_config_value(root: Path, draw) -> str:
    key = draw(st.sampled_from(sorted(BAD_CONFIG)))
    value = draw(st.sampled_from(BAD_CONFIG[key]))
    config = json.loads((root / "config.json").read_text())
    if key == "layer_types" and isinstance(value, list):
        value = value[: config["num_hidden_layers"]]
    if key == "num_hidden_layers" and value == 99:
        value = config["num_hidden_layers"] + 1
    if key == "num_attention_heads" and value == 7:  # heads that the KV heads do not divide (or q rows off)
        value = config["num_attention_heads"] + 1
    if key in ("vocab_size", "intermediate_size") and value in (7, 13):
        value = config[key] + 1
    if key == "head_dim" and value == 15:
        value = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"]) + 2
    if key == "num_key_value_heads" and value in (3, 5):
        value = config["num_attention_heads"] + 1
    config[key] = value
    (root / "config.json").write_text(json.dumps(config))
    return f"config {key} = {value!r}"


CORRUPTIONS = {
    "truncate": truncate_shard, "header-byte": overwrite_header_byte, "drop": drop_tensor,
    "duplicate": duplicate_tensor, "reshape": reshape_tensor, "index": bad_index_entry, "config": bad_config_value,
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
@settings(max_examples=CORRUPT_EXAMPLES, **SETTINGS)
@given(shape=shapes(), shards=st.sampled_from([1, 2]), data=st.data())
def test_corrupted_checkpoints_fail_cleanly(kind, shape, shards, data):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ckpt = write_checkpoint(root / "ckpt", shape, shards=shards, data="zeros")
        what = CORRUPTIONS[kind](ckpt, data.draw)
        out = root / "port"
        code, err, exc = run_cli("new", ckpt, "-o", out)
        assert exc is None, (what, exc)  # an exception escaping the CLI is a traceback for the user
        err = err.strip()
        assert code == 2, (what, code, err)
        assert len(err.splitlines()) == 1 and err.startswith("error: "), (what, err)
        assert "failed unexpectedly" not in err, (what, err)
        assert f"error: {ckpt.resolve()}" in err or f"error: {ckpt}" in err, (what, err)  # names its file
        assert not out.exists() and sorted(p.name for p in root.iterdir()) == ["ckpt"], what
        COUNTS["corrupt"][kind] = COUNTS["corrupt"].get(kind, 0) + 1
        shown = err.replace(str(ckpt.resolve()), "CKPT").replace(str(ckpt), "CKPT").replace(str(root), "TMP")
        ROWS.append([kind, f"{shape.family}, {shards} shard(s): {what}".replace(str(root), "TMP"), code, shown])


def test_property_runs_covered_every_kind():
    """Runs after the two properties (file order): the draws exercised what they claim to."""
    if COUNTS["valid"] == 0:
        pytest.skip("the property tests did not run in this session")
    assert COUNTS["valid"] >= 10 and COUNTS["register_config"] >= 2, COUNTS
    assert set(COUNTS["corrupt"]) == set(CORRUPTIONS) and min(COUNTS["corrupt"].values()) >= 5, COUNTS
    print(f"property runs: {COUNTS}")
    if COUNTS["valid"] == VALID_EXAMPLES and all(COUNTS["corrupt"][k] == CORRUPT_EXAMPLES for k in CORRUPTIONS):
        for row in ROWS:  # kept for docs/robustness.md only while scripts/robustness_doc.py regenerates it
            record("property", row)


# ------------------------------------------------------- one engine example
ENGINE_SHAPE = Shape(family="qwen3", hidden=96, heads=4, kv_heads=2, head_dim=32, layers=2, intermediate=64,
                     vocab=192, attention_bias=True, model_type="prop_engine_lm",
                     architecture="PropEngineForCausalLM",
                     extra={"x_quote": 'a "b" \'c\'\n', "x_nan": float("nan"), "not an identifier": [1, None]})


@pytest.mark.engine
def test_generated_mapping_tests_pass_in_the_engine(tmp_path):
    """One drawn-style example end to end: the package's own weight-mapping tests in real vLLM.

    Random (not zero) data, so a swapped or mis-sized shard would be seen; a model_type
    transformers does not know, so the engine loads the generated config class, built
    from a config.json holding quotes, newlines, NaN and a key that is not an identifier.
    """
    ckpt = write_checkpoint(tmp_path / "ckpt", ENGINE_SHAPE, shards=2, seed=3)
    out = tmp_path / "port"
    code, err, exc = run_cli("new", ckpt, "-o", out)
    assert exc is None and code == 0, (err, exc)
    own_weight_tests_pass(out, at_least=6)
