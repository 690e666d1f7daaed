"""Writing files safely (``core.files``): a folder opened once as a descriptor and never
through a symlink, temporaries with unpredictable names created exclusively, exact modes,
fsync of the file and then its folder, the rename within the descriptor, nothing left
behind by a failed write, and refusals that name the path and why."""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import run_process

import edge_agent.core.files as files
from edge_agent.core.files import TEMPORARY, UnsafePathError, atomic_write, open_dir, open_private


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_symlink_at_the_final_name_is_replaced_not_followed(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"mine")
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    (folder / "out.json").symlink_to(target)
    with open_dir(folder) as d:
        assert d.write("out.json", b"new") == 3
    assert target.read_bytes() == b"mine"
    assert not (folder / "out.json").is_symlink() and (folder / "out.json").read_bytes() == b"new"
    assert os.listdir(folder) == ["out.json"], "no temporary left"


def test_a_temporary_name_someone_took_is_never_followed_and_another_is_drawn(tmp_path, monkeypatch):
    folder, target = tmp_path / "d", tmp_path / "target"
    folder.mkdir(mode=0o700)
    target.write_bytes(b"mine")
    draws = iter(["0" * 16, "1" * 16, "2" * 16])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(draws))
    (folder / f".a.jpg.{'0' * 16}.tmp").symlink_to(target)  # the link someone guessed right
    os.mkfifo(folder / f".a.jpg.{'1' * 16}.tmp")  # and a FIFO, which would block an open
    with open_dir(folder) as d:
        d.write("a.jpg", b"jpeg")
    assert target.read_bytes() == b"mine"
    assert (folder / "a.jpg").read_bytes() == b"jpeg"
    # Every name taken: refused, not looped on forever
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: "0" * 16)
    with open_dir(folder) as d, pytest.raises(UnsafePathError, match="temporary names in a row were taken"):
        d.write("a.jpg", b"again")
    assert (folder / "a.jpg").read_bytes() == b"jpeg" and target.read_bytes() == b"mine"


def test_temporaries_are_unpredictable(tmp_path):
    names = set()
    with open_dir(tmp_path) as d:
        for _ in range(50):
            tmp, fd = d._temporary("x.jpg", 0o600)
            os.close(fd)
            d.unlink(tmp)
            names.add(tmp)
    assert len(names) == 50 and all(TEMPORARY.match(n) for n in names)


@pytest.mark.parametrize("mask", [0o000, 0o022, 0o077])
def test_modes_are_exact_whatever_the_umask(tmp_path, mask):
    with umask(mask):
        with open_dir(tmp_path / "new" / "private") as d:
            d.write("secret", b"x")
            d.write("public", b"x", mode=0o644)
        with open_dir(tmp_path / "grouped", mode=0o750):
            pass
        atomic_write(tmp_path / "made" / "state.json", b"{}")
    assert mode_of(tmp_path / "new" / "private") == 0o700
    assert mode_of(tmp_path / "new" / "private" / "secret") == 0o600
    assert mode_of(tmp_path / "new" / "private" / "public") == 0o644
    assert mode_of(tmp_path / "grouped") == 0o750
    assert mode_of(tmp_path / "made") == 0o700 and mode_of(tmp_path / "made" / "state.json") == 0o600


def test_the_file_is_fsynced_before_the_rename_and_the_folder_after(tmp_path, monkeypatch):
    synced: list[tuple[str, bool]] = []  # (what, whether the final name existed then)
    real = os.fsync

    def spy(fd):
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        synced.append((kind, (tmp_path / "d" / "f").exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    with open_dir(tmp_path / "d") as d:
        d.write("f", b"data")
    assert synced == [("file", False), ("folder", True)]


def test_every_operation_goes_through_the_descriptor_not_the_path(tmp_path):
    """Swapping the folder for a symlink after it was opened sends nothing elsewhere."""
    folder, moved, elsewhere = tmp_path / "snaps", tmp_path / "moved", tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "old.jpg").write_bytes(b"theirs")
    with open_dir(folder) as d:
        d.write("old.jpg", b"ours")
        folder.rename(moved)
        folder.symlink_to(elsewhere)
        d.write("new.jpg", b"ours too")
        assert d.unlink("old.jpg") and not d.unlink("old.jpg")
        assert [n for n, _ in d.entries()] == ["new.jpg"]
    assert sorted(os.listdir(moved)) == ["new.jpg"]
    assert sorted(os.listdir(elsewhere)) == ["old.jpg"] and (elsewhere / "old.jpg").read_bytes() == b"theirs"


def refusals(tmp_path: Path):
    """(what is at the path, private, the errno, the words of the reason)."""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    yield "link", True, errno.ELOOP, "is a symlink: refused (give the real folder)"
    yield "link", False, errno.ELOOP, "is a symlink"
    yield "file", True, errno.ENOTDIR, "is not a folder"
    for mode in (0o777, 0o770, 0o720, 0o702, 0o1777):
        (tmp_path / f"m{mode:o}").mkdir()
        (tmp_path / f"m{mode:o}").chmod(mode)
        yield f"m{mode:o}", True, errno.EPERM, f"others can write to it (mode {mode:04o})"
    yield "m777", False, errno.EPERM, "anyone can write to it (mode 0777) and it has no sticky bit"
    (tmp_path / "theirs").mkdir(mode=0o700)
    os.chown(tmp_path / "theirs", 65534, 65534)
    yield "theirs", True, errno.EPERM, "owned by uid 65534, not by this user"


def test_refusals_are_one_error_type_naming_the_path_and_why(tmp_path):
    for name, private, code, words in refusals(tmp_path):
        path = tmp_path / name
        with pytest.raises(UnsafePathError) as raised:
            open_dir(path, private=private)
        e = raised.value
        assert isinstance(e, OSError) and e.errno == code and e.filename == str(path), (name, e)
        assert str(e).startswith(f"{path}: {words}"), str(e)
    assert os.listdir(tmp_path / "real") == [], "nothing created through the link"


@pytest.mark.parametrize("ok", ["m1777", "m1775", "m755", "m750"])
def test_a_folder_the_user_named_may_be_sticky_or_read_by_others(tmp_path, ok):
    """Sticky and ours: others may add files, not replace ours. Shared without the sticky
    bit (0775) is refused: see test_a_folder_the_user_named_for_a_file_must_be_ours..."""
    folder = tmp_path / ok
    folder.mkdir()
    folder.chmod(int(ok[1:], 8))
    atomic_write(folder / "report.json", b"{}")
    assert (folder / "report.json").read_bytes() == b"{}"


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "../x", "a\x00b"])
def test_a_name_that_is_not_a_plain_file_name_is_refused(tmp_path, name):
    with open_dir(tmp_path / "d") as d:
        with pytest.raises(UnsafePathError, match="not a plain file name") as raised:
            d.write(name, b"x")
        assert raised.value.errno == errno.EINVAL
        with pytest.raises(UnsafePathError):
            d.unlink(name)
    assert os.listdir(tmp_path / "d") == []


def test_a_write_that_fails_leaves_no_temporary_and_the_old_file(tmp_path):
    folder = tmp_path / "d"
    with open_dir(folder) as d:
        d.write("kept", b"old")
        (folder / "dir").mkdir()
        (folder / "dir" / "x").write_text("")  # a folder at the final name: the rename fails
        with pytest.raises(OSError) as raised:
            d.write("dir", b"new")
        assert raised.value.errno in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST)
    assert sorted(os.listdir(folder)) == ["dir", "kept"]


FULL = """
import os, resource, signal, sys
from edge_agent.core.files import atomic_write
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # the disk is full at 4 KiB
try:
    atomic_write(sys.argv[1], b"x" * 10000)
except OSError as e:
    print(e.errno)
"""


def test_a_full_disk_leaves_no_temporary_and_the_old_file_whole(tmp_path):
    path = tmp_path / "d" / "state.json"
    atomic_write(path, b"old")
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}
    done = run_process([sys.executable, "-c", FULL, str(path)], 60, env=env)
    assert done.returncode == 0 and done.stdout.strip() == str(errno.EFBIG), done.stdout + done.stderr
    assert os.listdir(path.parent) == ["state.json"] and path.read_bytes() == b"old"


def test_stale_temporaries_are_removed_and_counted_and_nothing_else(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    ours = [".a.jpg.0123456789abcdef.tmp", ".b.json.fedcba9876543210.tmp", ".a.jpg.tmp"]
    for n in ours:
        (folder / n).write_bytes(b"half")
    target = tmp_path / "target"
    target.write_text("mine")
    (folder / ".c.0000000000000000.tmp").symlink_to(target)  # not a file it wrote: left
    others = ["a.jpg", ".a.jpg.0123.tmp", "x.0123456789abcdef.tmp", ".a.jpg.0123456789ABCDEF.tmp"]
    for n in others:
        (folder / n).write_text("mine")
    with open_dir(folder) as d:
        assert d.remove_stale(also=re.compile(r"^\.a\.jpg\.tmp$")) == 3
        assert sorted(n for n, _ in d.entries()) == sorted(n for n in others if not TEMPORARY.match(n))
    assert sorted(os.listdir(folder)) == sorted([*others, ".c.0000000000000000.tmp"])
    assert target.read_text() == "mine"


def test_atomic_write_keeps_its_signature_and_refuses_a_symlinked_folder(tmp_path):
    atomic_write(str(tmp_path / "a" / "b.json"), memoryview(b"[1]"))
    assert (tmp_path / "a" / "b.json").read_bytes() == b"[1]"
    (tmp_path / "link").symlink_to(tmp_path / "a")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        atomic_write(tmp_path / "link" / "c.json", b"[2]")
    assert os.listdir(tmp_path / "a") == ["b.json"]


def test_open_private_creates_0600_narrows_an_old_file_and_refuses_links_and_fifos(tmp_path):
    with umask(0):
        os.close(open_private(tmp_path / "new"))
    assert mode_of(tmp_path / "new") == 0o600
    (tmp_path / "old").write_text("x")
    (tmp_path / "old").chmod(0o644)
    os.close(open_private(tmp_path / "old"))
    assert mode_of(tmp_path / "old") == 0o600 and (tmp_path / "old").read_text() == "x"
    (tmp_path / "target").write_text("mine")
    (tmp_path / "target").chmod(0o644)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(UnsafePathError, match="is a symlink") as raised:
        open_private(tmp_path / "link")
    assert raised.value.errno == errno.ELOOP and mode_of(tmp_path / "target") == 0o644
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="not a regular file") as raised:
        open_private(tmp_path / "fifo")  # returns at once: O_NONBLOCK
    assert raised.value.errno == errno.EINVAL


def test_a_write_that_need_not_survive_a_power_cut_skips_the_fsyncs(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(os, "fsync", synced.append)
    with open_dir(tmp_path / "d") as d:
        d.write("snapshot.jpg", b"jpeg", durable=False)
    assert synced == [] and (tmp_path / "d" / "snapshot.jpg").read_bytes() == b"jpeg"


# -- the path as given: trailing slashes, dots, parents --------------------------------------


@pytest.mark.parametrize("tail", ["/", "/.", "//", "/./", "/.//."])
@pytest.mark.parametrize("create", [True, False])
def test_a_trailing_slash_or_dot_does_not_let_a_symlinked_folder_through(tmp_path, tail, create):
    """``link/`` makes the kernel follow ``link`` whatever O_NOFOLLOW says: the path is
    normalised first, so ``link/``, ``link/.`` and ``link//`` are the symlink ``link``."""
    (tmp_path / "target").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    for private in (True, False):
        with pytest.raises(UnsafePathError, match="is a symlink") as raised:
            open_dir(f"{tmp_path / 'link'}{tail}", create=create, private=private)
        assert raised.value.errno == errno.ELOOP and raised.value.filename == str(tmp_path / "link")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        atomic_write(f"{tmp_path / 'link'}{tail}x.json", b"{}")
    assert os.listdir(tmp_path / "target") == []


def test_a_real_folder_named_with_a_trailing_slash_or_dots_is_opened_by_its_plain_name(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True, mode=0o700)
    for spelled in (
        f"{tmp_path}/a/b/",
        f"{tmp_path}//a/./b/.",
        f"{tmp_path}/a/x/../b",
        f"{tmp_path}/a/b/x/..",
    ):
        with open_dir(spelled) as d:
            assert d.path == str(tmp_path / "a" / "b"), spelled
            d.write("f", spelled.encode())
        assert (tmp_path / "a" / "b" / "f").read_bytes() == spelled.encode()
    assert sorted(os.listdir(tmp_path / "a")) == ["b", "x"], "a/x/.. made x: what the kernel does"
    assert sorted(os.listdir(tmp_path / "a" / "b")) == ["f", "x"]


def test_dot_dot_after_a_symlinked_parent_goes_where_the_kernel_goes(tmp_path):
    """``..`` is the parent of the folder reached (the link's target's), not a lexical step
    back over the link; the folder opened is the one the kernel would open."""
    (tmp_path / "real" / "inner").mkdir(parents=True, mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real" / "inner")
    with open_dir(tmp_path / "link" / ".." / "x") as d:
        d.write("f", b"x")
        assert d.path == str(tmp_path / "real" / "x"), "the real path: the link resolved, no .."
    assert (tmp_path / "real" / "x" / "f").exists() and not (tmp_path / "x").exists()


def test_the_folder_opened_is_checked_against_its_path_once_more(tmp_path, monkeypatch):
    """Belt and braces: the descriptor's (st_dev, st_ino) is the lstat of the path, a folder."""
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "other").mkdir(mode=0o700)
    real = os.lstat

    def swapped(p, *args, **kwargs):  # someone renamed d away and put another folder there
        return real(tmp_path / "other" if os.fspath(p) == str(tmp_path / "d") else p, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", swapped)
    with pytest.raises(UnsafePathError, match="changed while it was opened"):
        open_dir(tmp_path / "d")


def test_a_symlinked_parent_is_followed_only_when_it_and_its_target_are_safe(tmp_path):
    """/var/run -> /run (root's, in a folder only root writes) is fine; a link someone else
    owns, or one to a folder someone else owns, is not: nothing is made behind it."""
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "ours").symlink_to("real")  # relative, like the system's links
    with open_dir(tmp_path / "ours" / "sub") as d:
        d.write("f", b"x")
    assert (tmp_path / "real" / "sub" / "f").exists()
    (tmp_path / "theirs").symlink_to(tmp_path / "real")
    os.lchown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(UnsafePathError, match="a symlink owned by uid 65534") as raised:
        open_dir(tmp_path / "theirs" / "sub2")
    assert raised.value.filename == str(tmp_path / "theirs")
    (tmp_path / "foreign").mkdir(mode=0o755)
    os.chown(tmp_path / "foreign", 65534, 65534)
    (tmp_path / "to-foreign").symlink_to(tmp_path / "foreign")
    with pytest.raises(UnsafePathError, match="owned by uid 65534") as raised:
        open_dir(tmp_path / "to-foreign" / "sub")
    assert raised.value.filename == str(tmp_path / "foreign")
    assert os.listdir(tmp_path / "real") == ["sub"] and os.listdir(tmp_path / "foreign") == []
    (tmp_path / "unmounted").symlink_to(tmp_path / "card" / "edge")  # the SD card is not there
    with pytest.raises(FileNotFoundError) as raised:
        open_dir(tmp_path / "unmounted" / "snaps")
    assert raised.value.filename == str(tmp_path / "card") and not (tmp_path / "card").exists()


@pytest.mark.parametrize("mask", [0o000, 0o022])
def test_missing_parents_are_made_with_the_folders_mode_whatever_the_umask(tmp_path, mask):
    with umask(mask):
        with open_dir(tmp_path / "u" / "a" / "snaps"):
            pass
        with open_dir(tmp_path / "g" / "b" / "shared", mode=0o750):
            pass
        atomic_write(tmp_path / "w" / "x" / "state.json", b"{}")
    made = ("u", "u/a", "u/a/snaps", "g", "g/b", "g/b/shared", "w", "w/x")
    modes = {p: mode_of(tmp_path / p) for p in made}
    assert modes == {
        **dict.fromkeys(("u", "u/a", "u/a/snaps", "w", "w/x"), 0o700),
        **dict.fromkeys(("g", "g/b", "g/b/shared"), 0o750),
    }, {p: oct(m) for p, m in modes.items()}


def parents_refused(tmp_path: Path):
    """(the parent's name, how it is made unsafe, the words of the reason)."""
    (tmp_path / "theirs").mkdir(mode=0o755)
    os.chown(tmp_path / "theirs", 65534, 65534)
    yield "theirs", "owned by uid 65534, not by root or this user"
    (tmp_path / "theirs-sticky").mkdir()
    (tmp_path / "theirs-sticky").chmod(0o1777)
    os.chown(tmp_path / "theirs-sticky", 65534, 65534)
    yield "theirs-sticky", "owned by uid 65534, not by root or this user"
    for mode in (0o777, 0o775, 0o757, 0o2775):
        (tmp_path / f"m{mode:o}").mkdir()
        (tmp_path / f"m{mode:o}").chmod(mode)
        who = "anyone" if mode & 0o002 else "its group"
        yield f"m{mode:o}", f"{who} can write to it (mode {mode:04o}) and it has no sticky bit"


def test_a_parent_others_can_write_to_or_another_user_owns_is_refused(tmp_path):
    for name, words in parents_refused(tmp_path):
        parent = tmp_path / name
        for private in (True, False):
            for leaf in (parent / "new", parent / "deeper" / "new"):
                with pytest.raises(UnsafePathError) as raised:
                    open_dir(leaf, private=private)
                e = raised.value
                assert e.errno == errno.EPERM and e.filename == str(parent), (name, e)
                assert str(e).startswith(f"{parent}: {words}") and f"above {leaf}" in str(e), str(e)
        with pytest.raises(UnsafePathError, match=re.escape(words)):
            atomic_write(parent / "sub" / "model.engine", b"E")
        assert os.listdir(parent) == [], name


def test_a_sticky_parent_like_tmp_is_fine(tmp_path):
    """pytest's own folders live in /tmp (root's, 1777): a sticky parent someone else owns
    (root) is fine, since nobody else may rename or remove what we make in it."""
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    os.chown(sticky, 0, 0)
    with open_dir(sticky / "mine" / "snaps") as d:
        d.write("f", b"x")
    assert (sticky / "mine" / "snaps" / "f").read_bytes() == b"x"


def test_a_folder_the_user_named_for_a_file_must_be_ours_or_roots_and_not_shared(tmp_path, monkeypatch):
    """The engine cache through atomic_write: a folder another user owns (0755 or 1777) or
    that a group can write to would let them plant an engine. A sticky shared leaf is
    fine only when it is ours (not root's /tmp itself when we are not root)."""
    for mode in (0o755, 0o1777):
        folder = tmp_path / f"theirs{mode:o}"
        folder.mkdir()
        folder.chmod(mode)
        os.chown(folder, 65534, 65534)
        with pytest.raises(UnsafePathError, match="owned by uid 65534, not by this user") as raised:
            atomic_write(folder / "model.engine", b"E")
        assert raised.value.filename == str(folder) and os.listdir(folder) == []
    group = tmp_path / "m775"
    group.mkdir()
    group.chmod(0o775)
    with pytest.raises(UnsafePathError, match=r"its group can write to it \(mode 0775\) and it has no"):
        atomic_write(group / "report.json", b"{}")
    rootish = tmp_path / "root-sticky"  # like /tmp itself, seen by a user that is not root
    rootish.mkdir()
    rootish.chmod(0o1777)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(UnsafePathError, match=r"anyone can write to it \(mode 1777\) and it is not this"):
        atomic_write(rootish / "report.json", b"{}")
    assert os.listdir(group) == [] and os.listdir(rootish) == []


def test_stale_temporaries_of_another_user_are_left(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    theirs, ours = ".a.jpg.0123456789abcdef.tmp", ".b.jpg.0123456789abcdef.tmp"
    (folder / theirs).write_bytes(b"theirs")
    os.chown(folder / theirs, 65534, 65534)
    (folder / ours).write_bytes(b"ours")
    with open_dir(folder) as d:
        assert d.remove_stale() == 1
    assert os.listdir(folder) == [theirs]


# -- the modules that write through here -----------------------------------------------------


def test_the_spools_missing_parents_are_made_0700_whatever_the_umask(tmp_path):
    from edge_agent.service.uplink.spool import Spool

    with umask(0), Spool(tmp_path / "q" / "r" / "spool.db", 1000):
        pass
    assert (mode_of(tmp_path / "q"), mode_of(tmp_path / "q" / "r")) == (0o700, 0o700)


def test_the_spool_refuses_a_parent_another_user_owns(tmp_path):
    from edge_agent.service.uplink.spool import Spool, SpoolError

    (tmp_path / "theirs").mkdir(mode=0o755)
    os.chown(tmp_path / "theirs", 65534, 65534)
    with pytest.raises(SpoolError, match="owned by uid 65534"):
        Spool(tmp_path / "theirs" / "spool.db", 1000)
    assert os.listdir(tmp_path / "theirs") == []


def test_the_engine_cache_loads_nothing_from_a_folder_another_user_controls(tmp_path, caplog):
    """They could plant an engine and a sidecar that vouches for it: lookup refuses the
    folder, and in a sticky folder of ours, files someone else made are not ours to load."""
    from edge_agent.pipelines.backends.engine_cache import EngineCache, EngineKey

    key = EngineKey("a" * 64, "10.3.0", "Orin", "fp16", -1, (1, 3), True, 1024, 3)
    planted = EngineCache(tmp_path / "mine")
    planted.store("det", key, b"evil engine")
    theirs = tmp_path / "theirs"
    (tmp_path / "mine").rename(theirs)
    os.chown(theirs, 65534, 65534)
    with pytest.raises(UnsafePathError, match="owned by uid 65534"):
        EngineCache(theirs).lookup("det", key)
    sticky = tmp_path / "sticky"  # ours, but anyone may add files to it
    sticky.mkdir()
    sticky.chmod(0o1777)
    cache = EngineCache(sticky)
    cache.store("det", key, b"evil engine")
    for path in cache.paths("det", key):
        os.chown(path, 65534, 65534)
    assert cache.lookup("det", key) is None
    assert "owned by uid 65534" in caplog.text, caplog.text
    assert EngineCache(tmp_path / "missing").lookup("det", key) is None
