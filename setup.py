"""The optional C extensions: the segment scanner (receivewal/wal/_scan.c), the COPY
stream's receive loop (receivewal/replication/_recv.c) and the reader of a plain logical row
(receivewal/logical/_rows.c).

Everything else is in pyproject.toml. ``optional=True``: without a compiler the build warns
and the package installs with the pure-Python paths, which give the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("receivewal.wal._scan", ["receivewal/wal/_scan.c"],
                             optional=True, extra_compile_args=["-O2"]),
                   Extension("receivewal.replication._recv", ["receivewal/replication/_recv.c"],
                             optional=True, extra_compile_args=["-O2"],
                             libraries=["dl"]),
                   Extension("receivewal.logical._rows", ["receivewal/logical/_rows.c"],
                             optional=True, extra_compile_args=["-O2"])])
