"""The archive directory: where received bytes go, segment files, compression at rest, and the
only code that opens files for writing, fsyncs and renames.
"""
