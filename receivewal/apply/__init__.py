"""``receivewal apply``: a change log made tables, exactly once.

:mod:`~receivewal.apply.source` reads what a change log directory holds, in the order it is
applied: the snapshot's tables (:mod:`receivewal.logical.snapshot`), then every complete
committed transaction of the log, in commit order (a prepared one at its COMMIT PREPARED,
none at a ROLLBACK PREPARED). A target applies each as one unit and records how far it got in
the same transaction as the rows (:mod:`~receivewal.apply.postgres`: a PostgreSQL database;
:mod:`~receivewal.apply.delta`: Delta Lake tables, progress in each commit), so that a run
killed at any moment and run again applies nothing twice and skips nothing
(:mod:`~receivewal.apply.run` drives either).
"""
