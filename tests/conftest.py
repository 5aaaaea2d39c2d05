"""Shared fixtures: tiny checkpoints built once per session, one reference cache (helpers: helpers.py)."""

from __future__ import annotations

import compileall
import json
import os
from pathlib import Path

import pytest

# Helpers live in helpers.py; these names stay importable from here for the files that still do so.
from helpers import EXAMPLES, REPO, scaffold  # noqa: F401

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_configure(config):
    """Compile the package once before the workers start (only in the controller process).

    The suite runs `scaffold` in hundreds of subprocesses; where PYTHONDONTWRITEBYTECODE is set (as on
    these machines), each would otherwise compile every module again (0.45 s an import becomes 1.2 s).
    Python still reads bytecode it did not write, and a stale file is ignored where its source changed.
    """
    if not hasattr(config, "workerinput"):
        compileall.compile_dir(REPO / "scaffold", quiet=1)


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


@pytest.fixture(scope="session")
def realmodel(tmp_path_factory):
    """realmodel(name) -> a tiny checkpoint of ../shared/realmodels' `name`, built once per session."""
    from helpers import build_realmodel

    out = tmp_path_factory.mktemp("realmodels")
    built: dict = {}

    def make(name: str) -> Path:
        if name not in built:
            built[name] = build_realmodel(name, out)
        return built[name]

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


@pytest.fixture(scope="session")
def float_ckpt(workdir):
    """float_ckpt(shape) -> a tiny float checkpoint of that shape (a key of quantized_ckpt.SHAPES), built once."""
    from quantized_ckpt import SHAPES

    from scaffold.tiny import build_tiny

    built = {}

    def make(shape: str):
        if shape not in built:
            built[shape] = build_tiny(shape, workdir / f"ckpt-quant-float-{shape}", architecture=SHAPES[shape], seed=2)
        return built[shape]

    return make


@pytest.fixture(scope="session")
def float_llama(float_ckpt):
    return float_ckpt("llama")
