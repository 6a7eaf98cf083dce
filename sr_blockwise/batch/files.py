"""The batch command's files: outputs written atomically and marked as this tool's, the
temporary files a killed run left, the checks that a folder takes files and that no file of the
user's is replaced."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import time
from pathlib import Path

import numpy as np
from PIL import Image

SAVE_ARGS = {  # lossless or near-lossless: at 32x32 every pixel counts
    "png": ("PNG", {}),
    "jpg": ("JPEG", {"quality": 95, "subsampling": 0}),  # 4:4:4, no chroma blur
    "webp": ("WEBP", {"lossless": True}),
}


def _resolve(p: Path) -> Path:
    """p.resolve(), or its absolute path where a symlink loop makes that fail: such a file is
    then reported as unreadable when it is opened, instead of stopping the planning."""
    try:
        return p.resolve()
    except (OSError, RuntimeError):
        return Path(os.path.abspath(p))


def check_writable(folder: Path, what: str) -> None:
    """ValueError (a bad argument: exit 2, before any work) unless `folder` takes files, or can be
    made in a folder that does. Makes no folder: a probe file in the nearest existing one is
    written and removed."""
    there = folder
    while not os.path.lexists(there) and there != there.parent:
        there = there.parent
    if not there.is_dir():
        raise ValueError(f"{what} {folder}: cannot be made ({there} is not a folder)")
    probe = _temp_name(there / "write-test")
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{what} {folder}: cannot be written to ({e.strerror or e})") from None


# a temporary file's name: this machine, the writing process, random (_temp_name)
_HOST = hashlib.sha1(socket.gethostname().encode(errors="surrogateescape")).hexdigest()[:8]
_TEMP = re.compile(r"\.([0-9a-f]{8})-([0-9]+)-[0-9a-f]{12}\.tmp")


def _temp_name(path: Path) -> Path:
    """A short hidden temporary name next to `path`: a long name plus a suffix could pass the file
    system's 255-byte limit. It names this machine and process (a later run removes what a killed
    one left: sweep_temp_files), and is random, so that processes on other machines sharing the
    folder (where process ids can be equal) never write the same file."""
    return path.with_name(f".{_HOST}-{os.getpid()}-{os.urandom(6).hex()}.tmp")


def _alive(pid: int) -> bool:
    if os.name == "nt":  # there os.kill ends the process whatever the signal: assume it lives
        return True
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except (ProcessLookupError, OverflowError):  # none with that id (or an id no process has)
        return False
    except PermissionError:  # another user's
        pass
    return True


TEMP_STALE_S = 600  # a temporary file untouched this long is no write in progress (one takes seconds)


def sweep_temp_files(folders, stale_s: float = TEMP_STALE_S) -> int:
    """Remove the temporary files that a process of this machine, killed while writing (SIGKILL,
    out of memory), left in these folders: named by this machine and a process that is gone, and
    untouched for stale_s seconds, so that a write in progress is never taken for one (containers
    may share a host name but not their process ids). Those of live processes and of other
    machines sharing a folder stay. Returns how many were removed."""
    removed, now = 0, time.time()
    for folder in folders:
        try:
            names = [f.name for f in Path(folder).iterdir()]
        except OSError:  # not there yet, or not readable: nothing of ours in it
            continue
        for name in names:
            m = _TEMP.fullmatch(name)
            if not (m and m.group(1) == _HOST and not _alive(int(m.group(2)))):
                continue
            path = Path(folder) / name
            try:
                if now - path.stat().st_mtime >= stale_s:
                    path.unlink()
                    removed += 1
            except OSError:
                pass
    return removed


SOFTWARE = "sr-blockwise"  # the EXIF Software tag of every file written: a later run knows its own results
_EXIF_SOFTWARE = 0x0131


def save_atomic(img: np.ndarray, path: Path, ext: str) -> None:
    """Write to a hidden temporary file next to `path`, then rename: readers (and a resumed run)
    only ever see complete images. The file is marked as this tool's (made_here)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt, kw = SAVE_ARGS[ext]
    tmp = _temp_name(path)
    exif = Image.Exif()
    exif[_EXIF_SOFTWARE] = SOFTWARE
    with _written_as(tmp, path):
        Image.fromarray(img).save(tmp, format=fmt, exif=exif.tobytes(), **kw)
        os.replace(tmp, path)


@contextlib.contextmanager
def _written_as(tmp: Path, path: Path):
    """Around writing `path` as the temporary file `tmp`: where it fails, tmp is removed and an
    error about tmp names path (the user's file, not a hidden name)."""
    try:
        yield
    except BaseException as e:
        with contextlib.suppress(OSError):  # a read-only file system refuses even the unlink
            tmp.unlink()
        if isinstance(e, OSError) and e.errno is not None and e.filename in (str(tmp), tmp):
            raise OSError(e.errno, e.strerror, str(path)) from None  # OSError(errno, ...) is PermissionError etc.
        raise


def made_here(path: Path) -> bool:
    """Whether an image file is a result this tool wrote (save_atomic's mark), not a photo of the
    user's that happens to have a result's name."""
    try:
        with Image.open(path) as img:
            return img.getexif().get(_EXIF_SOFTWARE) == SOFTWARE
    except (OSError, SyntaxError, ValueError):
        return False


FOREIGN = "exists beside the inputs, was not written by sr-blockwise, and a result would replace it"


def foreign_beside_inputs(path: Path, input_folders: set) -> bool:
    """Whether writing a result to `path` would replace a file of the user's sitting among the
    inputs (a file this tool wrote there is its own to replace)."""
    return _resolve(path.parent) in input_folders and path.exists() and not made_here(path)
