"""The one exception type the CLI turns into a one-line error and a non-zero exit."""


class SpecPilotError(Exception):
    """A user-facing error: the message is printed on one line, exit code is `code`."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code
