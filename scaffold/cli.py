"""The `scaffold` command: a thin shell over the pipeline, the renderer and the verifier."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from scaffold import __version__
from scaffold.errors import ScaffoldError


def _fail(exc: ScaffoldError) -> None:
    click.echo(f"error: {exc.message}", err=True)
    sys.exit(exc.exit_code)


class _Group(click.Group):
    """Report ScaffoldError as one paragraph and an exit code, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except ScaffoldError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="scaffold")
def main() -> None:
    """Turn a Hugging Face checkpoint into a verified native vLLM port."""


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the spec and the weight table as JSON.")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path), help="TOML file overriding spec fields.")
def inspect(checkpoint: Path, as_json: bool, spec_file: Path | None) -> None:
    """Show what the tool understood of CHECKPOINT, tensor by tensor. Reads no tensor data."""
    from scaffold.pipeline import analyze
    from scaffold.review import inspect_json, inspect_text

    analysis = analyze(checkpoint, spec_file)
    if as_json:
        click.echo(json.dumps(inspect_json(analysis), indent=2))
    else:
        click.echo(inspect_text(analysis))


@main.command()
@click.argument("checkpoint", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), help="Output folder (default: ./<package>).")
@click.option("--force", is_flag=True, help="Replace an existing output folder, once the new one is complete.")
@click.option("--spec", "spec_file", type=click.Path(path_type=Path), help="TOML file overriding spec fields.")
@click.option("--trust-remote-code", is_flag=True,
              help="Record that the checkpoint's own code may run (for verify's transformers reference).")
def new(checkpoint: Path, out: Path | None, force: bool, spec_file: Path | None, trust_remote_code: bool) -> None:
    """Generate a vLLM plugin package porting CHECKPOINT."""
    from scaffold.pipeline import analyze, generate

    analysis = analyze(checkpoint, spec_file)
    target = generate(analysis, out or Path(analysis.spec.package), force=force, trust_remote_code=trust_remote_code)
    click.echo(f"wrote {target} ({analysis.spec.architecture}, {len(analysis.rows)} tensors mapped)")
    click.echo(f"next: pip install {target} && scaffold verify {target}")


@main.command()
@click.argument("port", type=click.Path(path_type=Path))
@click.option("--checkpoint", type=click.Path(path_type=Path), help="Checkpoint to verify against "
              "(default: the one the port was generated from).")
@click.option("--trust-remote-code", is_flag=True, help="Allow the checkpoint's own code to run for the reference.")
@click.option("--tp", "tensor_parallel", type=int, default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--static-only", is_flag=True, help="Run the static checks only, no engine.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify(port: Path, checkpoint: Path | None, trust_remote_code: bool, tensor_parallel: int, static_only: bool,
           as_json: bool) -> None:
    """Check that PORT computes what the original model computes."""
    from scaffold import verify as verifier

    report = verifier.run(port, checkpoint=checkpoint, trust_remote_code=trust_remote_code,
                          tensor_parallel_size=tensor_parallel, static_only=static_only,
                          progress=None if as_json else lambda line: click.echo(line, err=True))
    click.echo(json.dumps(report.to_json(), indent=2) if as_json else report.render())
    if not report.passed:
        sys.exit(1)


if __name__ == "__main__":
    main()
