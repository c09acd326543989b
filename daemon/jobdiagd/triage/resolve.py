"""Job resolution (runbook step 1): a job dir, a .log file, a Slurm id or a k8s/local id -> files.

Rules: a job directory holds a `log` symlink (to `../<dirname>.log`, or to a renamed
`<stem>-<N>N-TGS_<v>.log`); a `.log` file's job directory is its sibling without `.log`
(or the sibling whose `log` link points at it); ids are looked up as `<id>-*` under the
outputs roots. Directories without a `log` link are shared checkpoint dirs — skipped,
except an *empty* one with no `.log` sibling, which is the `prolog-kill-no-log` case.

Which files of a job may be read (`job_access`, decided here): those inside the job's outputs
root — the directory holding the job dir (or the log given) — or another root the caller
names, and owned by the job's user: its Slurm user when known, else the owner of the job
directory (the batch script creates both). A link out of the roots (`log -> /etc/shadow`) or
to another user's file is refused by `logs.safeopen`, never read.

A `.log` name longer than the filesystem allows (a job name near the 255-byte limit) cannot
exist: it is treated as missing (rule RES-4: `prolog-kill-no-log`, "--output path exceeds
ext4's 255-byte per-path-segment limit"), with a note saying so, never a traceback.
"""

from __future__ import annotations

import errno
import os
import pwd
import re
from collections.abc import Callable, Iterable
from pathlib import Path

from jobdiagd.logs.safeopen import LogAccess, kind_of
from jobdiagd.model.jobref import JobRef

_SLURM_NAME = re.compile(r"^(\d+)-(.+)$")
_K8S_NAME = re.compile(r"^(k8s[-_]\d{8}[-_]\d{6}[-_][0-9A-Za-z]+)-(.+)$")
_LOCAL_NAME = re.compile(r"^(local[-_]\d{8}[-_]\d{6}[-_][0-9A-Za-z]+)-(.+)$")
_RENAMED = re.compile(r"^(.*?)-\d+N-TGS_[\d.]+$")
# ASCII digits only (`\d` is any Unicode digit) and no final newline (`$` allows one): an id
# is also a file-name pattern and an argument of scancel.
JOB_ID_RE = re.compile(
    r"^(?:\d{1,12}|k8s[-_]\d{8}[-_]\d{6}[-_][0-9A-Za-z]{1,16}|local[-_]\d{8}[-_]\d{6}[-_][0-9A-Za-z]{1,16})\Z",
    re.ASCII,
)


class ResolveError(Exception):
    """The input does not name a usable job (message is one line for the user)."""


def parse_dirname(name: str) -> tuple[str | None, str | None, str]:
    """`12345-JAX-llama` -> ("12345", "JAX-llama", "slurm")."""
    for rx, platform in ((_K8S_NAME, "k8s"), (_LOCAL_NAME, "local"), (_SLURM_NAME, "slurm")):
        m = rx.match(name)
        if m:
            return m.group(1), m.group(2), platform
    return None, name or None, "local"


def _name_too_long(p: Path, test: Callable[[Path], bool]) -> bool | None:
    """`test(p)`, or None when `p`'s name is longer than the filesystem allows (Path.exists and
    friends raise ENAMETOOLONG instead of answering False: such a file cannot exist)."""
    try:
        return test(p)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            return None
        raise


def _too_long_note(name: str) -> str:
    n = len(os.fsencode(name))
    return (
        f"The log's name ({n} bytes, `{name[:48]}…`) is longer than the filesystem allows for a "
        "file name (255 bytes on ext4): Slurm could not create it. Shorten JOB_NAME / the passthrough "
        "arguments in the job name."
    )


def _ref_for_dir(d: Path) -> JobRef:
    job_id, name, platform = parse_dirname(d.name)
    if platform == "local" and any(d.glob("rank-*.log")):
        platform = "k8s"
    link = d / "log"
    if link.is_symlink() or link.is_file():
        try:
            target = link.resolve(strict=False) if link.is_symlink() else link
        except (RuntimeError, OSError) as exc:  # a symlink loop
            raise ResolveError(f"{link}: cannot follow the `log` link ({exc})") from exc
        if _name_too_long(target, Path.is_dir):
            raise ResolveError(f"{link}: the `log` link points to a directory ({target}), not a log file")
        exists = _name_too_long(target, Path.exists)
        if not exists:
            sibling = d.parent / f"{d.name}.log"
            found = _name_too_long(sibling, Path.exists)
            if found:
                target = sibling
            else:
                too_long = target.name if exists is None else sibling.name if found is None else None
                note = _too_long_note(too_long) if too_long else None
                return JobRef(job_id, name, d, None, platform, "prolog-kill-no-log", note)
        return JobRef(job_id, name, d, target, platform)
    sibling = d.parent / f"{d.name}.log"
    found = _name_too_long(sibling, Path.exists)
    if found:
        return JobRef(job_id, name, d, sibling, platform)
    if not any(d.iterdir()):
        note = _too_long_note(sibling.name) if found is None else None
        return JobRef(job_id, name, d, None, platform, "prolog-kill-no-log", note)
    raise ResolveError(f"{d}: not a job directory (no `log` link; a shared checkpoint directory?)")


def _ref_for_log(f: Path) -> JobRef:
    stem = f.name[: -len(".log")] if f.name.endswith(".log") else f.stem
    d = f.parent / stem
    if d.is_dir():
        job_id, name, platform = parse_dirname(stem)
        return JobRef(job_id, name, d, f, "k8s" if any(d.glob("rank-*.log")) else platform)
    # Renamed by the tagger: find the directory whose `log` link points here.
    real = f.resolve()
    for cand in f.parent.iterdir():
        link = cand / "log"
        if cand.is_dir() and link.is_symlink():
            try:
                if link.resolve() == real:
                    job_id, name, platform = parse_dirname(cand.name)
                    return JobRef(job_id, name, cand, f, platform)
            except OSError:
                continue
    m = _RENAMED.match(stem)
    base = m.group(1) if m else stem
    job_id, name, platform = parse_dirname(base)
    d2 = f.parent / base
    return JobRef(job_id, name, d2 if d2.is_dir() else None, f, platform)


def resolve(target: str, outputs_roots: list[Path]) -> JobRef:
    p = Path(target)
    is_dir = _name_too_long(p, Path.is_dir)
    if is_dir is None:
        raise ResolveError(f"{target}: a name in this path is longer than the filesystem allows")
    if is_dir:
        return _ref_for_dir(p)
    if _name_too_long(p, Path.is_file):
        return _ref_for_log(p)
    try:
        mode = p.stat().st_mode
    except OSError:
        mode = None
    if mode is not None:
        raise ResolveError(f"{target}: {kind_of(mode)}, not a job directory or log file")
    if JOB_ID_RE.match(target):
        for root in outputs_roots:
            if not root.is_dir():
                continue
            dirs = sorted(d for d in root.glob(f"{target}-*") if d.is_dir())
            for d in dirs:
                try:
                    return _ref_for_dir(d)
                except ResolveError:
                    continue
            logs = sorted(root.glob(f"{target}-*.log"))
            if logs:
                return _ref_for_log(logs[0])
        roots = ", ".join(str(r) for r in outputs_roots) or "(no outputs root; use --outputs)"
        raise ResolveError(f"job {target}: no {target}-* directory or log under {roots}")
    raise ResolveError(f"{target}: no such file, directory or job id")


def _is_job_name(name: str) -> bool:
    return any(rx.match(name) for rx in (_K8S_NAME, _LOCAL_NAME, _SLURM_NAME))


def list_jobs(root: Path) -> list[JobRef]:
    """Every job under an outputs root (`--all`): dirs with a `log` link, and prolog-kill empties."""
    if not root.is_dir():
        raise ResolveError(f"{root}: not a directory")
    refs: list[JobRef] = []
    for d in sorted(root.iterdir()):
        if not d.is_dir() or d.name.startswith("."):
            continue
        try:
            if not (d / "log").is_symlink() and (any(d.iterdir()) or not _is_job_name(d.name)):
                # runbook: no `log` link = shared checkpoint dir, not a job; an empty dir is a
                # prolog kill only when it is named like a job (`<id>-<name>`)
                continue
            refs.append(_ref_for_dir(d))
        except ResolveError:
            continue  # shared checkpoint dir
        except OSError:
            continue
    return refs


def user_uid(user: str | None) -> int | None:
    """The uid of a Slurm user name (or a numeric uid); None when this host does not know it."""
    if not user:
        return None
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def job_access(ref: JobRef, roots: Iterable[Path] = (), slurm_user: str | None = None) -> LogAccess:
    """Where the logs of `ref` may be and whom they must belong to (see the module docstring)."""
    allowed = list(roots)
    home = ref.job_dir if ref.job_dir is not None else ref.log
    if home is not None:
        allowed.append(Path(os.path.abspath(home)).parent)
    uid = user_uid(slurm_user)
    if uid is not None:
        return LogAccess.within(allowed, uid, f"uid {uid} ({slurm_user}, the job's Slurm user)")
    if ref.job_dir is not None:
        try:
            uid = os.lstat(ref.job_dir).st_uid
        except OSError:
            uid = None
        if uid is not None:
            return LogAccess.within(allowed, uid, f"uid {uid} (the owner of the job directory)")
    return LogAccess.within(allowed)
