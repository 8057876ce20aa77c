"""Base backups: taken over the replication protocol, written into the archive, recovered.

(The module map is completed as the package grows.)
"""
