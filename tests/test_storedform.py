"""The stored form is the one place files at rest are compressed and sealed (issue 34 §2).

What a file is at rest (compressed by a method of the one table, then sealed to recipients) is
written and read through ``archive/storedform``; the modules under it are the table and its
codecs, the age files and keys, and the archive's sealed files. No other module imports a
compression library or pyrage, the codecs or the age streams, builds a compressor or a
decoder from the table, or compresses with zlib.
"""

from __future__ import annotations

import ast
from io import BytesIO
from pathlib import Path

import pytest

from receivewal.archive.compression import CompressSpec, decompress_chunks
from receivewal.archive.recipients import recipient_set
from receivewal.archive.storedform import PLAIN, StoredForm

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "receivewal"

#: The stored form and what it stacks.
FORM = frozenset({
    "receivewal/archive/storedform.py",  # the form: its writer and its reader
    "receivewal/archive/compression.py",  # the table of methods, -Z's grammar, decoding
    "receivewal/archive/codecs.py",  # the compression libraries and the compressors
    "receivewal/archive/inflate.py",  # the table's decoders, pushed to
    "receivewal/archive/encryption.py",  # the keys, and pyrage's door
    "receivewal/archive/agestream.py",  # age files through pyrage
    "receivewal/archive/sealed.py",  # the archive's sealed files: recipients files, checks
})
#: Compression on the wire, not at rest: pg_streampack's frames (its own codecs, by design).
WIRE = frozenset({"receivewal/replication/streampack.py"})

LIBRARIES = ("zstandard", "lz4", "backports.zstd", "compression.zstd", "pyrage", "gzip",
             "bz2", "lzma")
FILTERS = ("receivewal.archive.codecs", "receivewal.archive.agestream")
TABLE_INSIDES = frozenset({"new_compressor", "codec_of", "Decoder", "GzipDecoder", "Codec"})
ZLIB_CODING = frozenset({"compressobj", "decompressobj", "compress", "decompress"})


def _is(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


def _breaches(path: Path) -> list[str]:
    """What ``path`` does that only the stored form may."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [f"imports {alias.name}" for alias in node.names
                      if any(_is(alias.name, lib) for lib in LIBRARIES + FILTERS)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if any(_is(node.module, lib) for lib in LIBRARIES + FILTERS):
                found.append(f"imports from {node.module}")
            elif node.module == "receivewal.archive.compression":
                found += [f"takes compression.{alias.name}" for alias in node.names
                          if alias.name in TABLE_INSIDES]
        elif isinstance(node, ast.Attribute) and node.attr in ZLIB_CODING \
                and isinstance(node.value, ast.Name) and node.value.id == "zlib":
            found.append(f"calls zlib.{node.attr}")
    return found


def test_no_compression_or_sealing_outside_the_stored_form() -> None:
    """Only the stored form's modules compress, decode or seal: every other module goes
    through ``archive/storedform`` (or reads through compression's readers)."""
    breaches = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in FORM:
            continue
        found = _breaches(path)
        if relative in WIRE:
            found = [what for what in found if not what.startswith("imports")]
        if found:
            breaches[relative] = found
    assert breaches == {}


def test_the_rule_sees_what_it_forbids(tmp_path: Path) -> None:
    """The check catches each way around the form."""
    probe = tmp_path / "probe.py"
    probe.write_text("import zlib\n"
                     "import lz4.frame\n"
                     "from receivewal.archive.codecs import ZstdCompressor\n"
                     "from receivewal.archive.compression import new_compressor\n"
                     "def f():\n"
                     "    from pyrage import x25519\n"
                     "    return zlib.compressobj()\n")
    assert _breaches(probe) == ["imports lz4.frame", "imports from receivewal.archive.codecs",
                                "takes compression.new_compressor", "imports from pyrage",
                                "calls zlib.compressobj"]


@pytest.mark.parametrize("method", ["", "gzip", "lz4", "zstd"])
def test_a_form_names_and_writes_what_its_reader_reads(method: str) -> None:
    """The writer's layers and the reader's undo each other; the name carries the suffixes."""
    form = StoredForm(CompressSpec(method))
    data = bytes(range(256)) * 1024
    with form.writer() as writer:
        stored = b"".join((bytes(writer.begin()), bytes(writer.update(data)),
                           bytes(writer.flush()), writer.finish()))
    assert b"".join(decompress_chunks(BytesIO(stored), method)) == data
    assert b"".join(decompress_chunks(BytesIO(form.stored_bytes(data)), method)) == data
    suffix = {"": "", "gzip": ".gz", "lz4": ".lz4", "zstd": ".zst"}[method]
    assert form.name("000000010000000000000001") == "000000010000000000000001" + suffix
    sealed = StoredForm(CompressSpec(method), recipient_set(["age1" + "q" * 58]))
    assert sealed.name("F") == "F" + suffix + ".age"
    assert sealed.compression() == form
    assert sealed.sealing().name("F") == "F.age"
    assert PLAIN.stored_bytes(b"x") == b"x"
