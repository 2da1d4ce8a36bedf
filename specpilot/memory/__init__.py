"""Memory entries: commits with a dependency DAG, metadata in notes, exact replay.

entry.py (the metadata model), dag.py (order, cycles), store.py (refs + notes, memory/),
patches.py (hunks, hashes, the system-path rule), replay.py, verify.py, record.py,
portable.py (import/export), repair.py (unreadable notes), rebase.py, results.py.
"""
