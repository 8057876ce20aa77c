"""``receivewal analyze``: the command line of the Spark job in :mod:`receivewal.check.analyze`.

pyspark is imported only when the command runs (the ``spark`` extra), so ``--help`` and the
rest of the CLI work without it. The embedded session's scratch directory is removed when the
command ends.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from receivewal.archive.durable import scratch_directory
from receivewal.commands import catalog
from receivewal.commands.clickoptions import click_option
from receivewal.commands.output import deliver
from receivewal.commands.verify import named_archive
from receivewal.errors import ArchiveError, ConfigurationError, StoreError
from receivewal.secrets import is_private_key, key_given_as_file

T = TypeVar("T")
EXIT_CODES = """\b
Exit codes: 0 every archive is recoverable; 1 one is not, or the job failed;
2 a usage error, or the summary could not be written.
With --changes: 0 every change log was read; 1 one could not be, or the job failed.
With --as-of: 0 the tables were written; 1 the log cannot build them there, or the job
failed."""


def named_archives(ctx: click.Context, param: click.Parameter, value: tuple[str, ...],
                   ) -> tuple[str, ...]:
    """Archive arguments that each name something (an empty one would read as the current
    directory)."""
    for archive in value:
        named_archive(ctx, param, archive)
    return value


@click.command("analyze", short_help="Verify and chart many WAL archives on Spark.",
               epilog=EXIT_CODES)
@click.argument("inputs", nargs=-1, required=True, metavar="DIR-OR-URI...",
                callback=named_archives)
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              default=Path("receivewal-analysis"), show_default=True,
              help="Directory for the Parquet tables and the report.")
@click.option("--remote", default=None, metavar="sc://HOST:PORT",
              help="Run on a Spark Connect server instead of an embedded local session.")
@click.option("--master", default="local[*]", show_default=True,
              help="Master of the embedded session (ignored with --remote or spark-submit).")
@click.option("--no-compressibility", is_flag=True,
              help="Skip measuring each segment after zstd level 1 and lz4.")
@click_option(catalog.IDENTITY.but(
    help="age identity file that decrypts encrypted segments (.age); read at the same path "
    f"on every executor (env {catalog.IDENTITY.env})."),
    type=click.Path(dir_okay=False), default=None)
@click.option("--changes", is_flag=True,
              help="The inputs are logical change logs (JSON Lines, format 1), not WAL "
                   "archives: count changes per table and hour.")
@click.option("--as-of", "as_of", default=None, metavar="TIME|LSN",
              help="With --changes and --tables: build the change log's tables as they were "
                   "at the last commit at or before this LSN (X/X) or time (ISO 8601 with its "
                   "zone).")
@click.option("--tables", "tables_out", default=None, metavar="DIR-OR-URI",
              help="With --as-of: where the tables go, as Parquet, one folder per table "
                   "(<schema>.<table>); a directory or s3://BUCKET/PREFIX.")
@click.option("--without-snapshot", is_flag=True,
              help="With --as-of: build the tables of a log that has no snapshot from its "
                   "changes alone (they then lack every row from before the slot).")
def analyze_command(inputs: tuple[str, ...], output: Path, *, remote: str | None, master: str,
                    no_compressibility: bool, identity: str | None, changes: bool,
                    as_of: str | None, tables_out: str | None,
                    without_snapshot: bool) -> None:
    """Verify and analyse WAL archives (directories, s3://BUCKET/PREFIX read with boto3, or
    Hadoop URIs such as hdfs://) as a Spark job: Parquet tables and a report with charts.

    With --changes the inputs are change log directories (what receivewal logical writes): the
    report counts inserts, updates, deletes and truncates per table and per hour.

    With --changes, --as-of TIME|LSN and --tables OUT, the input is one change log with its
    snapshot: its tables as they were at that point are written to OUT as Parquet.

    Needs the spark extra: pip install 'receivewal[spark]' (pyspark, pyarrow, matplotlib;
    Java for the embedded session).
    """
    check_as_of_options(inputs, changes=changes, as_of=as_of, tables_out=tables_out,
                        without_snapshot=without_snapshot)
    if identity and is_private_key(identity):
        raise click.ClickException(key_given_as_file(catalog.IDENTITY.named()))
    try:
        import pyspark  # noqa: F401, PLC0415 - only to fail early with a clear message
    except ImportError as exc:
        raise click.ClickException("analyze needs the spark extra: "
                                   "pip install 'receivewal[spark]'") from exc
    from receivewal.check import analyze  # noqa: PLC0415 - pyspark lazily
    from receivewal.check import changes as change_logs  # noqa: PLC0415 - pyspark lazily

    roots = change_logs.resolved(inputs)
    key_file = str(Path(identity).resolve()) if identity else None
    if as_of is not None and tables_out is not None:
        lines, status = as_of_tables(roots[0], as_of, tables_out, remote=remote, master=master,
                                     identity=key_file, without_snapshot=without_snapshot), 0
    elif changes:
        result = in_session(remote, master, lambda spark: change_logs.run_changes(
            spark, roots, output, identity=key_file))
        lines, status = change_logs.summary_lines(result), 0
    else:
        archives = in_session(remote, master, lambda spark: analyze.run_analyze(
            spark, roots, output, compressibility=not no_compressibility,
            identity_file=key_file))
        lines = analyze.summary_lines(archives)
        status = 0 if all(rep.recoverable for rep in archives.archives.values()) else 1
    status = deliver(lambda: click.echo("\n".join(lines)), status)
    if status:
        raise click.exceptions.Exit(status)


def in_session(remote: str | None, master: str, job: Callable[[Any], T]) -> T:
    """Run ``job`` in a Spark session made for it (its scratch directory removed after); a
    bad input's error as a one-line ClickException."""
    from receivewal.check import sparksession  # noqa: PLC0415 - pyspark lazily

    scratch = scratch_directory("receivewal-spark-")
    try:
        spark = sparksession.make_session(remote, scratch=scratch, master=master)
        try:
            return job(spark)
        except (ArchiveError, ConfigurationError, StoreError) as exc:
            raise click.ClickException(str(exc)) from exc
        finally:
            spark.stop()  # releases a Connect session on the server; ends a local one
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_as_of_options(inputs: tuple[str, ...], *, changes: bool, as_of: str | None,
                        tables_out: str | None, without_snapshot: bool) -> None:
    """--as-of, --tables and --without-snapshot go together, with --changes and one log."""
    if as_of is None and tables_out is None:
        if without_snapshot:
            raise click.UsageError("--without-snapshot goes with --as-of and --tables")
        return
    if not changes:
        raise click.UsageError(f"{'--as-of' if as_of is not None else '--tables'} needs "
                               "--changes: it builds a change log's tables")
    if as_of is None:
        raise click.UsageError("--tables needs --as-of TIME|LSN: the point the tables are "
                               "built at")
    if tables_out is None:
        raise click.UsageError("--as-of needs --tables DIR-OR-URI: where the tables go")
    if not tables_out:
        raise click.UsageError("--tables needs a directory or s3://BUCKET/PREFIX")
    if len(inputs) != 1:
        raise click.UsageError(f"--as-of builds one change log's tables; {len(inputs)} "
                               "change logs were given")
    from receivewal.check.asof import parse_as_of  # noqa: PLC0415 - only with --as-of

    try:
        parse_as_of(as_of)
    except ConfigurationError as exc:
        raise click.UsageError(str(exc)) from exc


def as_of_tables(root: str, as_of: str, tables_out: str, *, remote: str | None, master: str,
                 identity: str | None, without_snapshot: bool) -> list[str]:
    """Build the tables of the change log ``root`` at ``as_of`` into ``tables_out``; the
    summary's lines."""
    from receivewal.check import asof  # noqa: PLC0415 - pyspark lazily

    point = asof.parse_as_of(as_of)
    out = asof.resolved_output(tables_out)
    result = in_session(remote, master, lambda spark: asof.run_as_of(
        spark, root, out, point, identity=identity, without_snapshot=without_snapshot))
    return asof.summary_lines(result)
