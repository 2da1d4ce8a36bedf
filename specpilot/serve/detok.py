"""Text of a reply as its tokens arrive: the stream's pieces, concatenated, are the text of
the whole reply decoded at once (the non-streamed text)."""

from __future__ import annotations

from collections.abc import Callable

PARTIAL = "\ufffd"   # what a byte-level tokenizer decodes an incomplete UTF-8 sequence to


class IncrementalText:
    """feed(new ids) -> the new text, if any; finish() -> the rest. A piece is given only
    once the whole decoded text so far extends what was given (and does not end inside a
    character), so nothing given is ever taken back."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.sent = ""

    def feed(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        text = self.decode(self.ids)
        if text.endswith(PARTIAL) or not text.startswith(self.sent):
            return ""
        piece, self.sent = text[len(self.sent):], text
        return piece

    def finish(self) -> str:
        """The rest of the reply's text (everything, if a piece ever went missing: the
        decode of a prefix that is not a prefix of the whole is not streamed)."""
        text = self.decode(self.ids)
        piece = text[len(self.sent):] if text.startswith(self.sent) else ""
        self.sent = text
        return piece
