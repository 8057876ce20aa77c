"""The replication protocol: the libpq connection (the only psycopg user), the CopyData codecs,
and the pg_streampack codec. Knows nothing of files.
"""
