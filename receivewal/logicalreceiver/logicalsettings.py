"""What the logical command was asked to do: the daemon's shared settings and the slot's.

:class:`LogicalSettings` holds a :class:`~receivewal.daemon.settings.Settings` (``base``: what
the supervisor, the COPY loop and the monitor read, as ``stream`` fills it) and what only a
logical receiver needs: the plugin and its options, the publications, how the change files
are kept. What a server of a given version is asked for is decided here too
(:meth:`LogicalSettings.pgoutput_options`: the highest protocol version it speaks unless one
was given, streaming where that version allows it).
"""

from __future__ import annotations

from dataclasses import dataclass

from receivewal.archive.compression import NO_COMPRESSION, CompressSpec
from receivewal.daemon.settings import Settings
from receivewal.errors import ConfigurationError
from receivewal.logical.consumer import PLUGINS, PluginSettings
from receivewal.logical.pglogical import startup_parameters
from receivewal.logical.pgoutput import PgoutputOptions, highest_proto_version
from receivewal.logical.store import DEFAULT_FILE_SIZE, StoreSettings

#: The connection's session settings: values in UTF-8, and text output equal to what
#: receivewal.logical.binary makes of binary values (docs/changelog.md).
SESSION_OPTIONS = ("-c client_encoding=UTF8 -c TimeZone=UTC -c DateStyle=ISO "
                   "-c extra_float_digits=1 -c bytea_output=hex")
ORIGINS = ("any", "none")


@dataclass(frozen=True)
class LogicalSettings:
    """Options of ``receivewal logical``: ``base`` the daemon's, the rest the slot's."""

    base: Settings
    publications: tuple[str, ...] = ()
    plugin: str = "pgoutput"
    proto_version: int | None = None  # None: the highest the server speaks
    streaming: str | None = None  # None: "on" where the protocol version allows it
    two_phase: bool = False
    binary: bool = False
    messages: bool = False
    origin: str | None = None  # "any" or "none"; None: the server's default
    file_size: int = DEFAULT_FILE_SIZE
    files_compression: CompressSpec = NO_COMPRESSION
    accept_gap: bool = False  # a slot confirmed past the log: go on, the gap recorded
    snapshot: bool = False  # --create-slot copies the published tables in the slot's snapshot

    def validate(self) -> LogicalSettings:
        """Raise ConfigurationError for what cannot run (the base's checks too)."""
        base = self.base
        base.validate()
        if base.slot is None:
            raise ConfigurationError("a logical receiver needs a slot (-S/--slot)")
        if self.plugin not in PLUGINS:
            raise ConfigurationError(f"unknown plugin {self.plugin!r}: "
                                     f"{' or '.join(PLUGINS)}")
        acting = base.create_slot or base.drop_slot
        if not self.publications and not acting:
            what = "publication" if self.plugin == "pgoutput" else "replication set"
            raise ConfigurationError(f"name at least one {what} (-P/--publication)")
        if self.origin not in (None, *ORIGINS):
            raise ConfigurationError(f"--origin must be any or none, not {self.origin!r}")
        if self.files_compression.method not in ("", "zstd"):
            raise ConfigurationError("change files can be compressed with zstd only (-Z zstd), "
                                     f"not {self.files_compression.method}")
        if self.file_size < 1 << 10:
            raise ConfigurationError(f"--file-size {self.file_size} is too small (1 kB at least)")
        if self.plugin == "pgoutput" and self.proto_version is not None:
            self._pgoutput(self.proto_version)  # refuses a combination no server takes
        if self.snapshot:
            self._check_snapshot()
        return self

    def _check_snapshot(self) -> None:
        """ConfigurationError for a --snapshot that cannot run."""
        base = self.base
        if not base.create_slot:
            raise ConfigurationError("--snapshot is taken when the slot is created: give "
                                     "--create-slot")
        if base.if_not_exists:
            raise ConfigurationError("--snapshot cannot go with --if-not-exists: an existing "
                                     "slot's snapshot is gone")
        if base.directory is None:
            raise ConfigurationError("--snapshot writes into the change log's directory: give "
                                     "-D/--directory")
        if self.plugin != "pgoutput":
            raise ConfigurationError("--snapshot copies the tables of pgoutput publications; "
                                     f"the {self.plugin} plugin is not supported")
        if not self.publications:
            raise ConfigurationError("--snapshot copies the tables of the publications: name "
                                     "them (-P/--publication)")

    def pgoutput_options(self, server_version: int) -> PgoutputOptions:
        """What to ask pgoutput on a server of ``server_version`` for; ConfigurationError when
        that server cannot give it."""
        version = self.proto_version or highest_proto_version(server_version)
        options = self._pgoutput(version)
        problem = options.server_problem(server_version)
        if problem:
            raise ConfigurationError(problem)
        return options

    def _pgoutput(self, version: int) -> PgoutputOptions:
        streaming = self.streaming or ("on" if version >= 2 else "off")
        return PgoutputOptions(version, streaming=streaming, two_phase=self.two_phase,
                               binary=self.binary, messages=self.messages, origin=self.origin)

    def plugin_settings(self, server_version: int) -> PluginSettings:
        """The decoder's settings for a connection to a server of ``server_version``."""
        if self.plugin == "pgoutput":
            return PluginSettings("pgoutput", self.pgoutput_options(server_version))
        return PluginSettings(self.plugin)

    def start_options(self, server_version: int) -> list[tuple[str, str]]:
        """The options of START_REPLICATION ... LOGICAL for a server of ``server_version``."""
        if self.plugin == "pgoutput":
            return self.pgoutput_options(server_version).start_options(list(self.publications))
        return startup_parameters(list(self.publications), binary=self.binary,
                                  forward_origins=self.origin != "none",
                                  server_version=server_version)

    def store_settings(self, mode: int) -> StoreSettings:
        """How the change files are written (files of ``mode``)."""
        header: list[tuple[str, object]] = [("plugin", self.plugin), ("slot", self.base.slot)]
        return StoreSettings(file_size=self.file_size,
                             compression=self.files_compression.method,
                             level=self.files_compression.level, header=tuple(header),
                             mode=mode, sync=self.base.sync, recipients=self.base.encrypt_to)
