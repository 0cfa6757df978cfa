"""Whole-file copies for what a serving bundle ships (deploy): never a hard link, never a link's target outside the
input it belongs to, and no path of this machine left in a copied config.

May import: ``errors``, ``files.hub``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from trtllm_medusa_ports.errors import ConversionError
from trtllm_medusa_ports.files.hub import cache_dir

#: Linux's FICLONE ioctl (linux/fs.h ``_IOW(0x94, 9, int)``): the destination shares the source's extents,
#: copy-on-write
FICLONE = 0x40049409
#: configs scrubbed of this machine's paths are JSON files up to this size (tokenizer.json, the largest, holds none)
SCRUBBED_JSON_BYTES = 8 << 20


def copy_file(source: Path, destination: Path) -> None:
    """``destination``, a new file holding ``source``'s bytes: a reflink where the filesystem shares blocks
    copy-on-write (btrfs, XFS: no space taken, and an edit of either side stays its own), else the kernel's copy
    (``shutil.copyfile``: sendfile on Linux). Never a hard link, whose edits would cross between the two."""
    import fcntl

    with open(source, "rb") as src, open(destination, "xb") as dst:
        try:
            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
            return
        except OSError:  # no reflinks here (ext4, tmpfs, another filesystem)
            pass
    shutil.copyfile(source, destination)


def input_root(directory: Path) -> Path:
    """Where the files of the input ``directory`` (resolved) may lie: the directory itself, or for a snapshot in
    the Hugging Face cache its repository's folder there (a snapshot's files are links into ``blobs/``)."""
    cache = cache_dir().resolve()
    try:
        top = directory.relative_to(cache).parts[0]
    except (ValueError, IndexError):
        return directory
    return cache / top


def own_file(path: Path, root: Path, what: str) -> Path:
    """``path``'s target where it lies within ``root`` (the input it belongs to); a link leading out of it is refused
    by name, never followed: a bundle is shipped to another machine."""
    target = path.resolve()
    if not target.is_relative_to(root):
        raise ConversionError(
            f"{path.name} is a link to {target}, outside the {what} ({root}): deploy copies an input's own files only, "
            "never what a link points to elsewhere (the bundle is shipped to another machine)", where=str(path),
            fix=f"replace the link with the file it points to (cp --remove-destination {target} {path}), or remove "
                "it from the directory")
    return target


def _is_machine_path(value: str) -> bool:
    return len(value) > 1 and os.path.isabs(value) and not any(c.isspace() or c in "{}" for c in value)


def scrub_paths(value, where: str = "") -> tuple[object, list[str]]:
    """``value`` (parsed JSON) with every string that is an absolute path of this machine replaced by its last
    component (relative: the name without where it lay), and the dotted names of the fields replaced."""
    if isinstance(value, dict):
        out, fields = {}, []
        for k, v in value.items():
            out[k], f = scrub_paths(v, f"{where}.{k}" if where else str(k))
            fields += f
        return out, fields
    if isinstance(value, list):
        pairs = [scrub_paths(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return [p[0] for p in pairs], [f for p in pairs for f in p[1]]
    if isinstance(value, str) and _is_machine_path(value):
        return Path(value).name, [where]
    return value, []


def copy_scrubbed(source: Path, destination: Path) -> list[str]:
    """:func:`copy_file`, except that a JSON config has this machine's paths replaced (:func:`scrub_paths`): the
    fields replaced."""
    if source.suffix == ".json" and source.stat().st_size <= SCRUBBED_JSON_BYTES:
        try:
            data = json.loads(source.read_text())
        except (UnicodeDecodeError, ValueError):
            data = None
        if data is not None:
            clean, fields = scrub_paths(data)
            if fields:
                with open(destination, "x") as f:
                    json.dump(clean, f, indent=2)
                    f.write("\n")
                return fields
    copy_file(source, destination)
    return []
