"""The pure pieces of a base backup's receipt: the BASE_BACKUP command, the COPY stream's
messages, the tar reader, the manifest, and the receipt that checks files against it."""

from __future__ import annotations

import hashlib
import struct
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.backups import (
    make_manifest,
    make_tar,
    new_archive,
    progress,
    stream_of,
    ustar_header,
)

from receivewal.archive.compression import parse_compress_option
from receivewal.backup.backupstream import (
    BackupData,
    BackupStream,
    BackupStreamError,
    ManifestStart,
    NewArchive,
    Progress,
    parse_backup_message,
)
from receivewal.backup.command import (
    BackupRequest,
    Position,
    Tablespace,
    base_backup_command,
    parse_position,
    parse_tablespaces,
)
from receivewal.backup.manifest import (
    BackupMismatch,
    ManifestError,
    manifest_checksum,
    parse_manifest,
)
from receivewal.backup.receipt import ArchiveInfo, Receipt
from receivewal.backup.tar import (
    MemberData,
    MemberKind,
    MemberStart,
    TarError,
    TarMember,
    TarReader,
)
from receivewal.errors import ConfigurationError, ProtocolError, ReceivewalError
from receivewal.replication.link import Row

SETTINGS = settings(max_examples=150, deadline=None)


# -- the command -------------------------------------------------------------------------------
def test_the_command_uses_postgresql_15s_option_list() -> None:
    """Label quoted (a quote doubled, a backslash as it is), fast checkpoint, no WAL, a manifest
    with SHA-256 checksums, the client as target, the tablespace map, the rate, and server
    compression with its level."""
    request = BackupRequest(label="it's a\\test", fast=True, max_rate=1024,
                            server_compression=parse_compress_option("zstd:level=5"))
    assert base_backup_command(request) == (
        "BASE_BACKUP ( LABEL 'it''s a\\test', CHECKPOINT 'fast', WAL false, WAIT false, "
        "MANIFEST 'yes', MANIFEST_CHECKSUMS 'SHA256', TARGET 'client', TABLESPACE_MAP true, "
        "MAX_RATE 1024, COMPRESSION 'zstd', COMPRESSION_DETAIL 'level=5' )")
    plain = base_backup_command(BackupRequest(label="x", tablespace_map=False))
    assert "CHECKPOINT 'spread'" in plain
    assert "TABLESPACE_MAP" not in plain
    assert "COMPRESSION" not in plain
    assert "MAX_RATE" not in plain


@pytest.mark.parametrize(("request_", "complaint"), [
    (BackupRequest(label=""), "label"),
    (BackupRequest(label="a\0b"), "zero byte"),
    (BackupRequest(max_rate=31), "out of range"),
    (BackupRequest(max_rate=1024 * 1024 + 1), "out of range"),
    (BackupRequest(checksum="CRC32C"), "checks"),
])
def test_the_command_refuses_what_the_server_would(request_: BackupRequest,
                                                    complaint: str) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        base_backup_command(request_)


def test_result_sets_are_read_and_checked() -> None:
    bad_positions: list[list[Row]] = [[], [("0/1", None)], [("zz", "1")], [("0/1", "0")]]
    bad_tablespaces: list[list[Row]] = [
        [("16385", "/ts", None)], [(None, None, None), (None, None, None)],
        [("x", "/ts", None), (None, None, None)], [("1", None, None)]]
    assert parse_position([("0/2000028", "1")], "start") == Position(0x2000028, 1)
    assert parse_tablespaces([("16385", "/ts", None), (None, None, None)]) == [
        Tablespace(16385, "/ts", None), Tablespace(None, None, None)]
    for rows in bad_positions:
        with pytest.raises(ProtocolError):
            parse_position(rows, "start")
    for rows in bad_tablespaces:
        with pytest.raises(ProtocolError):
            parse_tablespaces(rows)


# -- the COPY stream ---------------------------------------------------------------------------
def test_each_message_of_the_copy_stream_is_read() -> None:
    assert parse_backup_message(new_archive("16385.tar.zst", "/srv/ts")) == \
        NewArchive("16385.tar.zst", "/srv/ts")
    assert parse_backup_message(new_archive("base.tar")) == NewArchive("base.tar", "")
    data = parse_backup_message(b"dabc")
    assert isinstance(data, BackupData)
    assert bytes(data.data) == b"abc"
    assert parse_backup_message(progress(12345)) == Progress(12345)
    assert parse_backup_message(b"m") == ManifestStart()


@pytest.mark.parametrize(("payload", "complaint"), [
    (b"", "empty"), (b"x", "type 0x78"), (b"nbase.tar\0", "2 zero-terminated"),
    (b"nbase.tar\0\0\0", "2 zero-terminated"), (new_archive("../x.tar"), "named"),
    (new_archive("base.tar.bz2"), "named"), (b"p\0\0", "8"),
    (b"p" + struct.pack(">q", -1), "negative"), (b"mx", "unexpected bytes"),
])
def test_bad_messages_are_named(payload: bytes, complaint: str) -> None:
    with pytest.raises(BackupStreamError, match=complaint):
        parse_backup_message(payload)


@pytest.mark.parametrize(("messages", "complaint"), [
    ([b"dxx"], "data before any archive"),
    ([new_archive("base.tar"), b"m", new_archive("16385.tar", "/t")], "after the manifest"),
    ([new_archive("base.tar"), new_archive("base.tar.gz")], "twice"),
    ([new_archive("base.tar"), b"m", b"m"], "manifest announced twice"),
])
def test_the_order_of_messages_is_checked(messages: list[bytes], complaint: str) -> None:
    stream = BackupStream()
    for message in messages[:-1]:
        stream.read(message)
    with pytest.raises(BackupStreamError, match=complaint):
        stream.read(messages[-1])


def test_a_stream_without_base_archive_or_manifest_is_incomplete() -> None:
    stream = BackupStream()
    stream.read(new_archive("16385.tar", "/t"))
    with pytest.raises(BackupStreamError, match="without the base archive"):
        stream.finish(manifest=True)
    stream.read(new_archive("base.tar"))
    with pytest.raises(BackupStreamError, match="without the manifest"):
        stream.finish(manifest=True)
    stream.read(b"m")
    stream.finish(manifest=True)


@SETTINGS
@given(st.lists(st.binary(max_size=40), max_size=8))
def test_garbage_in_the_copy_stream_raises_only_the_protocol_error(payloads: list[bytes]) -> None:
    stream = BackupStream()
    try:
        for payload in payloads:
            stream.read(payload)
        stream.finish(manifest=True)
    except BackupStreamError as exc:
        message = str(exc)
    else:
        message = "stream"
    assert any(word in message for word in ("stream", "message", "archive", "manifest"))


# -- the tar reader ----------------------------------------------------------------------------
def read_tar(data: bytes, piece: int = 512) -> list[tuple[TarMember, bytes]]:
    """The members of ``data`` and their content, fed ``piece`` bytes at a time."""
    reader = TarReader("test.tar")
    found: list[tuple[TarMember, bytes]] = []
    content = bytearray()
    current: TarMember | None = None
    for at in range(0, max(len(data), 1), piece):
        for event in reader.feed(data[at:at + piece]):
            if isinstance(event, MemberStart):
                current, content = event.member, bytearray()
            elif isinstance(event, MemberData):
                content += event.data
            else:
                assert event.member == current
                found.append((event.member, bytes(content)))
    reader.close()
    return found


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("piece", [1, 100, 512, 7919, 1 << 20])
def test_members_come_out_as_tarfile_wrote_them(fmt: int, piece: int) -> None:
    """Names, kinds, sizes, modes, times and data, whatever the pieces the archive arrives
    in; pax and GNU long names (over 100 bytes) too."""
    long_name = "base/" + "d" * 120 + "/file"
    files = [("PG_VERSION", b"15\n"), ("global/pg_control", bytes(range(256)) * 32),
             ("empty", b""), ("base/1/1259", b"x" * 513)]
    if fmt != tarfile.USTAR_FORMAT:
        files.append((long_name, b"long"))
    data = make_tar(files, dirs=["global", "base", "base/1"], fmt=fmt)
    found = read_tar(data, piece)
    assert [(m.name, m.kind, m.size) for m, _ in found] == \
        [("global", MemberKind.DIRECTORY, 0), ("base", MemberKind.DIRECTORY, 0),
         ("base/1", MemberKind.DIRECTORY, 0)] + \
        [(name, MemberKind.FILE, len(body)) for name, body in files]
    assert [body for m, body in found if m.kind is MemberKind.FILE] == [b for _, b in files]
    assert all(m.mtime == 1_700_000_000 for m, _ in found)
    assert {m.mode for m, _ in found} == {0o700, 0o600}


def test_postgresqls_forms_are_read() -> None:
    """A directory and a link with PostgreSQL's trailing slash, a size in base-256, the
    ustar prefix field, and zeros after the end blocks."""
    size256 = b"\x80" + (5).to_bytes(11, "big")
    data = (ustar_header("pg_tblspc/", 0, typeflag=b"5")
            + ustar_header("pg_tblspc/16385/", 0, typeflag=b"2", linkname="/srv/ts")
            + ustar_header("f", 0, size_field=size256) + b"hello".ljust(512, b"\0")
            + ustar_header("1259", 2, prefix="./base/1") + b"ab".ljust(512, b"\0")
            + bytes(1024) + bytes(10240))
    found = read_tar(data, 300)
    assert [(m.name, m.kind, m.linkname, body) for m, body in found] == [
        ("pg_tblspc", MemberKind.DIRECTORY, "", b""),
        ("pg_tblspc/16385", MemberKind.SYMLINK, "/srv/ts", b""),
        ("f", MemberKind.FILE, "", b"hello"),
        ("base/1/1259", MemberKind.FILE, "", b"ab")]


@pytest.mark.parametrize(("data", "complaint"), [
    (ustar_header("a", 3) + b"abc".ljust(512, b"\0"), "without its end-of-archive"),
    (ustar_header("a", 3) + b"ab", "inside a member"),
    (ustar_header("a", 0) + bytes(512), "one of its two"),
    (ustar_header("a", 0) + bytes(512) + b"\1" + bytes(511), "not followed by another"),
    (ustar_header("a", 0) + bytes(1024) + b"x", "after the end-of-archive"),
    (ustar_header("/etc/passwd", 0) + bytes(1024), "absolute"),
    (ustar_header("base/../../x", 0) + bytes(1024), "unsafe"),
    (ustar_header("dev", 0, typeflag=b"3") + bytes(1024), "unsupported member type"),
    (ustar_header("d", 5, typeflag=b"5") + bytes(1536), "directory 'd' with 5 bytes"),
    (ustar_header("l", 0, typeflag=b"2") + bytes(1024), "without a target"),
    (ustar_header("a", 0, size_field=b"12x4567\0\0\0\0\0") + bytes(1024), "not octal"),
    (ustar_header("a", 0, size_field=b"\xff" * 12) + bytes(1024), "base-256"),
    (b"x" * 512 + bytes(1024), "checksum"),
])
def test_damage_is_a_tar_error_naming_the_archive_and_offset(data: bytes,
                                                             complaint: str) -> None:
    with pytest.raises(TarError, match=rf"test\.tar: .*{complaint}.*\(at byte \d+\)"):
        read_tar(data)


def test_a_flipped_byte_in_a_header_fails_its_checksum() -> None:
    data = bytearray(make_tar([("a", b"abc")]))
    data[10] ^= 0x01
    with pytest.raises(TarError, match="header checksum mismatch"):
        read_tar(bytes(data))


@SETTINGS
@given(st.lists(st.tuples(st.text(st.characters(codec="utf-8", exclude_characters="/\0."),
                                  min_size=1, max_size=150),
                          st.binary(max_size=1500)), max_size=5, unique_by=lambda f: f[0]),
       st.integers(1, 2000), st.sampled_from([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]))
def test_any_archive_round_trips_in_any_pieces(files: list[tuple[str, bytes]], piece: int,
                                               fmt: int) -> None:
    found = read_tar(make_tar(files, fmt=fmt), piece)
    assert [(m.name, body) for m, body in found] == files


@SETTINGS
@given(st.binary(max_size=3000), st.integers(1, 700))
def test_garbage_raises_only_tar_errors(data: bytes, piece: int) -> None:
    """Random bytes: a TarError naming the archive and the offset, or (all zeros, or empty
    members) an archive read."""
    try:
        read_tar(data, piece)
    except TarError as exc:
        message = str(exc)
    else:
        message = "test.tar: read (at byte 0)"
    assert message.startswith("test.tar: ")
    assert "(at byte " in message


@SETTINGS
@given(st.data())
def test_a_damaged_archive_raises_only_tar_errors(data: st.DataObject) -> None:
    archive = bytearray(make_tar([("a", b"x" * 700), ("b/c", b"y")], dirs=["b"],
                                 fmt=tarfile.PAX_FORMAT))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(archive) - 1))
        archive[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(archive)))
    try:
        read_tar(bytes(archive[:cut]), data.draw(st.integers(1, 600)))
    except TarError as exc:
        message = str(exc)
    else:
        message = "test.tar: read"
    assert message.startswith("test.tar: ")


# -- the manifest ------------------------------------------------------------------------------
FILES = [("backup_label", b"START WAL LOCATION: 0/2000028\n"), ("PG_VERSION", b"15\n"),
         ("global/pg_control", bytes(8192))]


def test_a_manifest_is_read_and_its_own_checksum_checked() -> None:
    data = make_manifest(FILES)
    manifest = parse_manifest(data)
    assert manifest.version == 1
    assert manifest.files["PG_VERSION"].size == 3
    assert manifest.files["PG_VERSION"].checksum == hashlib.sha256(b"15\n").hexdigest()
    assert manifest.wal_ranges[0].start == 0x2000028
    assert manifest.checksum == manifest_checksum(data)


def test_a_manifest_altered_after_its_checksum_is_refused() -> None:
    data = make_manifest(FILES).replace(b'"Size": 3', b'"Size": 4')
    with pytest.raises(ManifestError, match="manifest checksum mismatch"):
        parse_manifest(data)


@pytest.mark.parametrize(("data", "complaint"), [
    (b"{}", "newline-terminated"), (b"{}\n", "at least 2 lines"),
    (b"[\n1]\n", "expected an object"), (b"{\n}\n", "missing field"),
    (b"{\nnot json\n", "not JSON"),
])
def test_a_malformed_manifest_is_refused(data: bytes, complaint: str) -> None:
    with pytest.raises(ManifestError, match=complaint):
        parse_manifest(data)


def test_an_encoded_path_is_decoded() -> None:
    body = make_manifest([("x", b"")]).replace(b'"Path": "x"', b'"Encoded-Path": "ff41"')
    text = body[:body.rfind(b'"Manifest-Checksum"')]
    data = text + f'"Manifest-Checksum": "{hashlib.sha256(text).hexdigest()}"}}\n'.encode()
    assert list(parse_manifest(data).files) == [b"\xffA".decode("utf-8", "surrogateescape")]


# -- the receipt -------------------------------------------------------------------------------
class Collected:
    """A BackupSink that keeps what it is given."""

    def __init__(self) -> None:
        self.archives: dict[str, bytearray] = {}
        self.current = ""
        self.ended: list[str] = []

    def begin_archive(self, archive: ArchiveInfo) -> None:
        self.current = archive.name
        self.archives[archive.name] = bytearray()

    def archive_bytes(self, data: memoryview) -> None:
        self.archives[self.current] += data

    def end_archive(self) -> None:
        self.ended.append(self.current)


TABLESPACES = [Tablespace(16385, "/srv/ts", None), Tablespace(None, None, None)]
TS_FILES = [("PG_15_202209061/5/16386", b"z" * 9000)]
START, END = Position(0x2000028, 1), Position(0x2000100, 1)


def receive(messages: list[bytes], sink: Collected | None = None) -> object:
    receipt = Receipt(TABLESPACES, sink or Collected(), algorithm="SHA256")
    for message in messages:
        receipt.receive(message)
    return receipt.finish(START, END)


def good_stream(base_files: list[tuple[str, bytes]] = FILES) -> list[bytes]:
    manifest = make_manifest([*base_files, *((f"pg_tblspc/16385/{n}", b) for n, b in TS_FILES)])
    return stream_of([("16385.tar", "/srv/ts", make_tar(TS_FILES, dirs=["PG_15_202209061"])),
                      ("base.tar", "", make_tar(base_files, dirs=["global"]))], manifest)


def test_a_stream_that_matches_its_manifest_is_received() -> None:
    sink = Collected()
    received = receive(good_stream(), sink)
    assert sink.ended == ["16385.tar", "base.tar"]
    assert bytes(sink.archives["base.tar"]) == make_tar(FILES, dirs=["global"])
    assert [(s.info.tablespace_oid, s.files) for s in received.archives] == [  # type: ignore[attr-defined]
        (16385, 1), (None, 3)]


def test_a_file_changed_in_transit_is_named() -> None:
    altered = [*FILES[:2], ("global/pg_control", b"\1" + bytes(8191))]
    manifest = make_manifest(FILES)
    stream = stream_of([("16385.tar", "/srv/ts", make_tar(TS_FILES)),
                        ("base.tar", "", make_tar(altered))], manifest)
    with pytest.raises(BackupMismatch, match=r'"global/pg_control" has SHA256 checksum'):
        receive(stream)


@pytest.mark.parametrize(("files", "complaint"), [
    (FILES[:2], r'"global/pg_control" is in the manifest but not in the backup'),
    ([*FILES, ("extra", b"")], r'"extra" is in the backup but not in the manifest'),
    ([*FILES, ("PG_VERSION", b"15\n")], r'"PG_VERSION" appears twice'),
    ([FILES[0], ("PG_VERSION", b"15\n\n"), FILES[2]], r'"PG_VERSION" has size 4 on receipt'),
])
def test_files_missing_extra_repeated_or_resized_are_named(files: list[tuple[str, bytes]],
                                                           complaint: str) -> None:
    manifest = make_manifest([*FILES, *((f"pg_tblspc/16385/{n}", b) for n, b in TS_FILES)])
    stream = stream_of([("16385.tar", "/srv/ts", make_tar(TS_FILES)),
                        ("base.tar", "", make_tar(files))], manifest)
    with pytest.raises(BackupMismatch, match=complaint):
        receive(stream)


def test_a_tablespace_archive_of_an_unlisted_location_is_refused() -> None:
    stream = good_stream()
    stream[0] = new_archive("16385.tar", "/elsewhere")
    with pytest.raises(BackupStreamError, match="did not list"):
        receive(stream)


def test_a_server_compressed_archive_is_checked_inside_and_kept_as_sent() -> None:
    zstd = parse_compress_option("zstd")
    from receivewal.archive.compression import new_compressor  # noqa: PLC0415

    def compressed(data: bytes) -> bytes:
        c = new_compressor(zstd)
        return c.begin() + c.compress(data) + c.finish()

    base = compressed(make_tar(FILES))
    ts = compressed(make_tar(TS_FILES))
    manifest = make_manifest([*FILES, *((f"pg_tblspc/16385/{n}", b) for n, b in TS_FILES)])
    sink = Collected()
    receive(stream_of([("16385.tar.zst", "/srv/ts", ts), ("base.tar.zst", "", base)],
                      manifest), sink)
    assert bytes(sink.archives["base.tar.zst"]) == base
    truncated = stream_of([("16385.tar.zst", "/srv/ts", ts),
                           ("base.tar.zst", "", base[:-20])], manifest)
    with pytest.raises(ReceivewalError, match=r"base\.tar\.zst"):
        receive(truncated)


def test_the_manifests_wal_range_must_be_the_backups() -> None:
    manifest = make_manifest([*FILES, *((f"pg_tblspc/16385/{n}", b) for n, b in TS_FILES)],
                             end=0x3000000)
    stream = stream_of([("16385.tar", "/srv/ts", make_tar(TS_FILES)),
                        ("base.tar", "", make_tar(FILES))], manifest)
    with pytest.raises(ManifestError, match="WAL ranges"):
        receive(stream)


def test_progress_is_reported() -> None:
    seen: list[int] = []
    receipt = Receipt(TABLESPACES, Collected(), algorithm="SHA256", on_progress=seen.append)
    for message in good_stream():
        receipt.receive(message)
    assert seen
    assert seen == sorted(seen)


@SETTINGS
@given(st.data())
def test_a_damaged_stream_raises_only_the_projects_errors(data: st.DataObject) -> None:
    messages = good_stream()
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(messages) - 1))
        body = bytearray(messages[index])
        if body:
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
        messages[index] = bytes(body)
    messages = messages[:data.draw(st.integers(0, len(messages)))]
    try:
        receive(messages)
    except ReceivewalError as exc:
        message = str(exc)
    else:
        message = "received"
    assert message

