"""Errors that the CLI reports as one paragraph, without a traceback."""

from __future__ import annotations

import re
from pathlib import Path

from scaffold.text import terminal_text

# Longest message the CLI prints; anything taken from a checkpoint is quoted with
# repr() and can be long, and the user needs the problem, not a megabyte of it.
MAX_MESSAGE = 4000
_NEWLINES = re.compile(r"\s*[\r\n]+\s*")


def clean(text: str, *, one_paragraph: bool) -> str:
    """Text safe to print on a terminal: no control characters, optionally no line breaks."""
    text = _NEWLINES.sub(" ", text) if one_paragraph else text
    text = terminal_text(text.replace("\r", ""))
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 20] + " ... (message cut)"
    return text


class ScaffoldError(Exception):
    """A problem with the user's input, reported as one paragraph naming the file."""

    exit_code = 2
    # Errors about the user's input are one paragraph. The base class also carries
    # reports that quote a subprocess or a linter, which keep their line breaks.
    one_paragraph = False

    def __init__(self, problem: str, path: str | Path | None = None, *, hint: str = ""):
        # `problem` says what is wrong; `hint`, what the user could do about it. Kept apart so that a caller
        # quoting the problem elsewhere (scaffold.choose, in a backend package's reason) can leave the advice out.
        self.problem = clean(str(problem).strip(), one_paragraph=self.one_paragraph)
        self.hint = clean(str(hint).strip(), one_paragraph=True)
        self.path = clean(str(path), one_paragraph=True) if path is not None else None
        super().__init__(self.message)

    @property
    def text(self) -> str:
        """The problem and the hint, without the path."""
        return f"{self.problem} {self.hint}" if self.hint else self.problem

    @property
    def message(self) -> str:
        if self.path:
            return f"{self.path}: {self.text}"
        return self.text


class CheckpointError(ScaffoldError):
    """The checkpoint is missing, malformed or inconsistent."""

    one_paragraph = True


class NonFloatTensor(CheckpointError):
    """A tensor of a dtype no port loads (an integer table, a quantized weight in a checkpoint config.json does
    not call quantized). The reader sets `tensor` and `dtype`, and `config` and `sources` as it read them, so that
    scaffold.detect.forms can name what the code computes with it."""

    tensor: str = ""
    dtype: str = ""
    config: dict | None = None
    sources: dict | None = None


class UnsupportedArchitecture(ScaffoldError):
    """The checkpoint uses a feature the generator cannot express."""

    one_paragraph = True


class SpecError(ScaffoldError):
    """A spec override file is malformed or names an unknown field."""

    one_paragraph = True


class OutputError(ScaffoldError):
    """The output directory cannot be written as asked."""

    one_paragraph = True
