"""Tokenizer and chat template: `tokenizers` for the vocabulary, jinja2 for the template."""

from __future__ import annotations

from pathlib import Path

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from stock.errors import StockError
from stock.weights import read_json


class TokenizerError(StockError):
    pass


def _object(data, path: Path) -> dict:
    if not isinstance(data, dict):
        raise TokenizerError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


class Tokenizer:
    def __init__(self, folder: Path):
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"{folder}: no tokenizer.json (a model folder needs its "
                                 f"tokenizer)")
        try:
            self.tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception for a bad file
            raise TokenizerError(f"{path}: not a readable tokenizer: "
                                 f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                                 ) from None
        meta = self._meta(folder)
        self.chat_template: str | None = meta.get("chat_template")
        self.bos_id = meta.get("bos_token_id")
        self.add_bos = bool(meta.get("add_bos_token", False))
        eos = meta.get("eos_token_id")
        self.stop_ids = set([eos] if isinstance(eos, int) else (eos or []))
        for special in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = self.tok.token_to_id(special)
            if tid is not None:
                self.stop_ids.add(tid)
        self._template = (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
                          .from_string(self.chat_template) if self.chat_template else None)

    @staticmethod
    def _meta(folder: Path) -> dict:
        if (folder / "specpilot_tokenizer.json").is_file():
            return _object(read_json(folder / "specpilot_tokenizer.json"),
                           folder / "specpilot_tokenizer.json")
        meta: dict = {}
        cfg = folder / "tokenizer_config.json"
        if cfg.is_file():
            data = _object(read_json(cfg), cfg)
            meta["chat_template"] = data.get("chat_template")
            meta["add_bos_token"] = data.get("add_bos_token", False)
        if (folder / "chat_template.jinja").is_file():
            meta["chat_template"] = (folder / "chat_template.jinja").read_text()
        model_cfg = folder / "config.json"
        if model_cfg.is_file():
            data = _object(read_json(model_cfg), model_cfg)
            meta["bos_token_id"] = data.get("bos_token_id")
            meta["eos_token_id"] = data.get("eos_token_id")
        return meta

    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special)

    def chat(self, user: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat prompt ready for generation."""
        if self._template is None:
            return self.encode(user)
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": user}]
        text = self._template.render(messages=messages, add_generation_prompt=True,
                                     bos_token="", eos_token="")
        return self.tok.encode(text, add_special_tokens=False).ids
