"""Restore: ``receivewal restore %f %p``, PostgreSQL's restore_command, and its prefetch spool."""
