"""What a directory (or a file) is made of, for deciding whether work done on it can be reused: the name, size,
modification time and inode of every file under it. verify keeps the transformers side of a base by it
(verify/hf_memo.py) and port keys each stage by its inputs' and its output's (port.py).
"""

from __future__ import annotations

import os
from pathlib import Path


def file_identity(directory: str | Path) -> tuple | None:
    """``(resolved path, ((name, size, mtime_ns, inode), ...))`` of the files under ``directory`` (or of the one file
    it is); None where it cannot be listed (nothing is kept for it)."""
    root = Path(directory)
    try:
        resolved = root.resolve(strict=True)
        if not resolved.is_dir():  # a heads file given on its own
            st = resolved.stat()
            return str(resolved), ((resolved.name, st.st_size, st.st_mtime_ns, st.st_ino),)
        entries = []
        for dirpath, dirnames, filenames in os.walk(resolved):
            dirnames.sort()
            for name in sorted(filenames):
                st = os.stat(os.path.join(dirpath, name))
                entries.append((os.path.relpath(os.path.join(dirpath, name), resolved), st.st_size, st.st_mtime_ns,
                                st.st_ino))
    except OSError:
        return None
    return str(resolved), tuple(entries)
