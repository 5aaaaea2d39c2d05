"""What comes from a checkpoint is inert in every output: the terminal, Markdown, JSON.

A checkpoint author controls config values, module names and even the folder's name. On a
terminal those must not clear the screen, fake a verdict or write the clipboard (escape
sequences); in REVIEW.md and README.md they must not become HTML or break out of a code span
or a fenced block; JSON must be JSON.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_factory import Shape, write_checkpoint
from robustness_doc import defence

from scaffold.text import json_text, markdown_fence, markdown_text, terminal_text

SHAPE = Shape(family="llama", architecture="InjectLlamaForCausalLM", hidden=64, heads=4, kv_heads=2, head_dim=16,
              layers=2, intermediate=96, vocab=128)
# Clear screen, a fake verdict on a fresh line, an OSC 52 clipboard write, a bidi override, HTML.
ESCAPES = "\x1b[2J\x1b[H\rALL CHECKS PASSED\n\x1b]52;c;ZXZpbA==\x07\u202e"
HTML = "<script>alert(1)</script><img src=x onerror=alert(2)>"
# A folder name a user may well be handed: a backtick closes a code span, a fence closes a block.
FOLDER = "ck`pt <b>bold</b> ```"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def cli(*args, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "scaffold.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, check=False)


def edit_config(root: Path, **changes) -> None:
    config = json.loads((root / "config.json").read_text())
    config.update(changes)
    (root / "config.json").write_text(json.dumps(config))


def outside_fences(text: str) -> list[str]:
    """The lines of Markdown text outside fenced code blocks (CommonMark: closed by a fence at least as long)."""
    out, fence = [], ""
    for line in text.splitlines():
        run = re.match(r"^`{3,}", line)
        if fence:
            if run and len(run.group()) >= len(fence) and not line.strip("`"):
                fence = ""
        elif run:
            fence = run.group()
        else:
            out.append(line)
    assert not fence, "a fenced block is never closed"
    return out


def assert_inert_markdown(text: str, where: str) -> None:
    assert not RAW.search(text), f"{where}: a raw control character"
    for line in outside_fences(text):
        for tag in ("<script", "<img", "<b>"):
            assert tag not in line, f"{where}: raw HTML {tag} in {line!r}"
        # Every code span opened on a line is closed on it (an odd count would let the rest escape).
        assert line.count("`") % 2 == 0, f"{where}: unbalanced code span in {line!r}"


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """A checkpoint in a hostile folder name whose auto_map entry carries escapes and HTML."""
    root = write_checkpoint(tmp_path_factory.mktemp("inject") / FOLDER, SHAPE, data="zeros")
    edit_config(root, auto_map={"AutoModelForCausalLM": f"modeling_inject.Model{ESCAPES}{HTML}"})
    (root / "modeling_inject.py").write_text("class Model:\n    pass\n")
    return root


def test_inspect_prints_no_escape_sequence(hostile):
    proc = cli("inspect", hostile)
    assert proc.returncode == 0, proc.stderr
    assert "Model\\x1b[2J" in proc.stdout  # shown, as its escape
    assert not RAW.search(proc.stdout + proc.stderr)
    assert "\nALL CHECKS PASSED" not in proc.stdout
    line = next(line for line in proc.stdout.splitlines() if "Model\\x1b" in line)
    defence("inject-terminal", "an auto_map entry holding clear-screen, a fake verdict, an OSC 52 clipboard write, "
            "a bidi override and HTML", "scaffold inspect CKPT", proc.returncode, line.strip(), (hostile, "CKPT"))


def test_inspect_json_is_json_and_inert(hostile, tmp_path):
    nan = write_checkpoint(tmp_path / "nan", SHAPE, data="zeros")
    edit_config(nan, logits_scaling=float("nan"), attention_multiplier=float("inf"))
    for ckpt in (hostile, nan):
        proc = cli("inspect", "--json", ckpt)
        assert proc.returncode == 0, proc.stderr
        assert not RAW.search(proc.stdout)
        data = json.loads(proc.stdout, parse_constant=lambda word: pytest.fail(f"bare {word} is not JSON"))
        assert data["checkpoint"] == str(ckpt)
    assert data["spec"]["logits_scale"] == "NaN"
    defence("inject-json-nan", "logits_scaling NaN, attention_multiplier Infinity", "scaffold inspect --json CKPT",
            proc.returncode, f'"logits_scale": {json.dumps(data["spec"]["logits_scale"])} (JSON has no NaN)')


@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_review_and_readme_of_a_native_port_are_inert(hostile, tmp_path):
    proc = cli("new", hostile, "-o", tmp_path / "port")
    assert proc.returncode == 0, proc.stderr
    assert not RAW.search(proc.stdout + proc.stderr)
    for name in ("REVIEW.md", "README.md"):
        assert_inert_markdown((tmp_path / "port" / name).read_text(), name)
    # verify writes its report into REVIEW.md inside a fence that nothing in the report can close.
    cli("verify", tmp_path / "port", "--static-only")
    review = (tmp_path / "port" / "REVIEW.md").read_text()
    assert_inert_markdown(review, "REVIEW.md after verify")
    fence = re.search(r"^(`{3,})\n", review, flags=re.MULTILINE).group(1)
    body = review.split(fence + "\n", 1)[1]
    assert body.count(fence) == 1 and "```" in body.split(fence)[0]  # the folder's ``` stayed inside
    defence("inject-markdown", "the same checkpoint, in a folder named " + FOLDER, "scaffold new CKPT -o OUT; "
            "scaffold verify OUT --static-only", proc.returncode, "REVIEW.md and README.md: no raw HTML, every code "
            f"span closed on its line, verify's report in a {len(fence)}-backtick fence")


@pytest.mark.slow  # ~13 s on 2 cores: a backend package generated and checked in subprocesses
def test_backend_package_is_inert(tmp_path):
    """The backend package of a stock checkpoint in a hostile folder: its path stays inside its code span."""
    stock = Shape(**{**SHAPE.__dict__, "architecture": "LlamaForCausalLM"})
    root = write_checkpoint(tmp_path / FOLDER, stock, data="zeros")
    proc = cli("new", root, "-o", tmp_path / "port", "--impl", "transformers")
    assert proc.returncode == 0, proc.stderr
    assert not RAW.search(proc.stdout + proc.stderr)
    for name in ("REVIEW.md", "README.md"):
        assert_inert_markdown((tmp_path / "port" / name).read_text(), name)
    assert FOLDER.replace("`", "'").replace("<", "(") in (tmp_path / "port" / "REVIEW.md").read_text()
    defence("inject-backend-markdown", "a stock Llama in a folder named " + FOLDER, "scaffold new CKPT -o OUT --impl "
            "transformers", proc.returncode, "REVIEW.md and README.md of the backend package: no raw HTML, every "
            "code span closed")


@pytest.mark.slow  # 9-20 s on 2 cores: CLI runs in subprocesses that import torch and vLLM
def test_a_hostile_rope_type_is_inert_on_every_path(tmp_path):
    """A rope type holding HTML and escapes: refused or written, it reaches no output raw."""
    stock = Shape(**{**SHAPE.__dict__, "architecture": "LlamaForCausalLM"})
    root = write_checkpoint(tmp_path / "ckpt", stock, data="zeros")
    edit_config(root, rope_parameters={"rope_type": HTML + ESCAPES, "rope_theta": 10000.0})
    for impl in ("auto", "transformers"):
        out = tmp_path / f"port-{impl}"
        proc = cli("new", root, "-o", out, "--impl", impl)
        assert not RAW.search(proc.stdout + proc.stderr)
        assert proc.returncode == 0 or "\\x1b[2J" in proc.stderr
        defence(f"inject-rope-type-{impl}", "rope_type holding HTML and escape sequences", f"scaffold new CKPT -o "
                f"OUT --impl {impl}", proc.returncode, proc.stderr or proc.stdout, (tmp_path, "TMP"))
        for markdown in out.glob("*.md"):
            assert_inert_markdown(markdown.read_text(), markdown.name)


@pytest.mark.parametrize("text", [ESCAPES, HTML, FOLDER, "a|b", "line\nbreak", "\x00\x7f\x9b"])
def test_the_sinks_make_any_text_inert(text):
    assert not RAW.search(terminal_text(text))
    md = markdown_text(text)
    assert md.isprintable() and not set(md) & set("`|") and not re.search(r"<(?! )", md)
    fenced = markdown_fence(f"before\n{text}\n```\nafter")
    fence = fenced.split("\n", 1)[0]
    assert fenced.count(fence) == 2 and fenced.endswith("\n" + fence)
    assert json.loads(json_text({"x": [float("nan"), float("-inf"), text]})) == {"x": ["NaN", "-Infinity", text]}
