"""The transformers-backend fallback: compliance read from source, `new --impl`, fusion census, parity, compare.

Fast tests read sources and run the CLI without an engine. The engine tests start real
vLLM engines (CPU build) through `scaffold verify`, the generated package's own tests and
`scaffold compare`: five engine starts in all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import EXAMPLES, scaffold

from scaffold.backend.compliance import check
from scaffold.checkpoint import read_checkpoint

TOLERANCE = 1e-4


def source_line(ckpt: Path, rule) -> str:
    """The text of the source line a rule points at."""
    assert rule.file and rule.line, rule
    path = ckpt / rule.file
    if not path.exists():  # transformers' own source
        import importlib.util

        root = Path(next(iter(importlib.util.find_spec("transformers").submodule_search_locations))).parent
        path = root / rule.file
    return path.read_text().splitlines()[rule.line - 1]


def rules_by_name(comp) -> dict:
    return {r.rule: r for r in comp.rules}


# ------------------------------------------------------------------ compliance, no engine
def test_compliant_remote_code_example_meets_every_rule():
    ckpt = EXAMPLES / "tinymoe"
    comp = check(read_checkpoint(ckpt))
    assert comp.compliant, comp.blockers()
    assert comp.origin == "remote code" and comp.model_class == "TinyMoEModel"
    rules = rules_by_name(comp)
    assert "_supports_attention_backend = True" in source_line(ckpt, rules["_supports_attention_backend"])
    assert "attention_interface(" in source_line(ckpt, rules["attention interface"])
    for name in ("kwargs TinyMoEModel -> TinyMoEDecoderLayer", "kwargs TinyMoEDecoderLayer -> TinyMoEAttention"):
        assert rules[name].ok, rules[name]
        assert "self." in source_line(ckpt, rules[name]) or "decoder_layer(" in source_line(ckpt, rules[name])
    experts = rules["MoE experts (TinyMoESparseBlock.experts)"]
    assert "def forward(self, hidden_states, top_k_index, top_k_weights)" in source_line(ckpt, experts)
    kinds = sorted((e.kind, e.attr) for e in comp.expected)
    assert kinds == [("moe", ""), ("qkv", "self_attn"), ("rms_norm", "input_layernorm"), ("rms_norm", "norm"),
                     ("rms_norm", "post_attention_layernorm")]


def test_noncompliant_remote_code_example_names_each_broken_rule():
    ckpt = EXAMPLES / "tinymoe_sdpa"
    comp = check(read_checkpoint(ckpt))
    assert not comp.compliant
    broken = {r.rule: r for r in comp.broken}
    assert set(broken) == {
        "_supports_attention_backend", "attention interface", "kwargs TinyMoESdpaModel -> TinyMoESdpaDecoderLayer",
        "kwargs TinyMoESdpaDecoderLayer -> TinyMoESdpaAttention", "MoE experts (TinyMoESdpaSparseBlock.experts)",
    }
    assert "scaled_dot_product_attention" in source_line(ckpt, broken["attention interface"])
    assert "decoder_layer(" in source_line(ckpt, broken["kwargs TinyMoESdpaModel -> TinyMoESdpaDecoderLayer"])
    assert "self.self_attn(" in source_line(ckpt, broken["kwargs TinyMoESdpaDecoderLayer -> TinyMoESdpaAttention"])
    assert "def forward(self, x, routing)" in source_line(ckpt, broken["MoE experts (TinyMoESdpaSparseBlock.experts)"])
    assert rules_by_name(comp)["auto_map AutoModel"].ok


def test_transformers_source_is_read_without_importing_transformers(tiny):
    ckpt = tiny("llama", "LlamaForCausalLM")
    code = (
        "import json, sys\n"
        "from scaffold.backend.compliance import check\n"
        "from scaffold.checkpoint import read_checkpoint\n"
        f"comp = check(read_checkpoint({str(ckpt)!r}))\n"
        "print(json.dumps({'imported': 'transformers' in sys.modules, **comp.to_json()}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    data = json.loads(proc.stdout)
    assert data["imported"] is False
    assert data["compliant"] and data["files"] == ["transformers/models/llama/modeling_llama.py"]
    # One Fused: line per module class and attribute: the five measured for Llama on this vLLM.
    fused = sorted((e["kind"], e["attr"]) for e in data["expected_fusions"])
    assert fused == [("gate_up", "mlp"), ("qkv", "self_attn"), ("rms_norm", "input_layernorm"), ("rms_norm", "norm"),
                     ("rms_norm", "post_attention_layernorm")]


@pytest.mark.parametrize(("model_type", "file"), [("gemma4_text", "gemma4/modeling_gemma4.py"),
                                                  ("cohere_compass_text", "cohere_compass/modeling_cohere_compass.py"),
                                                  ("gemma3_text", "gemma3/modeling_gemma3.py")])
def test_transformers_source_of_a_type_living_in_another_types_folder_is_found(model_type, file):
    """gemma4_text is defined in transformers/models/gemma4/: the backend's rules read that file (they said
    "transformers has no models/gemma4_text/ folder")."""
    from scaffold.checkpoint import Checkpoint, TokenizerInfo

    config = {"model_type": model_type, "architectures": ["LabForCausalLM"]}
    comp = check(Checkpoint(Path("/lab"), config, {}, [], None, TokenizerInfo(), {}))
    assert comp.to_json()["files"][0] == f"transformers/models/{file}", comp.to_json()["rules"][:1]


def test_inspect_shows_compliance_section(tiny):
    ckpt = tiny("llama", "LlamaForCausalLM")
    text = scaffold("inspect", ckpt).stdout
    assert "transformers backend compliance (transformers: transformers/models/llama/modeling_llama.py)" in text
    assert "=> compliant" in text and "modeling_llama.py:" in text
    data = json.loads(scaffold("inspect", ckpt, "--json").stdout)
    assert data["backend"]["compliant"] is True
    assert data["backend"]["spec_cross_check"] == []  # the spec and the source predict the same fusions
    assert len(data["backend"]["expected_fusions"]) == 5


# Lines as vLLM 0.32 logged them for examples/tinymoe (prefix and all), plus the external-routing form
# (moe.py:413) that no example here triggers, and the RMSNorm-miss warning of fuser.py.
LOGGED = """\
(MainProcess pid=12024) INFO 11-29 16:01:31 [moe.py:368] Fused: gate + experts (TinyMoESparseBlock) -> MoERunner (internal routing)
(MainProcess pid=12024) INFO 11-29 16:01:32 [base.py:575] Fused: q_proj + k_proj + v_proj (self_attn: TinyMoEAttention) -> qkv_proj (QKVParallelLinear)
(MainProcess pid=12024) INFO 11-29 16:01:32 [base.py:575] Fused: input_layernorm (TinyMoERMSNorm) -> RMSNorm (CustomOp)
(MainProcess pid=12024) INFO 11-29 16:01:32 [base.py:575] Fused: post_attention_layernorm (TinyMoERMSNorm) -> RMSNorm (CustomOp)
(MainProcess pid=12024) INFO 11-29 16:01:32 [base.py:575] Fused: norm (TinyMoERMSNorm) -> RMSNorm (CustomOp)
"""


def test_census_against_logged_lines():
    from scaffold.backend.census import take

    expected = check(read_checkpoint(EXAMPLES / "tinymoe")).expected
    full = take(expected, LOGGED)
    assert full.ok and not full.unexpected and full.per_class() == [
        ("TinyMoERMSNorm", 3, 3, []), ("TinyMoEAttention", 1, 1, []), ("TinyMoESparseBlock", 1, 1, [])]
    # A fusion that stops firing (here: the q/k/v merge) is reported for its class.
    lost = take(expected, "\n".join(line for line in LOGGED.splitlines() if "qkv_proj" not in line))
    assert not lost.ok and lost.per_class()[1] == ("TinyMoEAttention", 1, 0, ["qkv self_attn"])
    external = LOGGED.replace("gate + experts (TinyMoESparseBlock) -> MoERunner (internal routing)",
                              "experts (TinyMoEExperts) -> MoERunner (external routing)")
    assert take(expected, external).ok
    miss = take(expected, LOGGED + "WARNING [fuser.py:92] TinyMoERMSNorm looks like an RMSNorm but its "
                                   "computation did not match the expected pattern, so it was left unfused.\n")
    assert not miss.ok and miss.rms_misses == ["TinyMoERMSNorm"]


# ------------------------------------------------------------------ scaffold new --impl, no engine
def test_auto_refuses_noncompliant_moe_naming_both_paths(workdir):
    # The native generator ports tinymoe_sdpa's 3-D experts; with an activation vLLM's registry lacks
    # (transformers' laplace) neither path can take it.
    ckpt = workdir / "tinymoe_sdpa-laplace"
    shutil.copytree(EXAMPLES / "tinymoe_sdpa", ckpt, dirs_exist_ok=True)
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "hidden_act": "laplace"}))
    out = workdir / "never-written"
    proc = scaffold("new", ckpt, "-o", out, "--trust-remote-code", check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    message = proc.stderr
    assert "Native port:" in message and "'laplace' is not in vLLM's activation registry" in message
    assert "Transformers backend:" in message and "modeling_tinymoe_sdpa.py:" in message
    assert "ALL_ATTENTION_FUNCTIONS" in message and "top_k_index" in message
    assert not out.exists()


def test_backend_needs_trust_remote_code_for_remote_code(workdir):
    proc = scaffold("new", EXAMPLES / "tinymoe", "--impl", "transformers", "-o", workdir / "never", check=False)
    assert proc.returncode == 2 and "--trust-remote-code" in proc.stderr
    assert not (workdir / "never").exists()


def test_auto_ports_the_compliant_moe_natively_without_running_its_code(workdir):
    """The native generator reads the remote code as text: its 3-D experts port without --trust-remote-code,
    and auto prefers the native port to the backend."""
    out = workdir / "tinymoe-native"
    proc = scaffold("new", EXAMPLES / "tinymoe", "-o", out, "--force")
    assert "through vLLM's transformers backend" not in proc.stdout
    import tomllib

    spec = tomllib.loads((out / "scaffold_spec.toml").read_text())["spec"]
    assert spec["experts_layout"] == "stacked" and "backend" not in spec


@pytest.fixture(scope="session")
def tinymoe_package(workdir) -> Path:
    out = workdir / "tinymoe-backend"
    proc = scaffold("new", EXAMPLES / "tinymoe", "-o", out, "--trust-remote-code", "--impl", "transformers")
    assert "through vLLM's transformers backend" in proc.stdout
    return out


@pytest.mark.slow  # ~12 s on 2 cores: builds tinymoe and its backend package
def test_backend_package_for_compliant_moe(tinymoe_package):
    out = tinymoe_package
    import tomllib

    spec = tomllib.loads((out / "scaffold_spec.toml").read_text())
    assert spec["backend"]["model_impl"] == "transformers" and spec["backend"]["trust_remote_code"] is True
    assert spec["backend"]["reason"] == "asked for with --impl transformers"
    assert len(spec["backend"]["fusion"]) == 5
    package = out / spec["spec"]["package"]
    import ast

    tree = ast.parse((package / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]  # no model code copied
    assert [p.name for p in package.iterdir() if p.suffix == ".py"] == ["__init__.py"]
    assert "[project.entry-points.\"vllm.general_plugins\"]" in (out / "pyproject.toml").read_text()
    review = (out / "REVIEW.md").read_text()
    assert "## Transformers backend compliance" in review and "modeling_tinymoe.py:" in review
    assert "--model-impl transformers --trust-remote-code" in review


@pytest.mark.slow  # shares the ~12 s tinymoe_package fixture
def test_backend_package_installs_as_a_vllm_plugin(tinymoe_package, tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--target", str(site), str(tinymoe_package)], check=True)
    code = (
        "import json, logging, sys\n"
        f"sys.path.insert(0, {str(site)!r})\n"
        "from importlib.metadata import entry_points\n"
        "(ep,) = [e for e in entry_points(group='vllm.general_plugins') if e.value.endswith(':register')"
        " and 'tiny_mo_e' in e.value]\n"
        "register = ep.load()\n"
        "pkg = sys.modules[register.__module__]\n"
        "records = []\n"
        "handler = logging.Handler(); handler.emit = records.append\n"
        "logging.getLogger(pkg.__name__).addHandler(handler)\n"
        "register()\n"
        "pkg.EXPECTED_VERSIONS['vllm'] = '0.0.1'\n"
        "register()\n"
        "print(json.dumps({'kwargs': pkg.engine_kwargs(dtype='float32'), 'serve': pkg.serve_command('CKPT'),"
        " 'warnings': [r.getMessage() for r in records]}))\n"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout)
    assert out["kwargs"] == {"model_impl": "transformers", "trust_remote_code": True, "dtype": "float32"}
    assert out["serve"] == ["vllm", "serve", "CKPT", "--model-impl", "transformers", "--trust-remote-code"]
    # Installed versions equal the recorded ones: silent; a different vLLM: one warning naming both.
    assert len(out["warnings"]) == 1 and "0.0.1" in out["warnings"][0]


def test_auto_prefers_native_port_for_gpt_neox(tiny, workdir):
    from scaffold.analysis import analyze
    from scaffold.errors import ScaffoldError

    ckpt = tiny("gpt_neox", "GPTNeoXForCausalLM")
    out = workdir / "neox-auto"
    proc = scaffold("new", ckpt, "-o", out, check=False)
    try:
        analyze(ckpt)
    except ScaffoldError:  # no native GPT-NeoX port: the backend is refused for its known defect
        assert proc.returncode == 2 and "computes GPT-NeoX wrongly" in proc.stderr
        assert not out.exists()
    else:
        assert proc.returncode == 0 and "tensors mapped" in proc.stdout
        assert "[backend]" not in (out / "scaffold_spec.toml").read_text()


# ------------------------------------------------------------------ engines
def verify_json(port: Path) -> tuple[int, dict]:
    proc = scaffold("verify", port, "--json", check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.engine
def test_backend_parity_and_fusions_for_compliant_example(tinymoe_package):
    rc, report = verify_json(tinymoe_package)
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 0 and report["passed"], json.dumps(report, indent=2)
    assert "vllm.model_executor.models.transformers" in checks["backend loaded by vLLM"]["detail"]
    assert checks["parity: log-probabilities"]["max_delta"] <= TOLERANCE
    assert checks["parity: greedy continuation"]["status"] == "pass"
    census = checks["fusions fired"]["census"]
    assert census["ok"] and not census["rms_misses"]
    assert all(row["fired"] for row in census["rows"]), census["rows"]


@pytest.mark.engine
@pytest.mark.extended  # the full suite runs the backend's parity on the compliant example above
def test_backend_parity_flags_gpt_neox(tiny, workdir):
    ckpt = tiny("gpt_neox", "GPTNeoXForCausalLM")
    out = workdir / "neox-backend"
    proc = scaffold("new", ckpt, "--impl", "transformers", "-o", out)
    assert "known defect" in proc.stderr
    rc, report = verify_json(out)
    checks = {c["name"]: c for c in report["checks"]}
    assert rc == 1 and not report["passed"]
    assert checks["backend loaded by vLLM"]["status"] == "pass"
    assert checks["parity: log-probabilities"]["status"] == "FAIL"
    assert checks["parity: log-probabilities"]["max_delta"] > 1e-2
    assert any(c["name"] == "known backend defect" for c in report["checks"])


UNFUSED_PROBE = '''
import re

import pytest
import test_fusions


def test_a_lost_fusion_fails_the_census(engine_log, monkeypatch):
    """An upgrade that un-fused TinyMoE's MLP would leave a recorded fusion without its line."""
    lost = dict(test_fusions.EXPECTED_FUSIONS[0], kind="gate_up", module_class="TinyMoEMLP", attr="mlp",
                group="", signature=r"\\(mlp: TinyMoEMLP\\) -> gate_up_proj")
    monkeypatch.setattr(test_fusions, "EXPECTED_FUSIONS", [*test_fusions.EXPECTED_FUSIONS, lost])
    with pytest.raises(AssertionError, match="not fused any more"):
        test_fusions.test_every_expected_fusion_fired(engine_log)
'''


@pytest.mark.engine
def test_generated_package_tests_hold_the_fusion_census(tinymoe_package, workdir):
    probe = tinymoe_package / "tests" / "test_unfused_probe.py"
    probe.write_text(UNFUSED_PROBE)
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                               "tests/test_fusions.py", "tests/test_unfused_probe.py"],
                              cwd=tinymoe_package, capture_output=True, text=True, timeout=900, check=False)
    finally:
        probe.unlink()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "5 passed" in proc.stdout


@pytest.mark.engine
def test_compare_native_and_backend_side_by_side(tiny, tmp_path):
    ckpt = tiny("llama", "LlamaForCausalLM")
    temp = tmp_path / "temp"  # the command's temp directory: what it leaves there is left on the user's disk
    temp.mkdir()
    proc = scaffold("compare", ckpt, "--json", env=dict(os.environ, TMPDIR=str(temp)))
    assert not list(temp.glob("scaffold-*")), sorted(p.name for p in temp.iterdir())
    data = json.loads(proc.stdout)
    sides = {s["impl"]: s for s in data["implementations"]}
    native, backend = sides["native"], sides["transformers"]
    assert native["available"] and native["parity_ok"], native
    assert native["vllm_class"].endswith(".model.ScaffoldLlamaForCausalLM") and not native["reason"]
    assert native["max_delta"] <= TOLERANCE
    assert backend["available"] and backend["parity_ok"], backend
    assert backend["vllm_class"].startswith("vllm.model_executor.models.transformers")
    assert backend["fusions_ok"] and len(backend["census"]["rows"]) == 5
    assert native["load_seconds"] > 0 and backend["load_seconds"] > 0


@pytest.mark.engine
@pytest.mark.extended
@pytest.mark.parametrize("row", ["hy_v4-latent-gate", "llama4_text"])
def test_compare_serves_a_port_with_the_engine_settings_verify_gives_it(tiny, row):
    """compare's native engine gets what verify's gets, from the same places: HY-V4's latent attention with sinks
    runs decompressed through vLLM's Attention, which the port serves only with VLLM_MLA_DISABLE=1 (it refuses to
    load otherwise); Llama 4's attention chunked in 32 positions needs KV-cache blocks that divide the chunk (vLLM
    asserted `attn_chunk_size 32 is not divisible by block_size 128` before). The architecture is no transformers
    class, so the backend side is refused and only the port runs."""
    from test_architectures import ARCHITECTURES

    model_type, overrides = ARCHITECTURES[row][:2]
    ckpt = tiny(model_type, "EngineSettingsCompareForCausalLM", **overrides)
    proc = scaffold("compare", ckpt, "--json", env={k: v for k, v in os.environ.items() if k != "VLLM_MLA_DISABLE"})
    native = {s["impl"]: s for s in json.loads(proc.stdout)["implementations"]}["native"]
    assert native["available"] and native["parity_ok"] and not native["reason"], native
    assert native["vllm_class"].endswith(".model.ScaffoldEngineSettingsCompareForCausalLM"), native
    assert native["max_delta"] <= TOLERANCE
