"""Opening job logs safely: regular files only, never blocking, inside the allowed roots, owned by the job's user.

Every log the daemon or `jobdiagd triage` reads (a job's main log, Ray worker logs, k8s rank
logs) is opened through a `LogAccess`, because the paths come from users: anyone who can write
in an outputs root can put a FIFO, a socket, a device or a symlink to `/etc/shadow` where a log
is expected, and the reader may be root.

Rules (decided here):
- Only regular files are read. The path is `lstat`ed first (a device is never opened, as opening
  one can have side effects), then opened with `O_NONBLOCK | O_NOCTTY` (a FIFO swapped in
  meanwhile cannot block the open) and `fstat`ed: anything but a regular file is refused. Reads
  of a regular file never block on a writer, so neither the event loop nor its thread pool waits
  on a log.
- Containment: with `roots`, the path is resolved (`realpath`) and must lie inside one of them
  (themselves resolved); then it is opened component by component from the root with
  `O_NOFOLLOW`, so a directory or the file swapped for a symlink between the check and the open
  fails the open instead of escaping. Links inside the roots are followed (the TGS tagger's
  `log -> ../<stem>-<N>N-TGS_<v>.log` keeps working).
- Ownership: with `owner`, the opened file must belong to that uid (the job's Slurm user, or
  the owner of the job directory where Slurm does not say). This also refuses hard links to
  other users' files, which no path check can see.
- A refusal is a `RefusedFile` (an `OSError`, so every caller's existing "cannot read this file"
  handling applies) whose message names the rule and the resolved path, never file content.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class RefusedFile(OSError):
    """A log path that is deliberately not read; `strerror` says why (no file content)."""

    def __init__(self, reason: str, code: int = errno.EPERM) -> None:
        super().__init__(code, reason)


def kind_of(mode: int) -> str:
    """`a FIFO`, `a directory`, ... for a refusal message."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _require_regular(st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        name = kind_of(st.st_mode)
        raise RefusedFile(f"not a regular file ({name})" if name.startswith("a ") else name)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class LogAccess:
    """Which log files may be read. The default refuses only what is not a regular file."""

    roots: tuple[str, ...] | None = None  # resolved directories; None: anywhere
    owner: int | None = None  # uid every log must belong to; None: anyone
    owner_label: str = ""  # who `owner` is, for messages ("uid 1000 (alice, the job's Slurm user)")

    @classmethod
    def within(
        cls, roots: Iterable[str | os.PathLike[str]], owner: int | None = None, owner_label: str = ""
    ) -> LogAccess:
        real = tuple(dict.fromkeys(os.path.realpath(r) for r in roots))
        return cls(real, owner, owner_label or (f"uid {owner}" if owner is not None else ""))

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """The file `path` names (links followed); RefusedFile when it leaves the roots."""
        real = os.path.realpath(path)
        if self.roots is not None and not any(_inside(real, r) for r in self.roots):
            where = ", ".join(self.roots) or "(none configured)"
            raise RefusedFile(f"resolves to {real}, outside the allowed log roots ({where})", errno.EACCES)
        return Path(real)

    def open(self, path: str | os.PathLike[str], *, resolved: bool = False) -> int:
        """A read-only descriptor of the regular file `path` names, checked; the caller closes it.

        `resolved`: `path` is already the result of `resolve` (no realpath again; a link that
        appeared in it since fails the no-follow walk instead)."""
        real = self.resolve(path) if not resolved else Path(path)
        if resolved and self.roots is not None and not any(_inside(str(real), r) for r in self.roots):
            real = self.resolve(path)  # not a resolved path after all: the full check refuses it
        fd = self._open_beneath(str(real)) if self.roots is not None else self._open_plain(str(real))
        try:
            st = os.fstat(fd)
            _require_regular(st)
            if self.owner is not None and st.st_uid != self.owner:
                raise RefusedFile(f"owned by uid {st.st_uid}, not by {self.owner_label}", errno.EACCES)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _open_plain(real: str) -> int:
        _require_regular(os.stat(real))
        return os.open(real, _FILE_FLAGS)

    def _open_beneath(self, real: str) -> int:
        """Walk from the containing root to `real` without following any link (openat2's
        RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, which Python does not expose)."""
        assert self.roots is not None
        root = max((r for r in self.roots if _inside(real, r)), key=len)
        parts = [p for p in real[len(root) :].split("/") if p]
        if not parts:
            raise RefusedFile("not a regular file (a directory)")
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for part in parts[:-1]:
                nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
            _require_regular(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False))
            return os.open(parts[-1], _FILE_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
        finally:
            os.close(fd)


ANYWHERE = LogAccess()
