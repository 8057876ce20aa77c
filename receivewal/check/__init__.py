"""Reading an archive back: verify (one machine), analyze (Spark), the cross-segment checks
and the report they share, and the archive's base backups checked for verify (backupcheck).
"""
