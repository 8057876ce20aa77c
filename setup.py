"""The optional C extension of the segment scanner (receivewal/wal/_scan.c).

Everything else is in pyproject.toml. ``optional=True``: without a compiler the build warns
and the package installs with the pure-Python scanner, which gives the same results.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("receivewal.wal._scan", ["receivewal/wal/_scan.c"],
                             optional=True, extra_compile_args=["-O2"])])
