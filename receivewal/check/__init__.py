"""Reading an archive back: verify (one machine), analyze (Spark), the cross-segment checks
and the report they share.
"""
