"""``receivewal relay``: a proxy that compresses a plain server's replication stream with
pg_streampack for receivers across a slow link.
"""
