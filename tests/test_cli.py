"""The CLI on the shipped example and on a many-shard checkpoint: no tensor data read, atomic output."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, scaffold

MEASURE_READS = """
import sys
from scaffold.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    io = dict(line.split(': ') for line in open('/proc/self/io').read().splitlines())
    sys.stderr.write('RCHAR=' + io['rchar'] + '\\n')
"""


def sparse_checkpoint(root: Path, shards: int = 6, layers_per_shard: int = 2, hidden: int = 4096) -> Path:
    """A Llama-shaped checkpoint whose shards have real headers and holes for data (no disk used)."""
    root.mkdir(parents=True, exist_ok=True)
    layers = shards * layers_per_shard
    config = dict(architectures=["SparseLlamaForCausalLM"], model_type="llama", hidden_size=hidden,
                  intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=hidden // 32, vocab_size=32000, rms_norm_eps=1e-5,
                  max_position_embeddings=4096, tie_word_embeddings=False, torch_dtype="bfloat16")
    (root / "config.json").write_text(json.dumps(config))
    kv = 8 * (hidden // 32)
    per_layer = {"input_layernorm.weight": [hidden], "post_attention_layernorm.weight": [hidden],
                 "self_attn.q_proj.weight": [hidden, hidden], "self_attn.k_proj.weight": [kv, hidden],
                 "self_attn.v_proj.weight": [kv, hidden], "self_attn.o_proj.weight": [hidden, hidden],
                 "mlp.gate_proj.weight": [4 * hidden, hidden], "mlp.up_proj.weight": [4 * hidden, hidden],
                 "mlp.down_proj.weight": [hidden, 4 * hidden]}
    weight_map = {}
    for s in range(shards):
        tensors = {f"model.layers.{layer}.{k}": v for layer in range(s * layers_per_shard, (s + 1) * layers_per_shard)
                   for k, v in per_layer.items()}
        if s == 0:
            tensors["model.embed_tokens.weight"] = [32000, hidden]
        if s == shards - 1:
            tensors["model.norm.weight"] = [hidden]
            tensors["lm_head.weight"] = [32000, hidden]
        header, offset = {}, 0
        for name, shape in tensors.items():
            size = 2
            for d in shape:
                size *= d
            header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        raw = json.dumps(header).encode()
        with open(root / name, "wb") as f:
            f.write(struct.pack("<Q", len(raw)) + raw)
            f.truncate(8 + len(raw) + offset)  # a hole, not data
        weight_map.update({t: name for t in tensors})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return root


def bytes_read(*args: str) -> tuple[subprocess.CompletedProcess, int]:
    proc = subprocess.run([sys.executable, "-c", MEASURE_READS, *map(str, args)], capture_output=True, text=True)
    rchar = int(proc.stderr.rsplit("RCHAR=", 1)[1].split()[0])
    return proc, rchar


def test_inspect_and_new_read_no_tensor_data(tmp_path):
    ckpt = sparse_checkpoint(tmp_path / "sparse")
    data = sum(os.path.getsize(p) for p in ckpt.glob("*.safetensors"))
    assert data > 4 * 2**30  # the shards claim over 4 GiB of tensor data
    proc, read = bytes_read("inspect", ckpt)
    assert proc.returncode == 0, proc.stderr
    assert "model.layers.11.mlp.up_proj.weight" in proc.stdout and "gate_up_proj.weight [1]" in proc.stdout
    proc, read_new = bytes_read("new", ckpt, "-o", tmp_path / "port")
    assert proc.returncode == 0, proc.stderr
    # Interpreter, imports and headers: tens of MB at most, against GiB of tensor data.
    assert read < 64 * 2**20 and read_new < 64 * 2**20, (read, read_new)


def test_inspect_json_names_every_tensor_with_its_shard():
    data = json.loads(scaffold("inspect", EXAMPLES / "demolm", "--json").stdout)
    rows = {r["checkpoint"]: r for r in data["weights"]}
    assert rows["model.layers.4.self_attn.k_proj.weight"]["param"] == "model.layers.4.self_attn.qkv_proj.weight"
    assert rows["model.layers.4.self_attn.k_proj.weight"]["shard"] == "k"
    assert rows["model.layers.4.mlp.up_proj.weight"]["shard"] == 1
    assert data["spec"]["sliding_window_layers"] == [0, 1, 3, 4]
    assert data["spec"]["num_heads"] // data["spec"]["num_kv_heads"] == 3
    assert data["spec"]["gate_extra_bias"] == "gating_bias"
    assert data["spec"]["rope_parameters"]["rope_theta"] == 500000.0
    assert data["provenance"]["rope_parameters"].startswith("code: modeling_demolm.py")
    assert data["vocab"] == {"config": 320, "embedding_rows": 320, "lm_head_rows": 320, "tokenizer": 250}


def test_new_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "port"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = scaffold("new", EXAMPLES / "demolm", "-o", out, check=False)
    assert proc.returncode == 2 and "--force" in proc.stderr and "Traceback" not in proc.stderr
    assert (out / "keep.txt").read_text() == "mine"
    proc = scaffold("new", EXAMPLES / "demolm", "-o", out, "--force", check=False)  # not a folder scaffold wrote
    assert proc.returncode == 2 and "keep.txt" not in proc.stderr and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")  # an empty folder
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--force")  # a port scaffold wrote
    assert (out / "demo_lm_vllm" / "model.py").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["port"]  # no staging folders left behind


def test_spec_override_is_applied_and_recorded(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text('[spec]\nrope_parameters = { rope_type = "default", rope_theta = 20000.0 }\n')
    out = tmp_path / "port"
    scaffold("new", EXAMPLES / "demolm", "-o", out, "--spec", spec)
    model = (out / "demo_lm_vllm" / "model.py").read_text()
    assert '"rope_theta": 20000.0' in model
    recorded = (out / "scaffold_spec.toml").read_text()
    assert f"# override: {spec}" in recorded
    # The recorded spec regenerates the same port.
    again = tmp_path / "again"
    scaffold("new", EXAMPLES / "demolm", "-o", again, "--spec", out / "scaffold_spec.toml")
    assert (again / "demo_lm_vllm" / "model.py").read_text() == model


def test_generated_code_is_formatted_and_lints_clean(tmp_path):
    out = tmp_path / "port"
    scaffold("new", EXAMPLES / "demolm", "-o", out)
    files = [str(p) for p in out.rglob("*.py")]
    fmt = subprocess.run([sys.executable, "-m", "ruff", "format", "--check", "--isolated", *files],
                         capture_output=True, text=True)
    assert fmt.returncode == 0, fmt.stdout
    lint = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", *files], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout


@pytest.mark.parametrize("bad", ["missing", "notjson"])
def test_bad_checkpoint_is_one_paragraph_and_exit_2(tmp_path, bad):
    ckpt = tmp_path / "ckpt"
    if bad == "notjson":
        ckpt.mkdir()
        (ckpt / "config.json").write_text("{not json")
    proc = scaffold("inspect", ckpt, check=False)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and str(ckpt) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
