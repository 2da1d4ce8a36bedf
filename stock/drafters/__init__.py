"""Drafters behind one interface: each returns a draft lattice for the next positions."""

from stock.drafters.base import DraftContext, DraftLattice, Drafter

__all__ = ["DraftContext", "DraftLattice", "Drafter"]
