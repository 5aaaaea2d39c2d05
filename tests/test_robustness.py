"""Hostile and broken inputs: clean one-paragraph errors, inert rendering, no checkpoint code run.

Every case of robustness_cases.CASES runs the real CLI in a subprocess on a
checkpoint broken in one way and must exit 2 with one line naming the file, no
traceback, and nothing written, within MAX_SECONDS and MAX_RSS_BYTES. Each
(input, exit code, message) row must be the committed docs/robustness.md's row
(robustness_doc.check_row); scripts/robustness_doc.py regenerates that document.
"""

from __future__ import annotations

import ast
import json
import math
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest
import tomllib
from ckpt_factory import Shape, config_for, read_header, rewrite_header, write_checkpoint
from conftest import scaffold
from helpers import quick_sample
from robustness_cases import BASE, CASES, marker_code
from robustness_doc import check_row, committed_rows, record, regenerating

# Bounds on every catalogue run of the CLI, bombs included: generous, since the machine is shared,
# and far below what the bombs took before their bounds (minutes, 1.3-7.6 GB).
MAX_SECONDS = 10.0  # CPU seconds of the CLI process
MAX_WALL_SECONDS = 120  # a child that blocks instead of working
MAX_RSS_BYTES = 2**30
# The rows the other tests of this module contribute to the catalogue section.
EXTRA_IDS = {"verify-truncated", "verify-spec-num_heads", "verify-spec-qkv_layout", "verify-spec-mlp",
             "verify-not-a-port", "remote-code", "code-too-deep", "hostile-values", "unexpected",
             "hub-cache-other-repo", "spec-model_type", "spec-architecture", "spec-class_prefix", "spec-package",
             "out-exists", "force-checkpoint", "force-parent", "force-cwd", "name-arch-underscore",
             "name-key-float-nan"}


def extra_row(key: str, what: str, command: str, code: int, message: str) -> None:
    assert key in EXTRA_IDS, key
    check_row("catalogue", [key, what, f"`{command}`", code, message, "", ""])


# Runs the CLI as `python -m scaffold.cli` does, then writes the process's peak RSS (VmHWM, kB) to argv[1].
# VmHWM belongs to the memory of this program alone; wait4's ru_maxrss would also count the pytest process
# the child was forked from (Linux carries the pre-exec peak over), and grows with it.
PEAK_WRAPPER = """
import atexit, runpy, sys
report = sys.argv.pop(1)
def peak():
    with open("/proc/self/status") as status:
        kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    with open(report, "w") as out:
        out.write(kb)
atexit.register(peak)
sys.argv[0] = "scaffold"
runpy.run_module("scaffold.cli", run_name="__main__", alter_sys=True)
"""


def measured(*args) -> tuple[subprocess.CompletedProcess, int, float]:
    """Run the CLI like conftest.scaffold, with its peak RSS (bytes) and CPU time (user + system seconds).

    CPU time, not wall time: on a shared 2-core machine the wall clock of the same run swings by the
    load of the other processes, while the work a bad input causes does not. A child that blocks
    without working is caught by the wall-clock timeout instead."""
    with tempfile.NamedTemporaryFile("r") as report:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        proc = subprocess.run([sys.executable, "-c", PEAK_WRAPPER, report.name, *map(str, args)],
                              capture_output=True, text=True, check=False, timeout=MAX_WALL_SECONDS)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        kb = report.read().strip()
    assert kb.isdigit(), ("the CLI did not report its peak memory", proc.stderr[-2000:])
    return proc, int(kb) * 1024, seconds


def assert_clean_failure(proc: subprocess.CompletedProcess, *, names: Path, expect: str = "") -> str:
    """Exit 2, one line on stderr that starts with 'error:', names `names`, says `expect`; no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-3000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, err
    assert "failed unexpectedly" not in err, err  # a specific check must catch it, not the last resort
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert str(names) in err, (str(names), err)
    assert expect.lower() in err.lower(), (expect, err)
    return err


def static_checks(port: Path) -> dict[str, str]:
    """verify's static checks on a port (what `verify --static-only` runs, without its engine subprocesses)."""
    from scaffold.checkpoint import read_checkpoint
    from scaffold.verify.port import load_port
    from scaffold.verify.report import Report
    from scaffold.verify.static import run_static

    loaded = load_port(port)
    report = Report(str(port), str(loaded.checkpoint))
    run_static(report, loaded, read_checkpoint(loaded.checkpoint))
    return {c.name: c.status for c in report.checks}


def shown(message: str, *paths: tuple[Path, str]) -> str:
    """`message` with this machine's paths replaced by labels, so the document reads the same on every machine."""
    paths += ((Path(sysconfig.get_paths()["purelib"]), "SITE-PACKAGES"),)
    for path, label in paths:
        message = message.replace(str(path), label)
    return message


def no_leftovers(folder: Path, allowed: set[str]) -> None:
    left = sorted(p.name for p in folder.iterdir() if p.name not in allowed)
    assert not left, f"left behind: {left}"


@pytest.mark.parametrize("case", quick_sample(CASES, every=8, ids=[c.id for c in CASES]))
def test_bad_input_fails_cleanly(case, tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, shards=case.shards, data="zeros")
    case.build(ckpt)
    spec = ckpt / "override.toml"
    if case.spec == "FIFO":
        os.mkfifo(spec)
    elif case.spec is not None:
        spec.write_text(case.spec)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = tmp_path / "port"
    args = [case.command, ckpt] + (["-o", out] if case.command == "new" else [])
    args += ["--spec", spec] if case.spec is not None else []
    proc, rss, seconds = measured(*args)
    named = ckpt / case.names if case.names else ckpt
    err = assert_clean_failure(proc, names=named, expect=case.expect)
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no staging folder, nothing else
    assert seconds < MAX_SECONDS and rss < MAX_RSS_BYTES, (seconds, rss)
    command = f"scaffold {case.command} CKPT" + (" -o OUT" if case.command == "new" else "")
    command += " --spec CKPT/override.toml" if case.spec is not None else ""
    check_row("catalogue", [case.id, case.what, f"`{command}`", proc.returncode,
                            shown(err, (ckpt, "CKPT"), (tmp_path, "TMP")), f"{rss / 2**20:.0f} MB",
                            f"{seconds:.1f} s"])


def test_the_catalogue_document_lists_exactly_the_cases():
    """docs/robustness.md's catalogue: one row per case of CASES and per extra test, no row of a removed case."""
    ids = {c.id for c in CASES}
    assert len(ids) == len(CASES), "two cases share an id"
    if regenerating():
        return  # scripts/robustness_doc.py is rewriting the document; it checks that every case has its row
    rows = set(committed_rows("catalogue")) - {"case"}
    assert rows == ids | EXTRA_IDS, (sorted(ids | EXTRA_IDS - rows), sorted(rows - ids - EXTRA_IDS))


# ------------------------------------------------------- just inside the bounds
def dense_source(root: Path) -> None:
    """A modeling file of 380,000 tokens, one list literal: the densest syntax tree the reader accepts."""
    (root / "modeling_dense.py").write_bytes(b"x = [" + b"1," * 189_000 + b"]\n")


def big_tokenizer(root: Path) -> None:
    """A 37 MB tokenizer.json of 1.9M vocabulary entries (commas and colons: 3.8M of the 4M allowed)."""
    body = b",".join(b'"%d":%d' % (i, i) for i in range(1_900_000))
    (root / "tokenizer.json").write_bytes(b'{"model": {"vocab": {' + body + b"}}}")


def big_header(root: Path) -> None:
    """The real tensors plus 140,000 empty ones in one valid header (the bound: 150,000 tensors)."""
    path = root / "model.safetensors"
    entries, _ = read_header(path)
    empty = {f"x.{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(140_000)}
    rewrite_header(path, {**entries, **empty})


def long_config_list(root: Path) -> None:
    """A config.json key holding 19,000 integers (the bound: 20,000 values), rendered into configuration.py."""
    config = json.loads((root / "config.json").read_text())
    config.update(model_type="bounded_lm", architectures=["BoundedForCausalLM"], x_list=list(range(19_000)))
    (root / "config.json").write_text(json.dumps(config))


INSIDE_BOUNDS = {
    "dense-source": ("a modeling file of 380,000 tokens (one list literal)", "inspect", dense_source),
    "big-tokenizer": ("a 37 MB tokenizer.json of 1.9M vocabulary entries", "inspect", big_tokenizer),
    "big-header": ("a valid shard header of 140,000 tensors (7 MB)", "inspect", big_header),
    "long-config-list": ("a config.json list of 19,000 integers, rendered", "new", long_config_list),
}


@pytest.mark.parametrize("key", quick_sample(sorted(INSIDE_BOUNDS), keep=("long-config-list",)))
def test_inputs_just_inside_the_bounds_stay_bounded(key, tmp_path):
    """What the bounds let through is read within the same time and memory bounds (however it ends)."""
    what, command, build = INSIDE_BOUNDS[key]
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    build(ckpt)
    proc, rss, seconds = measured(command, ckpt, *(["-o", tmp_path / "port"] if command == "new" else []))
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "failed unexpectedly" not in proc.stderr, proc.stderr
    assert seconds < MAX_SECONDS and rss < MAX_RSS_BYTES, (seconds, rss)
    outcome = "port written" if proc.returncode == 0 and command == "new" else (
        "read" if proc.returncode == 0 else shown(proc.stderr.strip(), (ckpt, "CKPT")))
    record("bounds", [key, what, f"`scaffold {command} CKPT{' -o OUT' if command == 'new' else ''}`",
                      proc.returncode, outcome, f"{rss / 2**20:.0f} MB", f"{seconds:.1f} s"])


# ------------------------------------------------------------ verify input
def test_verify_against_a_broken_checkpoint_fails_cleanly(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    with open(ckpt / "model.safetensors", "r+b") as f:
        f.truncate((ckpt / "model.safetensors").stat().st_size - 64)
    proc = scaffold("verify", out, check=False)
    err = assert_clean_failure(proc, names=ckpt / "model.safetensors", expect="truncated")
    extra_row("verify-truncated", "the port's checkpoint truncated after `scaffold new`", "scaffold verify PORT",
              proc.returncode, shown(err, (ckpt, "CKPT"), (tmp_path, "TMP")))


@pytest.mark.parametrize("edit, expect", [
    (("num_heads = 4", 'num_heads = "four"'), "field 'num_heads' must be"),
    (("qkv_layout = \"separate\"", 'qkv_layout = "diagonal"'), "field 'qkv_layout' must be one of"),
    (("mlp = \"mlp\"", 'mlp = "mlp; import os"'), "names.mlp"),
], ids=["wrong-type", "unknown-choice", "not-an-identifier"])
def test_verify_of_a_port_whose_spec_was_edited_badly(edit, expect, tmp_path):
    """verify reads the port's scaffold_spec.toml with the checks a --spec override gets."""
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    spec_file = out / "scaffold_spec.toml"
    text = spec_file.read_text()
    old, new = edit
    assert old in text, f"{old!r} is not in the generated spec"
    spec_file.write_text(text.replace(old, new, 1))
    proc = scaffold("verify", out, check=False)
    err = assert_clean_failure(proc, names=spec_file, expect=expect)
    extra_row(f"verify-spec-{edit[1].split(' =')[0]}",
              f"the port's scaffold_spec.toml edited: `{new}`", "scaffold verify PORT", proc.returncode,
              shown(err, (tmp_path, "TMP")))


def test_verify_of_a_folder_that_is_not_a_port(tmp_path):
    proc = scaffold("verify", tmp_path, check=False)
    err = assert_clean_failure(proc, names=tmp_path, expect="not a generated port")
    extra_row("verify-not-a-port", "verify on a folder without scaffold_spec.toml", "scaffold verify DIR",
              proc.returncode, shown(err, (tmp_path, "DIR")))


# --------------------------------------------------------- checkpoint code
@pytest.mark.engine
def test_checkpoint_code_is_never_imported_without_consent(tmp_path):
    """inspect, new and verify (full, not --static-only) read the code as text and never import it."""
    marker = tmp_path / "IMPORTED"
    shape = Shape(**{**BASE.__dict__, "model_type": "evil_lm", "architecture": "EvilForCausalLM"})
    ckpt = write_checkpoint(tmp_path / "ckpt", shape)  # random data: verify's sharding check compares values
    marker_code(ckpt, marker)
    proc = scaffold("inspect", ckpt, "--json")
    assert "modeling_evil.py" in json.loads(proc.stdout)["warnings"][-1]
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    proc = scaffold("verify", out, "--json", check=False)
    assert not marker.exists(), marker.read_text()
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["mapping coverage"]["status"] == "pass", checks
    parity = checks["parity"]
    assert parity["status"] == "skipped"
    assert "--trust-remote-code" in parity["detail"]
    assert "configuration_evil.py" in parity["detail"] and "modeling_evil.py" in parity["detail"]
    # The generated package registers its own config class: nothing of the checkpoint's code is in it.
    package = out / "evil_vllm"
    assert "configuration_evil" not in "".join(p.read_text() for p in package.glob("*.py"))
    extra_row("remote-code", "modeling_/configuration_*.py that write a marker file and raise when imported",
              "scaffold inspect / new / verify (no --trust-remote-code)", proc.returncode,
              "no marker written; verify: `parity skipped: " + parity["detail"] + "`")


def test_unparsable_checkpoint_code_is_named(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    (ckpt / "modeling_deep.py").write_text("x = " + "-" * 200000 + "1\n")
    proc = scaffold("inspect", ckpt, check=False)
    err = assert_clean_failure(proc, names=ckpt / "modeling_deep.py", expect="cannot be parsed")
    extra_row("code-too-deep", "modeling_deep.py nested 200000 levels deep", "scaffold inspect CKPT",
              proc.returncode, shown(err, (ckpt, "CKPT")))


# ----------------------------------------------------------- inert values
HOSTILE_VALUES = {
    "x_quotes": 'a "quoted" \'string\' with """ and \\ and \n a newline',
    "x_code": "\"); import os; os.system('touch /tmp/pwned'); (\"",
    "x_nan": float("nan"),
    "x_inf": float("-inf"),
    "x_big": 10**40,
    "x_unicode": "caf\u00e9 \u2028 \x1b[31m red \x00",
    "x_nested": {"a": [1, {"b": None, "c": [True, 2.5]}], 'k"ey': "v"},
    "x_list": [1, "two", None, [3.0]],
    "not an identifier": 1,
    "class": 2,
    "super": 4,
    "kwargs": 5,
}


def test_hostile_config_values_render_inertly(tmp_path):
    """Values no detector reads reach the generated config class as literals; bad names are not declared."""
    shape = Shape(**{**BASE.__dict__, "model_type": "hostile_lm", "architecture": "HostileForCausalLM",
                     "extra": HOSTILE_VALUES})
    ckpt = write_checkpoint(tmp_path / "we`ird | name\nhere", shape, data="zeros")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    config_py = (out / "hostile_vllm" / "configuration.py").read_text()
    tree = ast.parse(config_py)
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    declared = [a.arg for a in init.args.args]
    assert declared[0] == "self" and "super" not in declared and "kwargs" not in declared[:-1]
    assert not {"not an identifier", "class"} & set(declared)
    assert {k for k in HOSTILE_VALUES if k.startswith("x_")} <= set(declared)
    assert "touch /tmp/pwned" in config_py and not Path("/tmp/pwned").exists()
    # The pure-python parts import, and the config class reproduces config.json.
    proc = subprocess.run([sys.executable, "-c", CHECK_CONFIG, str(out), "hostile_vllm", str(ckpt / "config.json")],
                          check=False, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "config ok", proc.stdout
    # scaffold_spec.toml stays valid TOML and records the odd checkpoint path exactly.
    data = tomllib.loads((out / "scaffold_spec.toml").read_text())
    assert data["port"]["checkpoint"] == str(ckpt)
    # README.md: the folder name cannot open a code span or a table, or break a line.
    readme = (out / "README.md").read_text()
    assert "vllm serve we_ird___name_here" in readme and "`we`" not in readme
    review = (out / "REVIEW.md").read_text()
    rows = [line for line in review.splitlines() if line.startswith("| `model.")]
    assert rows and all(line.count("|") == 5 for line in rows)
    assert static_checks(out)["mapping coverage"] == "pass"
    extra_row("hostile-values",
              ("config.json values with quotes, newlines, code, NaN/-Infinity, 10**40, control characters, nesting; "
               "keys that are not identifiers, keywords, super/kwargs; a checkpoint folder named "
               "'we`ird | name\\nhere'"), "scaffold new CKPT -o OUT", 0,
              "port written; values rendered as literals, unusable keys left to **kwargs, TOML and markdown inert")


CHECK_CONFIG = r"""
import importlib, json, math, sys
sys.path.insert(0, sys.argv[1])
package = importlib.import_module(sys.argv[2])
module = importlib.import_module(sys.argv[2] + ".configuration")
cls = next(v for k, v in vars(module).items() if k.endswith("Config") and k != "PretrainedConfig")
raw = json.loads(open(sys.argv[3]).read())
default = cls()
def same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)
declared = [k for k in cls.__init__.__code__.co_varnames[1:cls.__init__.__code__.co_argcount]]
bad = [k for k in declared if not same(getattr(default, k), raw[k])]
assert not bad, bad
loaded = cls(**raw)
bad = [k for k in raw if not k.startswith("_") and k not in ("architectures", "model_type", "torch_dtype",
       "dtype", "transformers_version", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id")
       and hasattr(loaded, k) and not same(getattr(loaded, k), raw[k])]
assert not bad, bad
assert package.ARCHITECTURE == raw["architectures"][0]
print("config ok")
"""


# --------------------------------------------------------- names (issue 17)
def test_an_architecture_without_a_prefix_gets_an_installable_name(tmp_path):
    """`_ForCausalLM` once gave the distribution name `-vllm`: `new` exited 0 and `pip install` failed."""
    shape = Shape(**{**BASE.__dict__, "model_type": "under-lm", "architecture": "_ForCausalLM"})
    ckpt = write_checkpoint(tmp_path / "ckpt", shape, data="zeros")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    project = tomllib.loads((out / "pyproject.toml").read_text())["project"]
    assert project["name"] == "under-lm-vllm" and (out / "under_lm_vllm" / "__init__.py").is_file()
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "--target", str(site), str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (site / "under_lm_vllm" / "model.py").is_file()
    extra_row("name-arch-underscore", "architectures is [\"_ForCausalLM\"] (no class prefix)",
              "scaffold new CKPT -o OUT; pip install OUT", 0,
              "package named from model_type: under_lm_vllm (distribution under-lm-vllm); pip installs it")


CHECK_SHADOWED_BUILTINS = r"""
import importlib, json, math, sys
sys.path.insert(0, sys.argv[1])
from transformers import AutoConfig
module = importlib.import_module(sys.argv[2] + ".configuration")
cls = next(v for k, v in vars(module).items() if k.endswith("Config") and k != "PretrainedConfig")
default = cls()
assert math.isnan(default.float[1]) and default.x_inf == math.inf and default.list == [-math.inf], vars(default)
repr(default)
AutoConfig.register(cls.model_type, cls)
loaded = AutoConfig.from_pretrained(sys.argv[3])
assert type(loaded) is cls and math.isnan(loaded.float[1]) and loaded.int == 3
again = cls.from_dict(loaded.to_dict())
assert math.isnan(again.float[1]) and again.list == [-math.inf]
print("config ok", repr(loaded)[:20])
"""


@pytest.mark.slow  # ~9 s on 2 cores: a port generated and imported in subprocesses
def test_config_keys_named_like_builtins_cannot_break_non_finite_defaults(tmp_path):
    """A key named `float` beside a NaN once made the generated `float("nan")` call the key's value."""
    extra = {"float": [1.0, float("nan")], "int": 3, "list": [float("-inf")], "x_inf": float("inf")}
    shape = Shape(**{**BASE.__dict__, "model_type": "shadow_lm", "architecture": "ShadowForCausalLM",
                     "extra": extra})
    ckpt = write_checkpoint(tmp_path / "ckpt", shape, data="zeros")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    proc = subprocess.run([sys.executable, "-c", CHECK_SHADOWED_BUILTINS, str(out), "shadow_vllm", str(ckpt)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("config ok"), proc.stdout
    extra_row("name-key-float-nan", "config.json keys float = [1.0, NaN], int, list = [-Infinity] (builtins' names)",
              "scaffold new CKPT -o OUT", 0,
              "port written; the config class's defaults, repr() and AutoConfig.from_pretrained round-trip NaN/inf")


def test_spec_override_cannot_inject_code(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    for field, value in (("model_type", 'x"""\nimport os\n"""'), ("architecture", "X(); import os"),
                         ("class_prefix", "A B"), ("package", "os.path")):
        spec = tmp_path / f"{field}.toml"
        spec.write_text(f"[spec]\n{field} = {json.dumps(value)}\n")
        proc = scaffold("new", ckpt, "-o", tmp_path / "port", "--spec", spec, check=False)
        # scaffold.choose reports a native-path failure, the spec file's included, against config.json.
        named = spec if str(spec) in proc.stderr else ckpt / "config.json"
        err = assert_clean_failure(proc, names=named, expect=field if field != "architecture" else "class name")
        assert not (tmp_path / "port").exists()
        extra_row(f"spec-{field}", f"--spec file setting {field} = {value!r}", "scaffold new CKPT --spec FILE",
                  proc.returncode, shown(err, (tmp_path, "TMP")))


# ------------------------------------------------------------------ output
def test_output_is_never_modified_without_force(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    out = tmp_path / "port"
    out.mkdir()
    (out / "mine.txt").write_text("mine")
    proc = scaffold("new", ckpt, "-o", out, check=False)
    err = assert_clean_failure(proc, names=out, expect="--force")
    assert [p.name for p in out.iterdir()] == ["mine.txt"] and (out / "mine.txt").read_text() == "mine"
    no_leftovers(tmp_path, {"ckpt", "port"})
    extra_row("out-exists", "output folder exists, no --force", "scaffold new CKPT -o OUT", proc.returncode,
              shown(err, (tmp_path, "TMP")))


@pytest.mark.parametrize("where", ["checkpoint", "parent", "cwd"])
def test_force_never_replaces_the_checkpoint_or_cwd(tmp_path, where):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    target = {"checkpoint": ckpt, "parent": tmp_path, "cwd": tmp_path / "work"}[where]
    target.mkdir(exist_ok=True)
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = subprocess.run([sys.executable, "-m", "scaffold.cli", "new", str(ckpt), "-o", str(target), "--force"],
                          check=False, capture_output=True, text=True, cwd=tmp_path / "work" if where == "cwd" else None)
    err = assert_clean_failure(proc, names=target, expect="checkpoint" if where != "cwd" else "current directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (ckpt / "model.safetensors").exists() and (ckpt / "config.json").exists()
    extra_row(f"force-{where}", f"--force with -o naming the {where} folder", "scaffold new CKPT -o X --force",
              proc.returncode, shown(err, (tmp_path, "TMP")))


def test_force_replaces_only_after_the_new_port_is_complete(tmp_path):
    """A failure while writing or checking the new port leaves the old one as it was, and no staging folder."""
    from scaffold.analysis import analyze
    from scaffold.errors import ScaffoldError
    from scaffold.render import render, write_package

    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    out = tmp_path / "port"
    scaffold("new", ckpt, "-o", out)
    old = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    analysis = analyze(ckpt)
    rendered = render(analysis.spec, analysis.ckpt)
    model = next(k for k in rendered.files if k.endswith("/model.py"))
    rendered.files[model] += "\ndef broken(:\n"  # the generation fails at the parse check
    with pytest.raises(ScaffoldError) as info:
        write_package(rendered, out, force=True)
    assert "does not parse" in info.value.message
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == old
    no_leftovers(tmp_path, {"ckpt", "port"})
    # With a good package it is replaced, permissions are those of an ordinary folder, nothing is left over.
    rendered = render(analysis.spec, analysis.ckpt)
    rendered.files["extra.txt"] = "new"
    (out / "build").mkdir()
    (out / "build" / "stale.txt").write_text("old")  # what installing the port leaves: replaced with it
    write_package(rendered, out, force=True)
    assert (out / "extra.txt").read_text() == "new" and not (out / "build").exists()
    assert out.stat().st_mode & 0o755 == 0o755
    no_leftovers(tmp_path, {"ckpt", "port"})


# ------------------------------------------------------------------ TOML
@pytest.mark.parametrize("text", ["plain", 'q"uote', "back\\slash", "new\nline\r\t", "nul\x00 esc\x1b del\x7f",
                                  "caf\u00e9 \u2028 \U0001f600", "\\u0041 not an escape", "'''", '"""'])
def test_toml_writer_round_trips_any_string(text):
    from scaffold.spec import Spec
    from scaffold.tomlio import spec_toml as to_toml

    spec = Spec(architecture="XForCausalLM", model_type="x", rope_parameters={"rope_type": text, text: 1.5,
                                                                              "none": None, "nan": float("nan")})
    data = tomllib.loads(to_toml(spec))["spec"]
    assert data["rope_parameters"]["rope_type"] == text and data["rope_parameters"][text] == 1.5
    assert "none" not in data["rope_parameters"] and math.isnan(data["rope_parameters"]["nan"])


def test_source_comment_cannot_break_out_of_toml():
    from scaffold.spec import Source, Spec
    from scaffold.tomlio import spec_toml as to_toml

    spec = Spec(architecture="XForCausalLM", model_type="x")
    spec.set("hidden_size", 8, Source("override", "evil\nhidden_size = 999\n# "))
    assert tomllib.loads(to_toml(spec))["spec"]["hidden_size"] == 8


# ------------------------------------------------------- last line of defence
UNEXPECTED = """
import sys
import scaffold.analysis
def partial(*args, **kwargs):  # what `scaffold inspect` starts from
    return {}["a bug"]
scaffold.analysis.partial = partial
from scaffold.cli import main
main(sys.argv[1:])
"""


def test_an_unexpected_exception_is_one_paragraph_not_a_traceback(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt", BASE, data="zeros")
    proc = subprocess.run([sys.executable, "-c", UNEXPECTED, "inspect", str(ckpt)], check=False, capture_output=True,
                          text=True)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert str(ckpt) in err and "KeyError" in err and "SCAFFOLD_DEBUG=1" in err
    proc = subprocess.run([sys.executable, "-c", UNEXPECTED, "inspect", str(ckpt)], check=False, capture_output=True,
                          text=True, env={**os.environ, "SCAFFOLD_DEBUG": "1"})
    assert "Traceback" in proc.stderr and "KeyError" in proc.stderr
    extra_row("unexpected", "a bug raising KeyError inside the pipeline (fault injected)", "scaffold inspect CKPT",
              2, shown(err, (ckpt, "CKPT")))


@pytest.mark.slow  # 4 to 5 s (builds transformers models, runs the CLI): the full suite keeps it, not the quick tier
def test_valid_family_checkpoints_still_generate(tmp_path):
    """The checks above refuse nothing that a real Llama-family checkpoint holds."""
    for family in ("llama", "mistral", "qwen2", "qwen3"):
        shape = Shape(family=family, architecture=f"Valid{family.capitalize()}ForCausalLM",
                      attention_bias=family != "mistral", sliding_window=None if family == "llama" else 8)
        ckpt = write_checkpoint(tmp_path / family, shape, shards=2, data="zeros")
        scaffold("new", ckpt, "-o", tmp_path / f"port-{family}")
        assert config_for(shape)["model_type"] == family


def test_hub_cache_snapshot_links_are_followed_only_into_their_own_blobs(tmp_path):
    """A Hugging Face cache snapshot links every file to ../../blobs/<hash>: allowed; another repo's blobs: not."""
    flat = write_checkpoint(tmp_path / "flat", BASE, data="zeros")
    repo = tmp_path / "hub" / "models--org--robust"
    snapshot = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted(flat.iterdir())):
        blob = repo / "blobs" / f"blob{i}"
        path.rename(blob)
        (snapshot / path.name).symlink_to(Path("..") / ".." / "blobs" / blob.name)
    scaffold("new", snapshot, "-o", tmp_path / "port")
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    shard = snapshot / "model.safetensors"
    target = shard.resolve()
    target.rename(other / "stolen")
    shard.unlink()
    shard.symlink_to(other / "stolen")
    proc = scaffold("inspect", snapshot, check=False)
    err = assert_clean_failure(proc, names=snapshot / "model.safetensors", expect="points outside")
    extra_row("hub-cache-other-repo",
              "a hub-cache snapshot whose shard links into another repository's blobs (links into its own blobs "
              "are followed)", "scaffold inspect CKPT", proc.returncode, shown(err, (tmp_path, "TMP")))
