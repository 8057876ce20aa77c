"""The archive: received WAL as segment files on disk, compression at rest, and the archive's
files in a bucket.

How receivewal writes a file, everywhere in the package: only :mod:`~receivewal.archive.durable`
makes temporary files, fsyncs and renames, and a file gets its final name only from
:func:`~receivewal.archive.durable.finish_file` (fsync, rename, fsync of the directory, as
walmethods.c's close does it), so a file under its final name is whole. Before that, a file
written at once (the identity, lock, upload and state records, a restored ``%p``, the prefetch
spool's files) is a temporary file durable created (``O_CREAT|O_EXCL``, never through a link);
a file received over time (a segment, a change log) is written under its ``.partial`` name by
its one writer. Nothing else is written but scratch files and analyze's report.

What a file is at rest (compressed, then sealed) is :mod:`~receivewal.archive.storedform`'s:
the one writer and the one reader of the stored form, over the table of compression methods
and the age files.
"""
