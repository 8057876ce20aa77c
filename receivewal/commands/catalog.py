"""The options several commands share, each declared once: its spellings, destination, kind,
``RECEIVEWAL_*`` variable, metavar and help.

Each is a :class:`~receivewal.commands.plain.Option` row. A command takes a row as it is, or
with its own help, metavar, variable or destination (:meth:`~receivewal.commands.plain.Option.but`;
:meth:`~receivewal.commands.plain.Option.long_only` where the command's short spelling means
another thing, as ``cleanup``'s ``-d`` does); it never spells the option again. The click
commands build their click options from the rows
(:func:`~receivewal.commands.clickoptions.click_option`), ``stream``'s declarations
(:func:`~receivewal.commands.options.shared`) and the lean readers of ``restore`` and
``verify`` (:func:`~receivewal.commands.plain.read_options`) too. The help of a row is the
text of the command named beside it; the others state their own. tests/test_option_catalog.py
fails on a spelling declared twice in ``receivewal/commands/``.

No click and no ``typing`` here: restore's lean path reads it (see :mod:`receivewal.restore`).
"""

from __future__ import annotations

from receivewal.commands.plain import COUNT, FLAG, KEYFILE, PATH, TEXT, Option
from receivewal.secrets import IDENTITY_ENV

# -- where the archive is ----------------------------------------------------------------------

#: recover's.
DIRECTORY = Option(
    "directory", ("-D", "--directory"), PATH, env="RECEIVEWAL_DIRECTORY",
    metavar="DIR-OR-S3-URL",
    help="The archive: a directory or s3://BUCKET/PREFIX (env RECEIVEWAL_DIRECTORY).")

#: restore's.
IDENTITY = Option(
    "identity", ("--identity",), KEYFILE, env=IDENTITY_ENV, metavar="FILE",
    help="age identity file (age-keygen's) that decrypts the archive's encrypted files "
    "(.age); without it, an encrypted file exits 126 naming who can read it (env "
    f"{IDENTITY_ENV}).")

#: The variable ``--encrypt-to`` is also read from (whitespace between recipients).
ENCRYPT_TO_ENV = "RECEIVEWAL_ENCRYPT_TO"
#: stream's.
ENCRYPT_TO = Option(
    "encrypt_to", ("--encrypt-to",), TEXT, env=ENCRYPT_TO_ENV, metavar="RECIPIENT",
    help="Encrypt each segment when it is completed (and what is uploaded) to this age "
    "X25519 recipient (age1..., age-keygen's public key); repeatable: any of the "
    "recipients decrypts. The segment being received stays plain until then. Needs "
    "pip install 'receivewal[encrypt]'.")

#: stream's (how a value is read is each command's: their methods differ).
COMPRESS = Option(
    "compress", ("-Z", "--compress"), TEXT, env="RECEIVEWAL_COMPRESS", metavar="METHOD[:LEVEL]",
    help="At rest: how the segment files are stored on disk, METHOD[:LEVEL] with METHOD "
    "gzip (.gz), lz4 (.lz4), zstd (.zst) or none; a bare number is a gzip level, as in "
    "pg_receivewal. Not the network: that is --compression.")

#: backup's (pg_basebackup's -P; logical's -P is its --publication). stream takes it without
#: -P, with its own help.
PROGRESS = Option(
    "progress", ("-P", "--progress/--no-progress"), FLAG, env="RECEIVEWAL_PROGRESS",
    help="Show the bytes received of the server's estimate and the rate, as "
    "pg_basebackup -P (default: on a terminal; off one, a line every 10 s, or "
    "backup_progress events with --log-format json).")

#: stream's.
LOG_FORMAT = Option(
    "log_format", ("--log-format",), TEXT, env="RECEIVEWAL_LOG_FORMAT",
    help="auto: JSON unless stderr is a terminal.")

#: stream's.
NO_SYNC = Option(
    "no_sync", ("--no-sync",), FLAG, env="RECEIVEWAL_NO_SYNC",
    help="Do not fsync (testing only: a crash can lose or corrupt WAL).")

# -- the server (stream's, as pg_receivewal spells them) ---------------------------------------

DBNAME = Option("dbname", ("-d", "--dbname"), TEXT, env="RECEIVEWAL_DBNAME", metavar="CONNSTR",
                help="Connection string or URI.")
HOST = Option("host", ("-h", "--host"), TEXT, env="RECEIVEWAL_HOST",
              help="Database server host or socket dir.")
PORT = Option("port", ("-p", "--port"), TEXT, env="RECEIVEWAL_PORT",
              help="Database server port.")
USERNAME = Option("username", ("-U", "--username"), TEXT, env="RECEIVEWAL_USERNAME",
                  help="Connect as this user.")
NO_PASSWORD = Option("no_password", ("-w", "--no-password"), FLAG,
                     env="RECEIVEWAL_NO_PASSWORD", help="Never prompt for a password.")
PASSWORD = Option("force_password", ("-W", "--password"), FLAG,
                  help="Prompt for a password before connecting.")
SLOT = Option("slot", ("-S", "--slot"), TEXT, env="RECEIVEWAL_SLOT",
              help="Replication slot to use.")
#: pg_streampack on the wire.
COMPRESSION = Option(
    "compression", ("--compression",), TEXT, env="RECEIVEWAL_COMPRESSION",
    help="On the wire: the pg_streampack algorithms to ask the server for, in order of "
    "preference, or none. Not the files on disk: that is -Z/--compress.")

# -- what a command tells ----------------------------------------------------------------------

METRICS_ADDRESS = Option(
    "metrics_address", ("--metrics-address",), TEXT, env="RECEIVEWAL_METRICS_ADDRESS",
    metavar="HOST:PORT", help="Serve Prometheus metrics on HOST:PORT.")
VERBOSE = Option("verbose", ("-v", "--verbose"), COUNT,
                 help="More log output (debug events).")
#: verify's.
JSON = Option("as_json", ("--json",), FLAG, help="Print the report as JSON.")
