"""Files only the daemon's user may touch: a 0700 state dir, 0600 files, symlinks never followed.

Rules (issue 7, defect 5), whatever the umask:
- The state dir is created 0700. An existing one must be a directory owned by the daemon's
  user and not writable by group or others (another user could plant files or links in it);
  read/search bits for others are taken away. The dir path may itself be a symlink (admins move
  state to another disk) only when the link is owned by the daemon's user or root.
- Files in it are created 0600 and opened with O_NOFOLLOW. An existing file must be a regular
  file (not a symlink) owned by the daemon's user and not writable by group or others; looser
  read bits are taken away. A file that breaks a rule is refused with one line saying why and
  what to do, never repaired by deleting it: someone may have tampered with it.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


class UnsafePathError(Exception):
    """A state path the daemon refuses to use; the message is one line naming the path and the fix."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _check_owner_and_mode(path: Path, st: os.stat_result, what: str) -> None:
    me = os.geteuid()
    if st.st_uid != me:
        raise UnsafePathError(
            f"{what} {path} is owned by {_owner(st.st_uid)}, not by the daemon's user {_owner(me)}: "
            "refusing to use it (its owner could read or replace what the daemon writes there)"
        )
    if st.st_mode & 0o022:
        raise UnsafePathError(
            f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
            f"refusing to use it; check its contents, then chmod go-w it"
        )


def ensure_private_dir(path: str | Path) -> Path:
    """Create `path` 0700 (parents as needed), or check an existing one; raises UnsafePathError."""
    p = Path(path)
    try:
        lst = os.lstat(p)
    except FileNotFoundError:
        try:
            p.mkdir(parents=True, mode=DIR_MODE)
        except FileExistsError:
            pass  # created concurrently: checked below like any existing one
        except OSError as exc:
            raise UnsafePathError(f"state dir {p}: cannot create it: {exc.strerror or exc}") from exc
        else:
            _chmod(p, DIR_MODE, "state dir", follow=False)  # mkdir's mode is filtered by the umask
            return p
        lst = os.lstat(p)
    except OSError as exc:
        raise UnsafePathError(f"state dir {p}: cannot inspect it: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(lst.st_mode) and lst.st_uid not in (os.geteuid(), 0):
        raise UnsafePathError(
            f"state dir {p} is a symlink owned by {_owner(lst.st_uid)}: refusing to follow it "
            "(its owner could point it anywhere)"
        )
    try:
        st = os.stat(p)
    except OSError as exc:
        raise UnsafePathError(f"state dir {p}: cannot inspect it: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"state dir {p} is not a directory: point [daemon] state_dir at a directory")
    _check_owner_and_mode(p, st, "state dir")
    if not os.access(p, os.R_OK | os.W_OK | os.X_OK):
        raise UnsafePathError(f"state dir {p} is not readable and writable by the daemon's user")
    if stat.S_IMODE(st.st_mode) != DIR_MODE:
        _chmod(p, DIR_MODE, "state dir", follow=True)  # the dir may be an admin's link to it
    return p


def _chmod(path: Path, mode: int, what: str, *, follow: bool) -> None:
    try:
        os.chmod(path, mode, follow_symlinks=follow)
    except OSError as exc:
        raise UnsafePathError(f"{what} {path}: cannot make it {mode:04o}: {exc.strerror or exc}") from exc


def check_private_file(path: str | Path, what: str = "state file") -> bool:
    """Check an existing file against the rules (False: it does not exist); raises UnsafePathError."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise UnsafePathError(f"{what} {p}: cannot inspect it: {exc.strerror or exc}") from exc
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePathError(
            f"{what} {p} is a symbolic link (to {os.readlink(p)!r}): refusing to follow it; remove it"
        )
    if not stat.S_ISREG(st.st_mode):
        raise UnsafePathError(f"{what} {p} is not a regular file: refusing to use it; remove it")
    _check_owner_and_mode(p, st, what)
    if stat.S_IMODE(st.st_mode) & 0o077:
        _chmod(p, FILE_MODE, what, follow=False)
    return True


def check_private_parent(path: str | Path, what: str) -> None:
    """The folder of a file outside the state dir: nobody else may create or swap entries in it."""
    parent = Path(path).parent
    try:
        st = os.stat(parent)
    except FileNotFoundError:
        return  # created 0700 on first write
    except OSError as exc:
        raise UnsafePathError(f"{what} {path}: cannot inspect its folder: {exc.strerror or exc}") from exc
    if st.st_uid not in (os.geteuid(), 0):
        raise UnsafePathError(
            f"{what} {path}: its folder is owned by {_owner(st.st_uid)}: refusing to write there"
        )
    if st.st_mode & 0o022:
        raise UnsafePathError(
            f"{what} {path}: its folder is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): refusing to write there (another user could swap the file)"
        )


def open_private(path: str | Path, flags: int, what: str = "state file") -> int:
    """os.open with O_NOFOLLOW, mode 0600 if created; the opened file is checked like
    `check_private_file` (on the descriptor, so nothing can be swapped in between)."""
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, FILE_MODE)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePathError(f"{what} {path} is not a regular file: refusing to use it")
        _check_owner_and_mode(Path(path), st, what)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, FILE_MODE)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class StateDirInUse(UnsafePathError):
    """Another process holds the state dir's lock (two daemons on one store would page twice)."""


LOCK_NAME = "jobdiagd.lock"


def lock_state_dir(state_dir: str | Path) -> int:
    """Take the state dir's exclusive lock for the life of the process; returns the lock's fd.

    The lock is an flock on `jobdiagd.lock` (released by the kernel when the process dies, so a
    killed daemon never leaves a stale lock); the file holds the owner's pid for the message.
    """
    path = Path(state_dir) / LOCK_NAME
    check_private_file(path, "lock file")
    try:
        fd = open_private(path, os.O_RDWR | os.O_CREAT, "lock file")
    except OSError as exc:
        raise UnsafePathError(f"lock file {path}: cannot open it: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
        os.close(fd)
        raise StateDirInUse(
            f"state dir {state_dir} is in use by another jobdiagd (pid {holder}): "
            "stop it, or give this one its own [daemon] state_dir"
        ) from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # a full disk: the pid is only for the message above, the lock is what counts
    return fd
