"""`--force` replaces a port scaffold wrote, or an empty folder, and nothing else; a write that
fails or is terminated leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_factory import Shape, write_checkpoint
from robustness_doc import defence

from scaffold.analysis import analyze
from scaffold.errors import ScaffoldError
from scaffold.render import MANIFEST, render, write_package

SHAPE = Shape(family="llama", architecture="ForceLlamaForCausalLM", hidden=64, heads=4, kv_heads=2, head_dim=16,
              layers=2, intermediate=96, vocab=128)


def new(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scaffold.cli", "new", *map(str, args)], capture_output=True,
                          text=True, env=env, check=False)


def tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("force") / "ckpt", SHAPE, data="zeros")


def test_force_refuses_a_folder_above_the_home_folder(ckpt, tmp_path):
    home = tmp_path / "home" / "alice"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret")
    before = tree(tmp_path / "home")
    proc = new(ckpt, "-o", tmp_path / "home", "--force", env={**os.environ, "HOME": str(home)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "neither" in proc.stderr and str(tmp_path / "home") in proc.stderr
    assert tree(tmp_path / "home") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    defence("force-above-home", "--force with -o naming the folder above $HOME (which holds .ssh/)",
            "HOME=TMP/home/alice scaffold new CKPT -o TMP/home --force", proc.returncode, proc.stderr,
            (tmp_path, "TMP"))


def test_force_refuses_any_folder_scaffold_did_not_write(ckpt, tmp_path):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    proc = new(ckpt, "-o", project, "--force")
    assert proc.returncode == 2 and "empty folder or a port scaffold wrote" in proc.stderr
    assert (project / "src" / "main.py").read_text() == "print('mine')\n"
    defence("force-project", "--force with -o naming a project folder", "scaffold new CKPT -o PROJECT --force",
            proc.returncode, proc.stderr, (tmp_path, "TMP"))


def test_force_replaces_an_empty_folder(ckpt, tmp_path):
    out = tmp_path / "port"
    out.mkdir()
    proc = new(ckpt, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (out / MANIFEST).exists() and (out / "scaffold_spec.toml").exists()


def test_force_replaces_a_previous_port_with_its_build_leftovers(ckpt, tmp_path):
    out = tmp_path / "port"
    assert new(ckpt, "-o", out).returncode == 0
    package = next(p for p in out.iterdir() if p.is_dir() and (p / "model.py").exists())
    (package / "model.py").write_text("# edited by hand\n")  # the tool's own file: regenerated
    for leftover in ("build/lib/x.py", f"{package.name}.egg-info/PKG-INFO", f"{package.name}/__pycache__/m.pyc",
                     ".pytest_cache/v/cache"):
        (out / leftover).parent.mkdir(parents=True, exist_ok=True)
        (out / leftover).write_text("x")
    proc = new(ckpt, "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (package / "model.py").read_text() != "# edited by hand\n"
    assert not (out / "build").exists() and not (out / ".pytest_cache").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["port"]
    defence("force-previous-port", "--force on a previous port with a hand edit and build leftovers",
            "scaffold new CKPT -o PORT --force", proc.returncode, "replaced; build/, *.egg-info, __pycache__ and "
            ".pytest_cache removed with it")


def test_force_refuses_a_previous_port_holding_files_of_the_users(ckpt, tmp_path):
    out = tmp_path / "port"
    assert new(ckpt, "-o", out).returncode == 0
    (out / "notes.md").write_text("mine")
    (out / "data").mkdir()
    (out / "data" / "prompts.txt").write_text("mine")
    before = tree(out)
    proc = new(ckpt, "-o", out, "--force")
    assert proc.returncode == 2 and "data, data/prompts.txt, notes.md" in proc.stderr, proc.stderr
    assert tree(out) == before
    defence("force-users-files", "--force on a previous port that now holds files of the user's",
            "scaffold new CKPT -o PORT --force", proc.returncode, proc.stderr, (tmp_path, "TMP"))


def test_force_refuses_a_port_whose_manifest_is_not_scaffolds(ckpt, tmp_path):
    out = tmp_path / "port"
    assert new(ckpt, "-o", out).returncode == 0
    (out / MANIFEST).write_text("[1, 2]")
    before = tree(out)
    proc = new(ckpt, "-o", out, "--force")
    assert proc.returncode == 2 and "neither" in proc.stderr
    assert tree(out) == before
    defence("force-foreign-manifest", "--force on a port whose .scaffold-manifest.json is not scaffold's",
            "scaffold new CKPT -o PORT --force", proc.returncode, proc.stderr, (tmp_path, "TMP"))


def test_a_failed_write_leaves_no_parent_folder_it_made(ckpt, tmp_path):
    analysis = analyze(ckpt)
    rendered = render(analysis.spec, analysis.ckpt)
    model = next(k for k in rendered.files if k.endswith("/model.py"))
    rendered.files[model] += "\ndef broken(:\n"
    (tmp_path / "kept").mkdir()
    with pytest.raises(ScaffoldError, match="does not parse"):
        write_package(rendered, tmp_path / "kept" / "a" / "b" / "port", force=False)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["kept"]
    defence("write-fails-parents", "the write fails (a generated file does not parse) under new parent folders",
            "scaffold new CKPT -o TMP/kept/a/b/port", 2, "no staging folder and none of a/b/ left")


TERMINATED = """
import os, signal, sys
from pathlib import Path
import scaffold.render as render
from scaffold.analysis import analyze

real = render.format_and_check
def check_then_terminate(folder):
    real(folder)
    Path(sys.argv[2]).write_text(str(folder))  # the staging folder existed when the signal came
    os.kill(os.getpid(), signal.SIGTERM)
render.format_and_check = check_then_terminate
analysis = analyze(sys.argv[1])
render.write_package(render.render(analysis.spec, analysis.ckpt), Path(sys.argv[3]), force=True)
"""


@pytest.mark.parametrize("existing", [False, True], ids=["new", "replacing"])
def test_sigterm_during_the_write_leaves_nothing_behind(ckpt, tmp_path, existing):
    out = tmp_path / "a" / "b" / "port"
    if existing:
        assert new(ckpt, "-o", out).returncode == 0
    before = tree(tmp_path)
    seen = tmp_path.parent / f"{tmp_path.name}-staging"
    proc = subprocess.run([sys.executable, "-c", TERMINATED, ckpt, seen, out], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert Path(seen.read_text()).name.startswith(".port.new-")  # it was killed mid-write
    assert tree(tmp_path) == before
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_dir()
                  and p.name.startswith(".")) == []
    if not existing:
        assert list(tmp_path.iterdir()) == []
    defence(f"sigterm-{'replacing' if existing else 'new'}", "SIGTERM while the port is being written"
            + (" over a previous one" if existing else " into new parent folders"), "kill -TERM (scaffold new, mid-write)",
            proc.returncode, "no staging folder, no new parent folder" + (", the previous port intact" if existing
                                                                            else ""))
