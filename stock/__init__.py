"""The stock speculative-decoding engine: the system under optimization.

Never imports `specpilot`: the optimizer depends on stock, not the other way round.
"""
