"""What the stream command was asked to do: one frozen settings object."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.archive.keeplocal import KeepLocal
from receivewal.archive.recipients import RecipientSet
from receivewal.errors import CommandLineError, ConfigurationError

SLOT_NAME_RE = re.compile(r"^[a-z0-9_]{1,63}$")
CONFIRM_AFTER = ("disk", "upload")


@dataclass(frozen=True)
class Settings:
    """Options of ``receivewal stream``, with pg_receivewal's meanings where they overlap.

    The defaults here are the only statement of them: the ``stream`` command line and the
    pg_receivewal drop-in read them from this class.
    """

    directory: Path | None
    conninfo: str
    slot: str | None = None
    create_slot: bool = False
    drop_slot: bool = False
    if_not_exists: bool = False
    reserve_wal: bool = False
    create_slot_if_missing: bool = False
    status_interval: float = 10.0
    synchronous: bool = False
    sync: bool = True
    endpos: int | None = None
    no_loop: bool = False
    wait_for_server: bool = False  # retry the first connection too (as a service)
    compression: tuple[str, ...] = ("zstd", "lz4")
    at_rest: CompressSpec = NO_COMPRESSION  # -Z/--compress: how segment files are compressed
    hot_standby_feedback: bool = True
    reconnect_delay: float = 5.0
    reconnect_delay_max: float = 60.0
    receive_timeout: float = 60.0
    metrics_address: str | None = None
    progress: bool = False  # a progress line on stderr (only set when it is a console terminal)
    upload_to: str | None = None  # s3://BUCKET/PREFIX: completed files are uploaded there
    confirm_after: str = "disk"  # "upload": the flush reported never passes the uploads
    upload_wait: float = 300.0  # seconds an --endpos/--no-loop exit waits for the uploads
    encrypt_to: RecipientSet | None = None  # --encrypt-to: segments sealed when completed
    keep_local: KeepLocal | None = None  # --keep-local: the local copy's window (None: all)

    @property
    def report_flush(self) -> bool:
        """pg_receivewal reports a flush position only with a slot or --synchronous."""
        return self.slot is not None or self.synchronous

    def validate(self) -> Settings:
        """Raise ConfigurationError for what cannot run: combinations pg_receivewal refuses,
        in its words (CommandLineError), and a few more. The one validation of ``receivewal
        stream`` and the pg_receivewal drop-in."""
        self._check_slot_action()
        if self.slot is not None and not SLOT_NAME_RE.match(self.slot):
            raise ConfigurationError(
                f'replication slot name "{self.slot}" is invalid: use at most 63 lower case '
                "letters, numbers and underscores"
            )
        self._check_pairs()
        if self.status_interval < 0:
            raise ConfigurationError(f"invalid status interval: {self.status_interval}")
        if self.receive_timeout < 0:
            raise ConfigurationError(f"invalid receive timeout: {self.receive_timeout}")
        if self.reconnect_delay < 0 or self.reconnect_delay_max < self.reconnect_delay:
            raise ConfigurationError("invalid reconnect delay")
        self._validate_uploads()
        return self

    def check_combination(self) -> None:
        """Raise CommandLineError for options that do not go together, or one that is
        missing: :meth:`validate`'s checks that pg_receivewal makes too, in its order (the
        drop-in makes them before it parses a value, as pg_receivewal does)."""
        self._check_slot_action()
        self._check_pairs()

    def _check_slot_action(self) -> None:
        if self.create_slot and self.drop_slot:
            raise CommandLineError("cannot use --create-slot together with --drop-slot")
        if (self.create_slot or self.drop_slot or self.create_slot_if_missing) and not self.slot:
            what = "--create-slot" if self.create_slot else \
                "--drop-slot" if self.drop_slot else "--create-slot-if-missing"
            raise CommandLineError(f"{what} needs a slot to be specified using --slot")

    def _check_pairs(self) -> None:
        if self.reserve_wal and not (self.create_slot or self.create_slot_if_missing):
            raise CommandLineError("--reserve-wal goes with --create-slot")
        if self.synchronous and not self.sync:
            raise CommandLineError("cannot use --synchronous together with --no-sync")
        if self.directory is None and not (self.create_slot or self.drop_slot):
            raise CommandLineError("no target directory specified", "-D/--directory")

    def _validate_uploads(self) -> None:
        """The options of --upload-to."""
        if self.upload_to is not None:
            from receivewal.archive.objectstore import parse_bucket_url  # noqa: PLC0415 - the
            # object store's modules only with --upload-to

            parse_bucket_url(self.upload_to)
        if self.confirm_after not in CONFIRM_AFTER:
            raise ConfigurationError(f'invalid --confirm-after "{self.confirm_after}": '
                                     "disk or upload")
        if self.confirm_after == "upload" and self.upload_to is None:
            raise ConfigurationError("--confirm-after upload needs --upload-to")
        if self.upload_wait < 0:
            raise ConfigurationError(f"invalid --upload-wait: {self.upload_wait}")
        if self.keep_local is not None and self.upload_to is None:
            raise ConfigurationError(
                f"--keep-local {self.keep_local.text} needs --upload-to: without it the "
                "directory is the archive (its retention is cleanup's)")
