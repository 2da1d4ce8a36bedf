"""The GGUF conversion cache is keyed by the file's content, not its path or mtime: a copy
of the same model in another venv reuses the conversion; different bytes never do."""

from __future__ import annotations

import os
import shutil

from stock.gguf_convert import SAMPLE, cache_dir_for, content_key


def test_a_copy_elsewhere_shares_the_key_and_other_bytes_do_not(tmp_path):
    data = bytes(range(256)) * (5 * SAMPLE // 256 + 7)   # larger than the five samples
    a = tmp_path / "venv1" / "m.gguf"
    a.parent.mkdir()
    a.write_bytes(data)
    b = tmp_path / "venv2" / "site" / "m.gguf"
    b.parent.mkdir(parents=True)
    shutil.copyfile(a, b)
    os.utime(b, (1, 1))                                   # another mtime
    assert content_key(a) == content_key(b) and cache_dir_for(a) == cache_dir_for(b)
    for at in (0, len(data) // 2, len(data) - 1):        # a byte in each sampled region
        c = tmp_path / f"c{at}.gguf"
        changed = bytearray(data)
        changed[at] ^= 1
        c.write_bytes(bytes(changed))
        assert content_key(c) != content_key(a), at
    short = tmp_path / "short.gguf"
    short.write_bytes(data[:100])
    assert content_key(short) != content_key(a)           # the size is part of the key
