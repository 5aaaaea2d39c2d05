"""Shared fixtures: tiny checkpoints built once per session, and helpers to run the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def scaffold(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the installed CLI the way a user does."""
    proc = subprocess.run([sys.executable, "-m", "scaffold.cli", *map(str, args)], capture_output=True, text=True,
                          env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"scaffold {' '.join(map(str, args))} exited {proc.returncode}:\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scaffold")


@pytest.fixture(scope="session", autouse=True)
def reference_cache(tmp_path_factory):
    """One transformers reference per checkpoint and prompt set for the whole run (verify's SCAFFOLD_CACHE)."""
    os.environ.setdefault("SCAFFOLD_CACHE", str(tmp_path_factory.mktemp("reference-cache")))


@pytest.fixture(scope="session")
def tiny(workdir):
    """tiny(model_type, architecture, **overrides) -> checkpoint path, built once per argument set."""
    from scaffold.tiny import build_tiny

    built: dict = {}

    def make(model_type: str, architecture: str, **overrides) -> Path:
        key = (model_type, architecture, json.dumps(overrides, sort_keys=True))
        if key not in built:
            built[key] = build_tiny(model_type, workdir / f"ckpt-{architecture}", architecture=architecture,
                                    overrides=overrides)
        return built[key]

    return make


MUTANTS_CAUGHT: dict[str, bool] = {}


def pytest_runtest_logreport(report):
    """Collect each mutant's outcome (recorded by test_mutations); under pytest-xdist this runs in the
    controlling process, which receives every worker's reports."""
    for name, value in report.user_properties:
        if name == "mutant caught":
            MUTANTS_CAUGHT[report.nodeid] = value


def pytest_terminal_summary(terminalreporter):
    """Print the mutation score when the mutation suite ran."""
    if MUTANTS_CAUGHT:
        terminalreporter.write_line(f"mutants caught: {sum(MUTANTS_CAUGHT.values())}/{len(MUTANTS_CAUGHT)}")
