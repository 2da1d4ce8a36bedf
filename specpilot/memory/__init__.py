"""Memory entries: commits with a dependency DAG, metadata in notes, exact replay.

entry.py (the metadata model), dag.py (order, cycles), store.py (refs + notes, memory/),
patches.py (paths, hunks, hashes), replay.py, verify.py, record.py, portable.py
(import/export), rebase.py.
"""
