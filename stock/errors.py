"""User-facing errors of the stock engine: the CLI prints them on one line and exits 1."""


class StockError(ValueError):
    pass
