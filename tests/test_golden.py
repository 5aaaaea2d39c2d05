"""Golden ports: `scaffold new` on a handful of checkpoints must write exactly the committed packages.

tests/golden/<name>/ holds every file `scaffold new` wrote for the checkpoint (see
helpers.GOLDEN_PORTS), with the checkpoint's absolute path replaced by a placeholder. A change to
the generator that changes any port shows up here as a unified diff; when the change is intended,
run `python scripts/update_golden.py` and commit the new goldens with it. No engine is started.
"""

from __future__ import annotations

import difflib

import pytest
from helpers import GOLDEN, GOLDEN_PORTS, generate_golden, golden_checkpoint, golden_workdir, read_golden

MAX_DIFF_LINES = 400


@pytest.fixture(scope="module")
def checkpoints() -> dict:
    with golden_workdir() as root:
        yield {name: golden_checkpoint(port, root) for name, port in GOLDEN_PORTS.items()}


def unified_diff(expected: dict[str, str], actual: dict[str, str], name: str) -> str:
    lines: list[str] = []
    for rel in sorted(expected.keys() | actual.keys()):
        before, after = expected.get(rel), actual.get(rel)
        if before == after:
            continue
        lines += difflib.unified_diff((before or "").splitlines(keepends=True), (after or "").splitlines(keepends=True),
                                      f"golden/{name}/{rel}" if before is not None else "/dev/null",
                                      f"generated/{name}/{rel}" if after is not None else "/dev/null")
    if len(lines) > MAX_DIFF_LINES:
        lines = lines[:MAX_DIFF_LINES] + [f"... {len(lines) - MAX_DIFF_LINES} more diff lines\n"]
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


@pytest.mark.parametrize("name", list(GOLDEN_PORTS))
def test_generated_port_matches_golden(name, checkpoints, tmp_path):
    expected = read_golden(name)
    assert expected, f"no golden files under {GOLDEN / name}; run python scripts/update_golden.py"
    actual = generate_golden(GOLDEN_PORTS[name], checkpoints[name], tmp_path / "port")
    diff = unified_diff(expected, actual, name)
    if diff:
        pytest.fail(f"scaffold new no longer writes the golden port {name!r}. If the change is intended, run "
                    f"`python scripts/update_golden.py` and commit tests/golden/.\n{diff}", pytrace=False)


def test_every_golden_folder_is_a_declared_port():
    """A golden left behind by a renamed or removed port would never be checked again."""
    folders = {p.name for p in GOLDEN.iterdir() if p.is_dir()}
    assert folders == set(GOLDEN_PORTS), f"folders {sorted(folders)} vs ports {sorted(GOLDEN_PORTS)}"
