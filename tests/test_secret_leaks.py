"""No command ever prints a secret it was given: an age private key put where a path or a key
goes (``--identity 'AGE-SECRET-KEY-1...'`` instead of the key's file), a password in a
connection string (``postgresql://u:PW@host/db``, ``password=PW``) or in a bucket URL
(``s3://KEY:SECRET@bucket/p``), on the command line or in its ``RECEIVEWAL_*`` variable.

Every command of ``receivewal --help`` and the drop-in ``pg_receivewal`` is run on an error
path that needs no server: each run must exit != 0 with its one line, no traceback, and
neither stdout nor stderr may hold the secret (issue 31 item 6, issue 32 item 9). A restore
call's stderr lands in the PostgreSQL server's log on every call.

What needs a server to reach its error is left out of the table rather than started here: a
connection string that reaches a server and fails later (authentication, a missing slot), a
bucket URL that reaches a store, analyze's inputs (its error comes from the Spark session).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyrage import x25519
from support.dropin import DROPIN

KEY = str(x25519.Identity.generate())  # AGE-SECRET-KEY-1..., upper case as age-keygen writes
PLUGIN = "AGE-PLUGIN-YUBIKEY-1QQSECRETPLUGINIDENTITYQQQQQQQQQQQQQQQQQQQQQQQQQ"
PASSWORD = "SECRETPW7f3a9c"  # noqa: S105 - the planted secret the output is searched for
PG_URI = f"postgresql://u:{PASSWORD}@127.0.0.1:1/db"  # port 1: refused at once, no server
PG_KEYWORDS = f"host=127.0.0.1 port=1 user=u password={PASSWORD} dbname=db"
S3_URL = f"s3://AKIAEXAMPLE:{PASSWORD}@bucket/p"
SECRETS = (KEY, KEY.lower(), PLUGIN, PASSWORD, KEY[len("AGE-SECRET-KEY-1"):])
SEGMENT = "000000010000000000000001"

# (id, argv after the program, extra environment); "{A}" is an existing empty archive
# directory, "{S}" one holding a sealed segment (so that a key is loaded to read it), "{D}" a
# directory that exists, all under the test's own temporary directory.
CASES: list[tuple[str, list[str], dict[str, str]]] = [
    # stream: the connection string, the archive's paths, the bucket, the recipients
    ("stream-dbname-uri", ["stream", "-D", "{D}/s", "-d", PG_URI, "-n"], {}),
    ("stream-dbname-keywords", ["stream", "-D", "{D}/s", "-d", PG_KEYWORDS, "-n"], {}),
    ("stream-dbname-env", ["stream", "-D", "{D}/s", "-n"], {"RECEIVEWAL_DBNAME": PG_URI}),
    ("stream-directory-key", ["stream", "-D", KEY, "-d", PG_URI, "-n"], {}),
    ("stream-directory-env", ["stream", "-d", PG_URI, "-n"], {"RECEIVEWAL_DIRECTORY": KEY}),
    ("stream-host-key", ["stream", "-D", "{D}/s", "-h", f"/nowhere/{KEY}", "-n"], {}),
    ("stream-upload-to", ["stream", "-D", "{D}/s", "--upload-to", S3_URL, "-d", PG_URI,
                          "-n"], {}),
    ("stream-encrypt-to-key", ["stream", "-D", "{D}/s", "--encrypt-to", KEY, "-d", PG_URI,
                               "-n"], {}),
    ("stream-encrypt-to-env", ["stream", "-D", "{D}/s", "-d", PG_URI, "-n"],
     {"RECEIVEWAL_ENCRYPT_TO": KEY}),
    # logical
    ("logical-dbname", ["logical", "-D", "{D}/l", "-S", "s", "-P", "p", "-d", PG_URI, "-n"],
     {}),
    ("logical-dbname-env", ["logical", "-D", "{D}/l", "-S", "s", "-P", "p", "-n"],
     {"RECEIVEWAL_DBNAME": PG_KEYWORDS}),
    ("logical-directory-key", ["logical", "-D", KEY, "-S", "s", "-P", "p", "-d", PG_URI,
                               "-n"], {}),
    ("logical-encrypt-to", ["logical", "-D", "{D}/l", "-S", "s", "-P", "p", "--encrypt-to",
                            KEY, "-d", PG_URI, "-n"], {}),
    # restore (PostgreSQL's restore_command: its stderr is the server's log)
    ("restore-identity-key", ["restore", "-D", "{S}", "--identity", KEY, SEGMENT,
                              "{D}/p"], {}),
    ("restore-identity-lower", ["restore", "-D", "{S}", "--identity", KEY.lower(), SEGMENT,
                                "{D}/p"], {}),
    ("restore-identity-plugin", ["restore", "-D", "{S}", "--identity", PLUGIN, SEGMENT,
                                 "{D}/p"], {}),
    ("restore-identity-env", ["restore", "-D", "{S}", SEGMENT, "{D}/p"],
     {"RECEIVEWAL_IDENTITY": KEY}),
    ("restore-directory-key", ["restore", "-D", KEY, SEGMENT, "{D}/p"], {}),
    ("restore-directory-env", ["restore", SEGMENT, "{D}/p"], {"RECEIVEWAL_DIRECTORY": KEY}),
    ("restore-bucket", ["restore", "-D", S3_URL, SEGMENT, "{D}/p"], {}),
    ("restore-bucket-env", ["restore", SEGMENT, "{D}/p"], {"RECEIVEWAL_DIRECTORY": S3_URL}),
    ("restore-target-key", ["restore", "-D", "{A}", "--partial", SEGMENT, f"{{D}}/x/{KEY}"],
     {}),
    # verify (its lean reader and, with --json, the same)
    ("verify-identity-key", ["verify", "--identity", KEY, "{S}"], {}),
    ("verify-identity-env", ["verify", "{S}"], {"RECEIVEWAL_IDENTITY": KEY}),
    ("verify-identity-json", ["verify", "--json", "--identity", KEY.lower(), "{S}"], {}),
    ("verify-archive-key", ["verify", KEY], {}),
    ("verify-bucket", ["verify", S3_URL], {}),
    # analyze: refused before any Spark session starts
    ("analyze-identity-key", ["analyze", "--identity", KEY, "{S}"], {}),
    ("analyze-identity-env", ["analyze", "{A}"], {"RECEIVEWAL_IDENTITY": PLUGIN}),
    # backup
    ("backup-dbname", ["backup", "-D", "{A}", "-d", PG_URI, "-w"], {}),
    ("backup-dbname-keywords", ["backup", "-D", "{A}", "-d", PG_KEYWORDS, "-w"], {}),
    ("backup-dbname-env", ["backup", "-D", "{A}", "-w"], {"RECEIVEWAL_DBNAME": PG_URI}),
    ("backup-directory-key", ["backup", "-D", KEY, "-d", PG_URI, "-w"], {}),
    ("backup-directory-env", ["backup", "-d", PG_URI, "-w"], {"RECEIVEWAL_DIRECTORY": KEY}),
    ("backup-bucket", ["backup", "-D", S3_URL, "-d", PG_URI, "-w"], {}),
    ("backup-encrypt-to", ["backup", "-D", "{A}", "--encrypt-to", KEY, "-d", PG_URI, "-w"],
     {}),
    ("backup-encrypt-to-env", ["backup", "-D", "{A}", "-d", PG_URI, "-w"],
     {"RECEIVEWAL_ENCRYPT_TO": KEY}),
    # recover
    ("recover-identity-key", ["recover", "-D", "{S}", "--to", "{D}/r", "--identity", KEY],
     {}),
    ("recover-identity-env", ["recover", "-D", "{S}", "--to", "{D}/r"],
     {"RECEIVEWAL_IDENTITY": KEY}),
    ("recover-directory-key", ["recover", "-D", KEY, "--to", "{D}/r"], {}),
    ("recover-directory-env", ["recover", "--to", "{D}/r"], {"RECEIVEWAL_DIRECTORY": KEY}),
    ("recover-bucket", ["recover", "-D", S3_URL, "--to", "{D}/r"], {}),
    ("recover-to-key", ["recover", "-D", "{A}", "--to", KEY], {}),
    ("recover-tablespace-key", ["recover", "-D", "{A}", "--to", "{D}/r", "-T",
                                f"/old={{D}}/{KEY}"], {}),
    # cleanup
    ("cleanup-directory-key", ["cleanup", "-D", KEY, "--keep-backups", "1"], {}),
    ("cleanup-directory-env", ["cleanup", "--keep-backups", "1"],
     {"RECEIVEWAL_DIRECTORY": KEY}),
    ("cleanup-bucket", ["cleanup", "-D", S3_URL, "--keep-backups", "1"], {}),
    ("cleanup-archivecleanup-key", ["cleanup", KEY, SEGMENT], {}),
    # status
    ("status-directory-key", ["status", "-D", KEY], {}),
    ("status-directory-json", ["status", "--json", "-D", KEY], {}),
    ("status-directory-env", ["status"], {"RECEIVEWAL_DIRECTORY": KEY}),
    ("status-bucket", ["status", "-D", S3_URL], {}),
    # relay: its certificate and key files
    ("relay-tls-key", ["relay", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
                       "--tls-cert", "{D}/c.pem", "--tls-key", KEY], {}),
    ("relay-tls-cert", ["relay", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
                        "--tls-cert", KEY, "--tls-key", "{D}/k.pem"], {}),
    ("relay-tls-ca", ["relay", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
                      "--tls-ca", KEY], {}),
    ("relay-sslrootcert", ["relay", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1",
                           "--upstream-sslmode", "verify-full", "--upstream-sslrootcert",
                           KEY], {}),
    # the drop-in, as pg_receivewal
    ("pg_receivewal-dbname", ["-D", "{D}/s", "-d", PG_URI, "-n"], {}),
    ("pg_receivewal-keywords", ["-D", "{D}/s", "-d", PG_KEYWORDS, "-n"], {}),
    ("pg_receivewal-directory-key", ["-D", KEY, "-d", PG_URI, "-n"], {}),
]


def _placed(arg: str, places: dict[str, str]) -> str:
    for mark, place in places.items():
        arg = arg.replace(mark, place)
    return arg


def _argv(args: list[str], case: str) -> list[str]:
    if case.startswith("pg_receivewal"):
        return [str(DROPIN), *args]
    return [sys.executable, "-m", "receivewal", *args]


@pytest.mark.parametrize(("case", "args", "env"), CASES, ids=[case[0] for case in CASES])
def test_no_secret_in_any_output(tmp_path: Path, case: str, args: list[str],
                                 env: dict[str, str]) -> None:
    """The command fails with its one line, no traceback, and never shows the secret."""
    archive, sealed, scratch = tmp_path / "archive", tmp_path / "sealed", tmp_path / "scratch"
    for directory in (archive, sealed, scratch):
        directory.mkdir()
    (sealed / f"{SEGMENT}.age").write_bytes(b"age-encryption.org/v1\n")
    places = {"{A}": str(archive), "{S}": str(sealed), "{D}": str(scratch)}
    argv = [_placed(arg, places) for arg in args]
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("RECEIVEWAL_", "PG", "AWS_"))}
    environment.update(env, PGCONNECT_TIMEOUT="5")
    result = subprocess.run(_argv(argv, case), capture_output=True, text=True,
                            env=environment, cwd=tmp_path, timeout=120, check=False)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output, output
    for secret in SECRETS:
        assert secret not in output, f"the secret {secret[:20]}... shown:\n{output}"
    assert output.strip(), "an error says why"
