"""Errors that the CLI reports as one paragraph, without a traceback."""

from __future__ import annotations

from pathlib import Path


class ScaffoldError(Exception):
    """A problem with the user's input, reported as one paragraph naming the file."""

    exit_code = 2

    def __init__(self, problem: str, path: str | Path | None = None):
        self.problem = problem.strip()
        self.path = str(path) if path is not None else None
        super().__init__(self.message)

    @property
    def message(self) -> str:
        if self.path:
            return f"{self.path}: {self.problem}"
        return self.problem


class CheckpointError(ScaffoldError):
    """The checkpoint is missing, malformed or inconsistent."""


class UnsupportedArchitecture(ScaffoldError):
    """The checkpoint uses a feature the generator cannot express."""


class SpecError(ScaffoldError):
    """A spec override file is malformed or names an unknown field."""


class OutputError(ScaffoldError):
    """The output directory cannot be written as asked."""


class VerifyFailed(ScaffoldError):
    """Verification ran and found the port wrong."""

    exit_code = 1
