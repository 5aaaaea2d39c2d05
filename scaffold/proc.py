"""Child Python processes that no folder on the user's machine can take over.

`python -m module` puts the working folder first on `sys.path`, so a `json.py` or `pip.py` in
the folder the user stands in (a checkpoint folder, say) would run inside the child. Every
child interpreter scaffold starts goes through here instead: it runs in isolated mode (`-I`:
no working folder, no script folder, no user site, no PYTHON* variables), is handed exactly
the absolute import path of the parent (plus the folders the caller adds, such as a staged
port) and starts in an empty folder of its own. It can import nothing the parent could not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

# Runs in the child: put the parent's path in front, then run the module as `python -m` would.
_BOOT = (
    "import json, runpy, sys\n"
    "sys.path[:0] = json.loads(sys.argv[1])\n"
    "sys.argv = sys.argv[2:]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def import_path(extra: Iterable[str | Path] = ()) -> list[str]:
    """The parent's import path with relative folders made absolute, `extra` first.

    An empty entry (the working folder, for `python -c` and the REPL) is left out: the child
    starts elsewhere, and the working folder is exactly what it must not see. An entry that
    names no file or folder (an import hook's key, as editable installs add) is kept as it is.
    """
    path: list[str] = []
    for entry in (*map(str, extra), *sys.path):
        if entry and not os.path.isabs(entry) and os.path.exists(entry):
            entry = os.path.abspath(entry)
        if entry and entry not in path:
            path.append(entry)
    return path


def python_command(module: str, *args: str | Path, env: dict | None = None) -> list[str]:
    """The argv that runs `module` as `python -m module args...` would, in isolated mode.

    Isolated mode ignores PYTHONPATH, so the folders that `env` puts there (a staged port)
    are handed over with the parent's path.
    """
    extra = [p for p in (env or {}).get("PYTHONPATH", "").split(os.pathsep) if p]
    return [sys.executable, "-I", "-c", _BOOT, json.dumps(import_path(extra)), module, *map(str, args)]


@contextmanager
def neutral_folder() -> Iterator[str]:
    """An empty folder for a child to start in, removed afterwards."""
    folder = tempfile.mkdtemp(prefix="scaffold-cwd-")
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_python(module: str, *args: str | Path, env: dict | None = None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of `python -m module args...`, isolated, in an empty working folder."""
    with neutral_folder() as cwd:
        return subprocess.run(python_command(module, *args, env=env), cwd=cwd, env=env, **kwargs)


def run_tool(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run of an executable (not Python code of ours) in an empty working folder."""
    with neutral_folder() as cwd:
        return subprocess.run(argv, cwd=cwd, **kwargs)


def absolute(path: str | Path) -> str:
    """A path a child in another working folder still finds."""
    return str(Path(path).absolute())


__all__ = ["absolute", "import_path", "neutral_folder", "python_command", "run_python", "run_tool"]
