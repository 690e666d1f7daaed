"""Writing files safely, reading a file from outside within a bound, and reading the small
text files of /proc and /sys.

Every file the agent writes goes through here (``SafeDir``, or ``atomic_write`` for one
file): the folder is opened once as a descriptor, never through a symlink; a new file is
first a temporary with an unpredictable name, created exclusively and never through a
symlink, relative to that descriptor; it is written, fsync'ed, renamed over the final name
within the same descriptor, and the folder is fsync'ed. So a crash or power cut never
leaves a file half-written, and someone who can plant names in the folder (or swap the
folder for a symlink) cannot make the agent write or delete anywhere else. A write that
fails (a full disk) leaves no temporary behind.

The folder's path is walked from ``/`` one name at a time, every folder on the way checked
as OpenSSH's StrictModes checks a home directory (see ``open_dir``): a folder that another
user owns or can write to is refused, since they could swap what lies below it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import secrets
import stat
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "TEMPORARY",
    "FileRefused",
    "SafeDir",
    "UnsafePathError",
    "atomic_write",
    "file_sha256",
    "open_dir",
    "open_private",
    "open_regular",
    "read_regular",
    "read_text",
]

#: The names of this module's temporaries: ``.<final name>.<16 hex digits>.tmp``.
TEMPORARY = re.compile(r"^\..+\.[0-9a-f]{16}\.tmp$", re.DOTALL)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A folder on the way, only looked at and used as dir_fd: O_PATH needs no read permission
# (a parent of mode 0711). O_NOFOLLOW|O_DIRECTORY on a symlink: ENOTDIR, then lstat says so.
_PATH_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_LINKS = 40  # symlinks followed in the parents of one path, as the kernel's ELOOP
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 16  # unpredictable names that are all taken: someone is planting them


class UnsafePathError(OSError):
    """A path the agent will not write through: a symlink, a folder (or a folder above it)
    that others can write to or that another user owns, something that is not a folder or a
    regular file, a name that is not a plain file name. ``filename`` is the path (of the
    folder above, when that one is refused), ``reason`` why; ``str()`` names both.
    ``errno`` is ELOOP for a symlink (or too many in the parents), ENOTDIR for a folder that
    is not one, EINVAL for a file that is not regular or a bad name, EPERM for a folder's
    owner or mode (or one that changed while it was opened)."""

    def __init__(self, path: str | os.PathLike, reason: str, code: int = errno.EPERM) -> None:
        super().__init__(code, reason, os.fspath(path))
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.filename}: {self.reason}"

    def __reduce__(self):  # keep (path, reason, code) across pickling (a worker process)
        return (type(self), (self.filename, self.reason, self.errno))


class SafeDir:
    """A folder opened once as a descriptor (see ``open_dir``); every operation is relative
    to that descriptor, so renaming the folder or planting a symlink at its path later
    changes nothing. Names are plain file names (no ``/``). Close it (or use ``with``)."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def write(
        self, name: str, data: bytes | bytearray | memoryview, mode: int = 0o600, *, durable: bool = True
    ) -> int:
        """Write ``data`` as ``name`` with file mode ``mode`` (exactly: the umask does not
        apply); the bytes written. ``name`` is replaced in one rename, never followed (a
        symlink there is replaced, its target untouched). ``durable``: the file is fsync'ed
        before the rename and the folder after it, so a power cut leaves the old file or the
        whole new one; without, a power cut may lose the file (never another one).

        Raises OSError (a full disk: ENOSPC or EFBIG) with no temporary left behind, or
        UnsafePathError for a name that is not a plain file name."""
        _plain(name, self.path)
        tmp, fd = self._temporary(name, mode)
        try:
            try:
                os.fchmod(fd, mode)  # the umask narrowed os.open's mode: make it exact
                view = memoryview(data).cast("B")
                size = view.nbytes
                while view:
                    view = view[os.write(fd, view) :]
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise
        if durable:
            os.fsync(self.fd)  # the rename itself survives a power cut
        return size

    def _temporary(self, name: str, mode: int) -> tuple[str, int]:
        # Unpredictable, created exclusively, never through a symlink: a name someone planted
        # (a link, a file, a FIFO) is taken by them, and another is drawn.
        stem = name if len(name.encode()) <= 200 else name[:50]  # the temporary fits NAME_MAX
        for _ in range(_TRIES):
            tmp = f".{stem}.{secrets.token_hex(8)}.tmp"
            try:
                return tmp, os.open(tmp, _NEW_FILE, mode, dir_fd=self.fd)
            except FileExistsError:
                continue
        raise UnsafePathError(
            os.path.join(self.path, name), f"{_TRIES} temporary names in a row were taken: refused"
        )

    def unlink(self, name: str) -> bool:
        """Remove ``name`` (a symlink is removed, not followed); False when it was not there."""
        _plain(name, self.path)
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """The regular files in the folder (symlinks and others left out), with their
        ``lstat``; names of this module's temporaries left out."""
        found = []
        with os.scandir(self.fd) as it:
            for entry in it:
                with contextlib.suppress(FileNotFoundError):  # removed meanwhile
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and not TEMPORARY.match(entry.name):
                        found.append((entry.name, st))
        return found

    def remove_stale(self, also: re.Pattern[str] | None = None) -> int:
        """Remove the temporaries an earlier run left (a crash, a full disk): regular files
        of this user's named as this module names them, or matching ``also`` (an older
        naming); how many. Only for a folder this process alone writes: another writer's
        temporary would go (another user's never does: it is left where it is)."""
        removed = 0
        me = os.geteuid()
        with os.scandir(self.fd) as it:
            names = [e.name for e in it if TEMPORARY.match(e.name) or (also and also.match(e.name))]
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and st.st_uid == me:
                    os.unlink(name, dir_fd=self.fd)
                    removed += 1
        return removed

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> SafeDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_dir(
    path: str | os.PathLike, mode: int = 0o700, *, create: bool = True, private: bool = True
) -> SafeDir:
    """Open the folder ``path`` as a ``SafeDir``, creating it (and its parents) when missing
    and ``create``; a folder created here, a parent too, gets exactly ``mode`` (0700 by
    default; never widened or narrowed by the umask).

    The path is first normalised: relative to the working folder, empty and ``.`` names
    dropped, so ``snaps/``, ``snaps/.`` and ``snaps//`` all name ``snaps`` (a trailing
    slash would make the kernel follow a symlink ``snaps`` whatever O_NOFOLLOW says). It is
    then walked from ``/`` one name at a time, each opened relative to the folder before it,
    never following a symlink by accident; ``..`` goes to the parent of the folder reached
    so far, which is what the kernel does (not a lexical step back over a symlink).

    The folder itself: refused with UnsafePathError when it is a symlink or not a folder.
    When ``private`` (a folder the agent owns: snapshots, its state), refused when owned by
    another user (root excepted) or when others (group or world) can write to it, sticky or
    not, since whoever can write there can delete or swap what the agent keeps there. Not
    ``private`` (a folder the user named for one file: a report, the engine cache), refused
    when owned by another user (root excepted), or when its group or anyone can write to it
    without the sticky bit; a sticky shared one (1777) only when it is this user's own.

    Every folder above it (StrictModes): refused when owned by a user other than root or
    this one, or when its group or anyone can write to it without the sticky bit; whoever
    could would swap the folder below for one of theirs. A sticky one that anyone can write
    to (``/tmp``, root's) is fine: nobody else may rename or remove what we made in it.
    A symlink among them is followed when it is owned by root or this user (in a sticky
    folder its owner could swap it); it cannot be changed, only replaced, so the folder
    holding it, already checked, guards it, and its target is walked and checked in turn
    (``/var/run -> /run``, root's: fine); nothing is made for a target that is missing (a
    link to an SD card not mounted: FileNotFoundError, not a folder on the root card).

    The ``SafeDir``'s ``path`` is the folder's real path (the symlinks above resolved, no
    ``..``), and errors name it. Belt and braces, once opened: the ``lstat`` of that path,
    and of the path as given, must be a folder, the one opened (st_dev, st_ino). Other
    failures (not there and not ``create``, no permission) raise OSError naming the path."""
    given = _normalised(path)
    fd, path = _walk(given, mode, create)
    try:
        st = os.fstat(fd)
        _check_folder(path, st, private)
        for spelled in {path, given}:  # belt and braces: the path names the folder opened
            seen = os.lstat(spelled)
            if stat.S_ISLNK(seen.st_mode):
                raise UnsafePathError(spelled, "is a symlink: refused (give the real folder)", errno.ELOOP)
            if not stat.S_ISDIR(seen.st_mode) or (seen.st_dev, seen.st_ino) != (st.st_dev, st.st_ino):
                raise UnsafePathError(
                    spelled, "changed while it was opened (not the folder reached): refused"
                )
    except BaseException:
        os.close(fd)
        raise
    return SafeDir(fd, path)


def _normalised(path: str | os.PathLike) -> str:
    """``path`` absolute, without empty or ``.`` names (``..`` kept: the walk follows it)."""
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise FileNotFoundError(errno.ENOENT, "an empty path", path)
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)
    return "/" + "/".join(n for n in path.split("/") if n not in ("", "."))


def _walk(path: str, mode: int, create: bool) -> tuple[int, str]:
    """The folder ``path`` (normalised) opened O_RDONLY, and its real path; reached from
    ``/`` one name at a time, each folder checked before anything is opened or made in it."""
    # The names still to go, the next last, each with whether it may be made when missing:
    # the path's own may (``create``), a symlink's target's may not.
    todo = [(n, create) for n in reversed(path.split("/")) if n]
    real: list[str] = []  # the folders reached, from /: no symlink among them
    links = 0
    fd = os.open("/", _PATH_FLAGS)
    try:
        while todo:
            name, may_create = todo.pop()
            if name == "..":  # the kernel's: the parent of the folder reached (checked on the way)
                if real:
                    fd = _replace(fd, os.open("..", _PATH_FLAGS, dir_fd=fd))
                    real.pop()
                continue
            here = "/" + "/".join(real)
            _check_parent(here, os.fstat(fd), path)
            shown = os.path.join(here, name)
            step = _step(fd, name, shown, mode, may_create)
            if step is not None:
                fd = _replace(fd, step)
                real.append(name)
                continue
            # a symlink: never the folder itself; above it, followed when safe
            if not todo:
                raise UnsafePathError(shown, "is a symlink: refused (give the real folder)", errno.ELOOP)
            links += 1
            if links > _MAX_LINKS:
                raise UnsafePathError(shown, f"more than {_MAX_LINKS} symlinks above {path}", errno.ELOOP)
            owner, me = os.stat(name, dir_fd=fd, follow_symlinks=False).st_uid, os.geteuid()
            if owner not in (me, 0):
                raise UnsafePathError(
                    shown,
                    f"a symlink owned by uid {owner}, not by root or this user (uid {me}): above {path}",
                )
            target = os.readlink(name, dir_fd=fd)
            todo.extend((n, False) for n in reversed(target.split("/")) if n not in ("", "."))
            if target.startswith("/"):
                fd = _replace(fd, os.open("/", _PATH_FLAGS))
                real = []
        return _replace(fd, os.open(".", _DIR_FLAGS, dir_fd=fd)), "/" + "/".join(real)
    except BaseException:
        os.close(fd)
        raise


def _replace(old: int, new: int) -> int:
    os.close(old)
    return new


def _step(fd: int, name: str, shown: str, mode: int, create: bool) -> int | None:
    """The folder ``name`` in ``fd`` (made with exactly ``mode`` when missing and
    ``create``), opened O_PATH; None when it is a symlink."""
    made = False
    try:
        for _ in range(3):  # made meanwhile by someone else, or removed again: a few tries
            try:
                new = os.open(name, _PATH_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode, dir_fd=fd)
                    made = True
                continue
            if made:  # the umask narrowed (or widened, with 0) mkdir's mode: make it exact
                try:
                    readable = os.open(".", _DIR_FLAGS, dir_fd=new)
                    try:
                        os.fchmod(readable, mode)
                    finally:
                        os.close(readable)
                except BaseException:
                    os.close(new)
                    raise
            return new
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), shown)
    except OSError as e:
        if isinstance(e, UnsafePathError):
            raise
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            with contextlib.suppress(OSError):
                if stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    return None
            if e.errno == errno.ENOTDIR:
                raise UnsafePathError(shown, "is not a folder", errno.ENOTDIR) from None
        raise type(e)(e.errno, e.strerror, shown) from None  # the whole path, not the name


def _shared(perms: int) -> str:
    return "anyone" if perms & 0o002 else "its group"


def _check_parent(where: str, st: os.stat_result, path: str) -> None:
    perms, owner, me = stat.S_IMODE(st.st_mode), st.st_uid, os.geteuid()
    if owner not in (me, 0):
        raise UnsafePathError(
            where, f"owned by uid {owner}, not by root or this user (uid {me}): above {path}"
        )
    if perms & 0o022 and not perms & stat.S_ISVTX:
        raise UnsafePathError(
            where,
            f"{_shared(perms)} can write to it (mode {perms:04o}) and it has no sticky bit: above {path}",
        )


def _check_folder(path: str, st: os.stat_result, private: bool) -> None:
    perms, owner, me = stat.S_IMODE(st.st_mode), st.st_uid, os.geteuid()
    if owner not in (me, 0):
        raise UnsafePathError(path, f"owned by uid {owner}, not by this user (uid {me})")
    if not perms & 0o022:
        return
    if private:
        raise UnsafePathError(
            path, f"others can write to it (mode {perms:04o}): refused (chmod go-w, or 0700)"
        )
    if not perms & stat.S_ISVTX:
        raise UnsafePathError(
            path, f"{_shared(perms)} can write to it (mode {perms:04o}) and it has no sticky bit"
        )
    if owner != me:
        raise UnsafePathError(
            path,
            f"{_shared(perms)} can write to it (mode {perms:04o}) and it is not this user's (uid {me}):"
            " a shared folder only when it is ours",
        )


def _plain(name: str, folder: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise UnsafePathError(os.path.join(folder, name), "not a plain file name", errno.EINVAL)


def atomic_write(path: str | os.PathLike, data: bytes | memoryview, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that ``path`` is never seen half-written, with file mode
    ``mode`` (0600 by default; 0644 for a file others must read).

    Through ``SafeDir.write`` in the parent folder (created 0700 when missing, its parents
    too), opened with ``open_dir(private=False)``: a symlinked one, one another user owns, one
    its group or anyone can write to without the sticky bit, a sticky shared one not ours,
    or a folder above it that is unsafe, is refused. Raises OSError (a full disk, no
    temporary left behind) or UnsafePathError (an OSError: the path and why)."""
    path = Path(path)
    with open_dir(path.parent, private=False) as folder:
        folder.write(path.name, data, mode)


def open_private(path: str | os.PathLike, flags: int = os.O_RDWR) -> int:
    """Open (create) ``path`` as a regular file of mode 0600, not through a symlink, without
    blocking on a FIFO; the descriptor. A file with group or world bits (an older version
    created it 0644) is narrowed to 0600.

    Raises UnsafePathError (a symlink: ELOOP; not a regular file: EINVAL) or OSError."""
    flags |= os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafePathError(path, "is a symlink: refused (give the real path)", errno.ELOOP) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(path, "not a regular file", errno.EINVAL)
        if st.st_mode & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes, read in chunks (models are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_text(path: str | os.PathLike) -> str:
    """A small text file's contents, stripped of whitespace and device-tree NULs; "" when it
    cannot be read (not there, not allowed): for reports, never for decisions."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip().strip("\x00")
    except OSError:
        return ""


class FileRefused(ValueError):
    """A file from outside that ``read_regular`` will not read; the message says why (the
    caller names the file in its own words: a manifest, an image, a key)."""


def read_regular(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most ``max_bytes``. Looked at
    before it is opened (opening is already an effect: a FIFO's writer wakes, a device may
    act), opened non-blocking and never as a controlling terminal, checked again on the
    descriptor (the check must hold for what is read, not for what was at the path a moment
    before), and read no further than its size: one byte more tells that it grew, and a
    small file costs no ``max_bytes`` buffer. Raises FileRefused, also for what the system
    refuses (not there, not allowed: its words)."""
    try:
        return _read_regular(path, max_bytes)
    except OSError as e:
        raise FileRefused(e.strerror or str(e)) from None


def _read_regular(path: str | os.PathLike, max_bytes: int) -> bytes:
    f, size = open_regular(path, max_bytes)
    with f:
        data = f.read(size + 1)
    if len(data) > size:
        raise FileRefused("grew while it was read")
    return data


def open_regular(path: str | os.PathLike, max_bytes: int | None = None) -> tuple[BinaryIO, int]:
    """``path`` opened for reading, and its size, when it is a regular file (of at most
    ``max_bytes``), looked at and opened as ``read_regular`` does: for a file read in
    parts (a recording of model outputs). Raises FileRefused, or OSError for what the
    system refuses."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise FileRefused("not a regular file (a FIFO, device or folder is never read)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused("not a regular file (a FIFO, device or folder is never read)")
        if max_bytes is not None and st.st_size > max_bytes:
            raise FileRefused(f"{st.st_size} bytes, over {max_bytes}")
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise
