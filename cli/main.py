"""The `rlxc` command: a click group; each subcommand is one stage of the toolchain.

    rlxc opt FILE.mlir -p 'rlx-grad{wrt=w},cse'   run named passes, print the module
    rlxc opt --list-passes                         the pass names with one-line help

Subcommands register on the group with `@main.command()`. Modules listed in
SUBCOMMAND_MODULES (e.g. `rlxc.cli.compile`, which adds `rlxc compile`) are
imported when the group first needs its command list, and skipped while they
do not exist, so a missing optional stage costs nothing and breaks nothing.
"""
from __future__ import annotations

import importlib
import sys

import click

SUBCOMMAND_MODULES = ("rlxc.cli.compile",)


class _Group(click.Group):
    """A click group that imports the optional subcommand modules on first use."""

    _loaded = False

    def _load(self):
        if self._loaded:
            return
        self._loaded = True
        for mod in SUBCOMMAND_MODULES:
            try:
                importlib.import_module(mod)
            except ModuleNotFoundError as e:
                if e.name != mod:
                    raise

    def list_commands(self, ctx):
        self._load()
        return super().list_commands(ctx)

    def get_command(self, ctx, name):
        self._load()
        return super().get_command(ctx, name)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rlxc", prog_name="rlxc")
def main():
    """rlxc: an ahead-of-time ML compiler with JAX-style transforms over an MLIR dialect."""


def _list_passes() -> str:
    from rlxc.dialect.passes import DESCRIPTIONS, PASSES

    width = max(len(n) for n in PASSES)
    return "\n".join(f"  {n:<{width}}  {DESCRIPTIONS.get(n, '')}" for n in PASSES)


@main.command()
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False,
                                                        allow_dash=True))
@click.option("-p", "--pass-pipeline", "pipeline", default="", metavar="PIPELINE",
              help="Comma-separated passes in mlir-opt syntax, e.g. 'rlx-grad{wrt=w},cse'.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, allow_dash=True), default="-",
              help="Where to write the resulting module (default: stdout).")
@click.option("--list-passes", is_flag=True, help="List the available passes and exit.")
@click.option("--verify/--no-verify", default=True, show_default=True,
              help="Verify the module after the pipeline.")
@click.option("--print-generic", is_flag=True,
              help="Print MLIR's generic op form (what upstream MLIR parses with "
                   "unregistered dialects allowed).")
def opt(file, pipeline, output, list_passes, verify, print_generic):
    """Run rlx passes over FILE (MLIR text, '-' for stdin) and print the result.

    Passes: run `rlxc opt --list-passes`."""
    if list_passes:
        click.echo("Available passes:\n" + _list_passes())
        return
    if file is None:
        raise click.UsageError("missing FILE (an .mlir file, or '-' for stdin); "
                               "or use --list-passes")
    from rlxc.dialect.passes import PipelineError, parse_pipeline
    from rlxc.runtime.errors import NameLookupError

    try:
        passes = parse_pipeline(pipeline)
    except NameLookupError as e:
        raise click.BadParameter(f"{e}", param_hint="'-p' / '--pass-pipeline'") from None
    except PipelineError as e:
        raise click.BadParameter(str(e), param_hint="'-p' / '--pass-pipeline'") from None

    from xdsl.utils.exceptions import ParseError

    from rlxc.dialect import module as M

    text = click.open_file(file, "r").read()
    try:
        whole = M.parse_any(text)
        mods = M.split(whole)  # several functions (e.g. model + train step): each on its own
        for m in mods:
            M.signature(M.get_func(m))
    except ParseError as e:
        raise click.ClickException(f"{file}: cannot parse:\n{e}") from None
    except Exception as e:  # verifier errors and malformed signatures
        raise click.ClickException(f"{file}: {e}") from None
    ctx = M.context()
    for p in passes:
        for m in mods:
            try:
                p.apply(ctx, m)
            except (ValueError, KeyError, TypeError, NotImplementedError) as e:
                msg = str(e.args[0] if isinstance(e, KeyError) and e.args else e)
                short = p.name.removeprefix("rlx-")
                if not (msg.startswith(p.name) or msg.startswith(short)):
                    msg = f"{p.name}: {msg}"
                if len(mods) > 1:
                    msg = f"@{M.get_func(m).sym_name.data}: {msg}"
                raise click.ClickException(msg) from None
    mod = mods[0] if len(mods) == 1 else M.join(mods)
    if verify:
        try:
            mod.verify()
        except Exception as e:
            raise click.ClickException(f"the module does not verify after the pipeline: {e}")
    with click.open_file(output, "w") as out:
        out.write((M.to_generic_text(mod) if print_generic else M.to_text(mod)) + "\n")


if __name__ == "__main__":
    # run through the package module so that subcommand modules register on this group
    from rlxc.cli.main import main as _main

    sys.exit(_main())
