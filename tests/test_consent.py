"""No Python file of the folder the user stands in, or of the checkpoint, runs without consent.

`python -m` puts the working folder first on sys.path: a `json.py` or `pip.py` in a checkpoint
would run inside every child interpreter scaffold starts from there. Each command is run the
way a user runs it (the installed console script) from inside the checkpoint folder, which
holds modules named after what the children import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_factory import Shape, write_checkpoint
from robustness_doc import defence

from scaffold.proc import import_path, run_python

SHAPE = Shape(family="llama", architecture="ConsentLlamaForCausalLM", hidden=128, heads=4, kv_heads=2, head_dim=32,
              layers=2, intermediate=96, vocab=128)
# Modules the children import early (the interpreter, pip, vLLM, the workers): each writes a marker if run.
PLANTED = ("json", "pip", "runpy", "tempfile", "site", "sitecustomize", "usercustomize", "typing", "torch", "vllm",
           "scaffold", "setuptools")


def plant(folder: Path, markers: Path) -> None:
    for name in PLANTED:
        (folder / f"{name}.py").write_text(f"open({str(markers / name)!r}, 'w').write('ran')\n")


def console(*args, cwd: Path) -> subprocess.CompletedProcess:
    """The installed `scaffold` script, as a user runs it."""
    script = Path(sys.executable).parent / "scaffold"
    return subprocess.run([str(script), *map(str, args)], cwd=cwd, capture_output=True, text=True, check=False)


@pytest.fixture()
def planted(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    ckpt = write_checkpoint(tmp_path / "ckpt", SHAPE)
    port = tmp_path / "port"
    subprocess.run([str(Path(sys.executable).parent / "scaffold"), "new", ckpt, "-o", port], check=True,
                   capture_output=True)
    plant(ckpt, markers)
    return ckpt, port, markers


@pytest.mark.slow  # ~25 s on 2 cores: verify's static checks import vLLM in subprocesses; the quick tier keeps the inspect/new consent test
def test_static_verify_from_inside_the_checkpoint_runs_none_of_its_files(planted):
    ckpt, _, markers = planted
    proc = console("verify", "../port", "--static-only", cwd=ckpt)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "tensor-parallel sharding" in proc.stdout  # the check that runs in a child process ran
    assert sorted(p.name for p in markers.iterdir()) == []
    defence("consent-verify-cwd", f"verify run from inside a checkpoint holding {', '.join(PLANTED)} .py files",
            "cd CKPT && scaffold verify ../port --static-only", proc.returncode,
            "none of the planted modules ran (pip, the sharding proof and ruff run in isolated children)")


def test_inspect_and_new_from_inside_the_checkpoint_run_none_of_its_files(planted):
    ckpt, _, markers = planted
    assert console("inspect", ".", cwd=ckpt).returncode == 0
    proc = console("new", ".", "-o", "../port2", cwd=ckpt)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in markers.iterdir()) == []
    defence("consent-new-cwd", "inspect and new run from inside the same checkpoint", "cd CKPT && scaffold new . -o "
            "../port2", proc.returncode, "none of the planted modules ran")


@pytest.mark.engine
def test_verify_with_the_engine_from_inside_the_checkpoint_runs_none_of_its_files(planted):
    ckpt, _, markers = planted
    proc = console("verify", "../port", cwd=ckpt)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "parity" in proc.stdout
    assert sorted(p.name for p in markers.iterdir()) == []


PROBE = "import json, sys\nprint(json.dumps(sys.path))\n"


def test_a_child_interpreter_sees_the_parents_path_and_not_its_working_folder(tmp_path, monkeypatch):
    here, extra = tmp_path / "here", tmp_path / "extra"
    here.mkdir()
    extra.mkdir()
    plant(here, tmp_path)
    (extra / "path_probe.py").write_text(PROBE)
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend("")  # as `python -c` or a REPL has it
    probe = run_python("path_probe", env={**os.environ, "PYTHONPATH": str(extra)}, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    child = json.loads(probe.stdout)
    assert "" not in child and str(here) not in child and "." not in child
    assert child[: len(import_path([extra]))] == import_path([extra])  # the parent's path, the extra folder first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["extra", "here"]  # no planted module ran


def test_new_reads_and_writes_nothing_in_the_users_cache_folders(tmp_path):
    """Compiled templates are not kept in (or loaded from) a folder that others could write to."""
    home, cache = tmp_path / "home", tmp_path / "cache"
    home.mkdir()
    cache.mkdir()
    env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "scaffold.cli", "new", write_checkpoint(tmp_path / "ckpt", SHAPE),
                           "-o", tmp_path / "port"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert list(home.iterdir()) == [] and list(cache.iterdir()) == []
    defence("consent-no-cache", "HOME and XDG_CACHE_HOME point at empty folders others could write to",
            "scaffold new CKPT -o OUT", proc.returncode, "nothing read from or written to either (no compiled-template "
            "cache)")
