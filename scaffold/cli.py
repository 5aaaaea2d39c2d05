"""The `scaffold` command: a thin shell over the analysis, the two generators, the verifier, bench and compare."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from scaffold import __version__
from scaffold import verify as verifier
from scaffold.analysis import complete, partial, partial_json, partial_text
from scaffold.backend.generator import generate as generate_backend
from scaffold.bench import bench
from scaffold.choose import choose
from scaffold.compare import compare_command
from scaffold.detect import SpecIncomplete
from scaffold.errors import OutputError, ScaffoldError
from scaffold.pipeline import generate
from scaffold.review import inspect_json, inspect_text
from scaffold.text import echo, json_text
from scaffold.tomlio import spec_template


def _fail(exc: ScaffoldError) -> None:
    echo(f"error: {exc.message}", err=True)
    sys.exit(exc.exit_code)


def _unexpected(exc: Exception, ctx: click.Context) -> ScaffoldError:
    """An exception no check anticipated, as one paragraph naming the input (SCAFFOLD_DEBUG=1: re-raise)."""
    if os.environ.get("SCAFFOLD_DEBUG"):
        raise exc
    target = ctx.params.get("checkpoint") or ctx.params.get("port")
    return ScaffoldError(
        f"scaffold {ctx.info_name} failed unexpectedly ({type(exc).__name__}: {exc}). The input may hold a "
        "value of a type or size scaffold does not expect; if it looks valid, this is a bug: rerun with "
        "SCAFFOLD_DEBUG=1 to see the traceback, and report it.",
        target,
    )


class _Command(click.Command):
    """Turn any exception a command did not anticipate into a one-paragraph error, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (ScaffoldError, click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as exc:  # noqa: BLE001 - the CLI's last line of defence
            error = _unexpected(exc, ctx)
            error.problem = " ".join(error.problem.split())
            raise error from None


class _Group(click.Group):
    """Report ScaffoldError as one paragraph and an exit code, never a traceback."""

    command_class = _Command

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ScaffoldError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="scaffold")
def main() -> None:
    """Turn a Hugging Face checkpoint into a verified native vLLM port."""


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the spec and the weight table as JSON.")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path), help="TOML file overriding spec fields.")
@click.option("--spec-template", "template", type=click.Path(path_type=Path),
              help="Write a spec file with every field to this path ('-': standard output): the detected values "
                   "with their sources, the fields the tool could not determine marked UNKNOWN. Filled in, it is "
                   "a --spec file.")
@click.option("--trust-remote-code", is_flag=True,
              help="Allow running the checkpoint's own code to settle what reading it leaves open (as for new).")
def inspect(checkpoint: Path, as_json: bool, spec_file: Path | None, template: Path | None,
            trust_remote_code: bool) -> None:
    """Show what the tool understood of CHECKPOINT, tensor by tensor. Reads no tensor data.

    Where it cannot determine every field, it shows what it did understand and what it did not (exit 2)."""
    if template is not None:
        ckpt, spec = partial(checkpoint, spec_file, run_code=trust_remote_code)
        text = spec_template(spec, str(ckpt.path), ckpt.config, list(ckpt.tensors))
        if str(template) == "-":
            echo(text.rstrip("\n"))
        else:
            write_new_file(template, text)
            unknown = len([f for f in spec.unknowns if not f.startswith("(")])
            echo(f"wrote {template}" + (f" ({unknown} field(s) marked UNKNOWN: fill them in, then "
                                       f"`scaffold new {checkpoint} --spec {template}`)" if unknown else ""))
        return
    ckpt, spec = partial(checkpoint, spec_file, run_code=trust_remote_code)  # detected and settled once
    try:
        analysis = complete(ckpt, spec, spec_file)
    except SpecIncomplete:
        # What was understood, then the refusal naming what was not.
        echo(json_text(partial_json(spec, ckpt.path)) if as_json else partial_text(spec))
        raise
    if as_json:
        echo(json_text(inspect_json(analysis)))
    else:
        echo(inspect_text(analysis))


def write_new_file(path: Path, text: str) -> None:
    """Write `text` to `path`, which must not exist yet: whole or not at all."""
    if path.exists() or path.is_symlink():
        raise OutputError("the file exists; scaffold does not overwrite it.", path,
                          hint="Remove it or choose another name.")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write the file ({exc.strerror or exc}).", path) from None


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Output folder (default: ./<package>).")
@click.option("--force", is_flag=True, help="Replace an existing output folder, once the new one is complete.")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path), help="TOML file overriding spec fields.")
@click.option("--trust-remote-code", is_flag=True,
              help="Record that the checkpoint's own code may run (for verify's transformers reference).")
@click.option("--impl", type=click.Choice(["auto", "native", "transformers"]), default="auto", show_default=True,
              help="native: a generated vLLM model; transformers: a package serving the checkpoint through vLLM's "
                   "transformers backend; auto: native when the spec can express the architecture, else the "
                   "backend when the model's code is compliant.")
def new(checkpoint: Path, out: Path | None, force: bool, spec_file: Path | None, trust_remote_code: bool,
        impl: str) -> None:
    """Generate a vLLM plugin package porting CHECKPOINT."""
    choice = choose(checkpoint, spec_file, impl, trust_remote_code)
    if choice.impl == "native":
        analysis = choice.analysis
        target = generate(analysis, out or Path(analysis.spec.package), force=force,
                          trust_remote_code=trust_remote_code)
        echo(f"wrote {target} ({analysis.spec.architecture}, {len(analysis.rows)} tensors mapped)")
        if analysis.spec.recurrent_stacks:
            echo("note: no pipeline parallelism: the layer stacks run in cycles, every cycle through every stack, "
                 "so vLLM refuses --pipeline-parallel-size above 1 for this port (README.md)")
    else:
        target = generate_backend(choice.backend, out, force=force, reason=choice.reason)
        comp = choice.backend.compliance
        echo(f"wrote {target} ({comp.model_class} through vLLM's transformers backend, "
                   f"{len(comp.expected)} fusions expected; {choice.reason})")
        click.echo(f"tensors: {choice.backend.tensors.summary()}; parity with transformers not checked yet "
                   "(no engine has run it)")
        for defect in choice.backend.defects:
            echo(f"warning: known defect of this vLLM's backend: {defect}", err=True)
    echo(f"next: pip install {target} && scaffold verify {target}")


@main.command()
@click.argument("port", type=click.Path(path_type=Path))
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Checkpoint to verify against "
              "(default: the one the port was generated from).")
@click.option("--trust-remote-code", is_flag=True, help="Allow the checkpoint's own code to run for the reference.")
@click.option("--tp", "tensor_parallel", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--static-only", is_flag=True, help="Run the static checks only, no engine.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--twin", is_flag=True, help="For a checkpoint too large for this machine: static checks on its "
              "headers only, parity on a shrunk random twin with the same spec.")
@click.option("--reference-attention", type=click.Choice(["eager", "sdpa"]), default=None,
              help="Attention implementation transformers runs the reference with (default: eager). Use sdpa where "
                   "transformers' eager path is itself wrong (transformers 5.19's Falcon with ALiBi).")
def verify(port: Path, checkpoint: Path | None, trust_remote_code: bool, tensor_parallel: int, static_only: bool,
           as_json: bool, twin: bool, reference_attention: str | None) -> None:
    """Check that PORT computes what the original model computes."""
    report = verifier.run(port, checkpoint=checkpoint, trust_remote_code=trust_remote_code,
                          tensor_parallel_size=tensor_parallel, static_only=static_only, twin=twin,
                          reference_attention=reference_attention,
                          progress=None if as_json else lambda line: echo(line, err=True))
    echo(json_text(report.to_json()) if as_json else report.render())
    verifier.record_in_review(port, report)
    if not report.passed:
        sys.exit(1)


main.add_command(bench)
main.add_command(compare_command)

if __name__ == "__main__":
    main()
