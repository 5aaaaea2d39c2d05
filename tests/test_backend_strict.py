"""The transformers-backend path is as strict about tensors as the native path (issue 17, item 3).

A corrupt checkpoint of a stock architecture (a tensor missing, of the wrong shape, or
stray) used to be "ported" with exit 0: the native generator refused it, `--impl auto`
fell back to the backend because the code is compliant, and `verify --static-only`
passed. Remote code whose names vLLM's backend cannot map was written as a package that
vLLM then refused to load. Now the checkpoint's tensors are held to the module tree the
backend builds (scaffold/backend/tensors.py) before anything is written, and by verify.

Real tiny checkpoints (scaffold.tiny, transformers' own save_pretrained), broken with
safetensors; the real CLI in a subprocess; no engine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ckpt_factory import read_header, rewrite_header
from conftest import EXAMPLES, scaffold
from helpers import quick_sample
from robustness_doc import defence

MISSING = "model.layers.1.mlp.up_proj.weight"


def corrupt(src: Path, dst: Path, edit) -> Path:
    """A copy of `src` whose shards are rewritten by edit(name -> tensor dict), the index kept consistent."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    index_path = dst / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    for shard in sorted(dst.glob("*.safetensors")):
        tensors = load_file(shard)
        edit(tensors, shard.name)
        save_file(tensors, shard, metadata={"format": "pt"})
        for name in list(index["weight_map"]):
            if index["weight_map"][name] == shard.name and name not in tensors:
                del index["weight_map"][name]
        index["weight_map"].update({name: shard.name for name in tensors})
    index_path.write_text(json.dumps(index))
    return dst


def drop(name: str):
    def edit(tensors: dict, shard: str) -> None:
        tensors.pop(name, None)

    return edit


def narrow_every_layer(suffix: str):
    """One column fewer in every layer: consistent across layers, so only the config can tell."""

    def edit(tensors: dict, shard: str) -> None:
        for name in list(tensors):
            if name.endswith(suffix):
                tensors[name] = tensors[name][:, :-1].contiguous()

    return edit


def add_stray(name: str, beside: str):
    def edit(tensors: dict, shard: str) -> None:
        import torch

        if beside in tensors:
            tensors[name] = torch.zeros(tensors[beside].shape[0])

    return edit


def refused(proc, *words: str) -> str:
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, err)
    assert "Traceback" not in proc.stderr and len(err.splitlines()) == 1 and err.startswith("error: "), err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.fixture(scope="module")
def llama(tiny) -> Path:
    return tiny("llama", "LlamaForCausalLM")


CORRUPTIONS = {
    # id: (edit, words the refusal must hold besides the config path, the shard it must name or None)
    "missing": (drop(MISSING), [MISSING, "is missing"], None),
    "shape": (narrow_every_layer("mlp.down_proj.weight"), ["model.layers.0.mlp.down_proj.weight", "[128, 255]",
                                                           "[128, 256]"], "model.layers.0.mlp.down_proj.weight"),
    "stray": (add_stray("model.layers.1.mlp.extra_scale", "model.layers.1.mlp.up_proj.weight"),
              ["model.layers.1.mlp.extra_scale", "no parameter"], "model.layers.1.mlp.extra_scale"),
    # vLLM's loader drops any unexpected `.bias` silently: the port would compute something else. (On auto
    # the native generator takes it for an o_proj bias and refuses it at write time: only layer 0 has one.)
    "stray-bias": (add_stray("model.layers.0.self_attn.o_proj.bias", "model.layers.0.self_attn.o_proj.weight"),
                   ["model.layers.0.self_attn.o_proj.bias", "no parameter"], "model.layers.0.self_attn.o_proj.bias"),
}
PATHS = {"missing": ("auto", "transformers"), "stray-bias": ("transformers",)}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_corrupt_stock_checkpoint_refused_on_every_path(case, llama, tmp_path):
    edit, words, tensor = CORRUPTIONS[case]
    ckpt = corrupt(llama, tmp_path / "ckpt", edit)
    if tensor:  # the refusal names the shard that holds the offending tensor
        weight_map = json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]
        words = [*words, weight_map[tensor]]
    for impl in PATHS.get(case, ("auto",)):
        out = tmp_path / f"port-{impl}"
        err = refused(scaffold("new", ckpt, "--impl", impl, "-o", out, check=False), str(ckpt / "config.json"),
                      *words)
        if impl == "auto":  # both paths, each naming the tensor
            assert "Native port:" in err and "Transformers backend:" in err, err
        assert not out.exists()


@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_verify_static_only_checks_the_tensors(llama, tmp_path):
    """A backend package verified against a checkpoint that lost a tensor fails without an engine; against
    its own checkpoint it passes the check and says that parity was not checked."""
    port = tmp_path / "port"
    proc = scaffold("new", llama, "--impl", "transformers", "-o", port)
    assert "every one of the 30 checkpoint tensors" in proc.stdout
    assert "parity with transformers not checked yet" in proc.stdout
    review = (port / "REVIEW.md").read_text()
    assert "all 30 parameters are filled" in review and "Parity with transformers not checked" in review
    assert "**not checked**" in (port / "README.md").read_text()

    good = scaffold("verify", port, "--static-only", "--json")
    checks = {c["name"]: c for c in json.loads(good.stdout)["checks"]}
    assert checks["tensors against the backend"]["status"] == "pass"
    assert checks["parity"]["status"] == "skipped" and "not checked" in checks["parity"]["detail"]

    broken = corrupt(llama, tmp_path / "broken", drop(MISSING))
    bad = scaffold("verify", port, "--static-only", "--json", "--checkpoint", broken, check=False)
    report = json.loads(bad.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert bad.returncode == 1 and not report["passed"]
    assert checks["tensors against the backend"]["status"] == "FAIL"
    assert MISSING in checks["tensors against the backend"]["detail"]


@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_tied_and_per_expert_checkpoints_pass(tiny, tmp_path):
    """No false refusals: a tied head stores no lm_head.weight, and Qwen3-MoE stores one tensor per expert
    where transformers 5 stacks them (vLLM's MoE runner loads them by expert index)."""
    tied = tiny("llama", "LlamaForCausalLM", tie_word_embeddings=True)
    proc = scaffold("new", tied, "--impl", "transformers", "-o", tmp_path / "tied")
    assert "all 29 parameters are filled" in proc.stdout, proc.stdout

    moe = tiny("qwen3_moe", "Qwen3MoeForCausalLM", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
               num_hidden_layers=2)
    proc = scaffold("new", moe, "--impl", "transformers", "-o", tmp_path / "moe")
    assert "lands on a parameter" in proc.stdout, proc.stdout
    # ... and an expert that lost a projection is refused, by name.
    lost = "model.layers.1.mlp.experts.2.up_proj.weight"
    broken = corrupt(moe, tmp_path / "moe-broken", drop(lost))
    refused(scaffold("new", broken, "--impl", "transformers", "-o", tmp_path / "never", check=False), lost,
            "is missing")
    assert not (tmp_path / "never").exists()


def renamed_head(dst: Path) -> Path:
    """examples/tinymoe with its head named `output` (code and checkpoint): transformers loads it, but vLLM's
    backend builds `lm_head` and has no module named `output`. Its activation is transformers' laplace, which
    vLLM's registry lacks, so that the native generator (which ports tinymoe) refuses it too."""
    shutil.copytree(EXAMPLES / "tinymoe", dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "hidden_act": "laplace"}))
    code = dst / "modeling_tinymoe.py"
    code.write_text(code.read_text().replace("self.lm_head", "self.output"))
    entries, _ = read_header(dst / "model.safetensors")
    entries["output.weight"] = entries.pop("lm_head.weight")
    rewrite_header(dst / "model.safetensors", entries)
    return dst


@pytest.mark.slow  # ~12 s on 2 cores: vLLM's backend loader in a subprocess
def test_remote_code_with_unmappable_names_is_refused(tmp_path):
    ckpt = renamed_head(tmp_path / "ckpt")
    out = tmp_path / "port"
    # Without consent the model cannot be built, so the names cannot be checked: refused, saying how to proceed.
    err = refused(scaffold("new", ckpt, "-o", out, check=False), str(ckpt / "config.json"), "--trust-remote-code",
                  "--spec", "maps every checkpoint tensor name")
    assert "Transformers backend:" in err
    # With consent the remote model is built on the meta device and the unmappable names are named.
    refused(scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False), "output.weight", "no parameter",
            "lm_head.weight is missing")
    assert not out.exists()


# ------------------------------------------------------------------ cases for the robustness catalogue
# In tests/robustness_cases.py's format (the lead folds them into CASES): the catalogue's checkpoint
# (ckpt_factory, zeros) renamed to the stock LlamaForCausalLM, so that a native refusal falls through to
# the backend, then broken in one way. Each must exit 2 naming config.json and the tensor, writing nothing.
def _stock(*edits):
    from robustness_cases import set_config

    def build(root: Path) -> None:
        set_config(root, architectures=["LlamaForCausalLM"])
        for edit in edits:
            edit(root)

    return build


def _every_layer(name: str, shape: list[int]):
    from robustness_cases import BASE as SHAPE

    def fn(tensors: dict) -> None:
        for i in range(SHAPE.layers):
            tensors[f"model.layers.{i}.{name}"] = shape

    return fn


def _unmappable_remote_code(root: Path) -> None:
    shutil.rmtree(root)
    renamed_head(root)


def _strict_cases():
    from robustness_cases import Case, config_edit, drop, rebuild, stray

    return [
        Case("backend-tensor-missing", "a stock Llama missing one tensor (the backend used to take it on auto)",
             _stock(rebuild(drop("model.layers.1.mlp.up_proj.weight"))), "model.layers.1.mlp.up_proj.weight"),
        Case("backend-shape-every-layer", "a stock Llama whose down_proj is one column short in every layer",
             _stock(rebuild(_every_layer("mlp.down_proj.weight", [64, 95]))), "[64, 95]"),
        Case("backend-stray-tensor", "a stock Llama with a tensor no module holds",
             _stock(rebuild(stray)), "model.layers.0.self_attn.rotary_scale"),
        Case("backend-layer-count", "a stock Llama whose config claims 500 layers over 2 layers of tensors",
             _stock(config_edit(num_hidden_layers=500)), "num_hidden_layers"),
        Case("backend-expert-count", "a stock Llama without its lm_head whose config claims 10**8 experts "
             "(refused by the reader's bound, before either path)",
             _stock(rebuild(drop("lm_head.weight")), config_edit(num_local_experts=10**8)), "8192"),
        Case("backend-remote-unmappable", "remote code whose head vLLM's backend cannot map, without "
             "--trust-remote-code", _unmappable_remote_code, "--trust-remote-code"),
    ]


STRICT_CASES = _strict_cases()


# The three that start vLLM's backend loader in a subprocess (~12 s each here) run in the full suite only.
@pytest.mark.parametrize("case", quick_sample(STRICT_CASES, ids=[c.id for c in STRICT_CASES], keep=(
    "backend-remote-unmappable", "backend-layer-count", "backend-expert-count")))
def test_catalogue_case(case, tmp_path):
    from ckpt_factory import write_checkpoint
    from robustness_cases import BASE as SHAPE

    ckpt = write_checkpoint(tmp_path / "ckpt", SHAPE, shards=case.shards, data="zeros")
    case.build(ckpt)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "port"
    err = refused(scaffold(case.command, ckpt, "-o", out, check=False), str(ckpt / case.names), case.expect)
    assert "failed unexpectedly" not in err, err
    assert "Transformers backend:" in err or case.id == "backend-expert-count", err  # both paths were tried
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == before
    defence(case.id, case.what, f"scaffold {case.command} CKPT -o OUT", 2, err, (ckpt, "CKPT"), (tmp_path, "TMP"))
