"""Text that came from a checkpoint, made inert for the place it is shown.

Config values, module names and paths are the checkpoint author's words. On a terminal they
must not move the cursor, clear the screen or write the clipboard (escape sequences); in
Markdown they must not become HTML, links out of a code span, or new table columns. Every
sink goes through one of these functions.
"""

from __future__ import annotations

import json
import math
import re

import click

# C0 and C1 controls (tab and newline aside), DEL, line/paragraph separators and the
# bidirectional overrides that reorder what a reader sees.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match) -> str:
    return ascii(match.group())[1:-1]


def terminal_text(text: str) -> str:
    """Text safe to print on a terminal: every control character shown as its escape, lines kept."""
    return CONTROL.sub(_escape, str(text).replace("\r\n", "\n"))


def markdown_text(value) -> str:
    """Text for a Markdown line, table cell or code span, unable to break out of it.

    No line breaks or control characters (shown as escapes), no backtick to close a code span,
    no pipe to open a table column, no `<` that could start HTML or an autolink: every `<` but one
    before a space becomes `(` (CommonMark's tags and autolinks, e-mail ones included, never open
    with a space), so a condition such as `layer_idx < config.first_k_dense_replace` stays as
    written; `>` alone opens nothing inside a line, so `a -> b` stays too.
    """
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return _MARKUP_OPEN.sub("(", text.replace("`", "'").replace("|", "/"))


_MARKUP_OPEN = re.compile(r"<(?! )")  # a `<` that is not followed by a space


def markdown_fence(body: str) -> str:
    """`body` as a fenced code block that nothing in it can close (CommonMark: a longer fence)."""
    body = terminal_text(body)
    runs = [len(run) for run in re.findall(r"`+", body)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return f"{fence}\n{body}\n{fence}"


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def json_text(value) -> str:
    """JSON every parser reads: a NaN or infinity (which JSON has no word for) becomes the string naming it."""
    return json.dumps(_finite(value), indent=2, allow_nan=False)


def echo(text: str, err: bool = False) -> None:
    """Print a line of the CLI, which may quote the checkpoint, with escape sequences made visible."""
    click.echo(terminal_text(text), err=err)
