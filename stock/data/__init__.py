"""Packaged data for the stock engine (the development request set)."""
