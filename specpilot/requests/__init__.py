"""Request sets: the development set (visible to agents), the sealed generator (never
committed: a secret seed outside the repository), and users' own request files.

These live with the judges, outside the system paths: no candidate's checkout carries them.
"""

from specpilot.requests.sets import (CATEGORIES, DEV_RESOURCE, Request, dump_jsonl,
                                     interleaved, load_dev, load_jsonl, parse_jsonl, select,
                                     spread)

__all__ = ["CATEGORIES", "DEV_RESOURCE", "Request", "dump_jsonl", "interleaved", "load_dev",
           "load_jsonl", "parse_jsonl", "select", "spread"]
