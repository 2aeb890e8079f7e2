"""Where ddpfix finds its Ansible content and keeps its state."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ddpfix.errors import DdpfixError, ExitCode

_PKG = Path(__file__).resolve().parent


def ansible_root() -> Path:
    """Directory holding `playbooks/` and `roles/`.

    In a wheel they are shipped inside the package (`ddpfix/_ansible`); in a source
    checkout (editable install, tests) they sit at the repository root.
    """
    shipped = _PKG / "_ansible"
    if (shipped / "playbooks").is_dir():
        return shipped
    return _PKG.parent.parent


def playbook(name: str) -> Path:
    return ansible_root() / "playbooks" / name


def roles_dir() -> Path:
    return ansible_root() / "roles"


COLLECTION = ("ddpfix", "cluster")


def plugins_dir() -> Path:
    """The collection's `plugins/` (modules, module_utils, action and filter plugins)."""
    return ansible_root() / "plugins"


def collections_dir() -> Path:
    """A collections path in which `ddpfix.cluster` is this installation's content (checkout or wheel).

    The content root (`ansible_root()`) is the collection; Ansible finds it through a symlink
    `<state>/collections/<hash of the root>/ansible_collections/ddpfix/cluster`, made (or corrected) here."""
    target = ansible_root()
    private_dir(state_dir() / "collections", "collections directory")
    base = collections_base()
    link = base.joinpath("ansible_collections", *COLLECTION)
    if not (link.is_symlink() and Path(os.readlink(link)) == target):
        link.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = link.with_name(f".{link.name}.{os.getpid()}")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    return base


def collections_base() -> Path:
    """Where `collections_dir` is (nothing is made here): one directory per content root, so two installations
    (checkouts, venvs) of one user never repoint each other's link."""
    return state_dir() / "collections" / hashlib.sha256(str(ansible_root()).encode()).hexdigest()[:16]


#: A Unix socket's path: at most 107 bytes (sockaddr_un.sun_path is 108, with the closing NUL).
SOCKET_PATH_MAX = 107
#: ssh binds a new master's socket at ControlPath plus "." and 16 random characters, then renames it.
SSH_MASTER_SUFFIX = 17


def control_dir(name_length: int) -> Path:
    """A private directory for ssh control sockets whose names are `name_length` characters long: the state
    directory's cp/, or, where that path is too long for a Unix socket (a deep DDPFIX_STATE_DIR or home: ssh fails
    with "too long for Unix domain socket" and every node would read as unreachable), /tmp/ddpfix-cp-<uid>."""
    cp = state_dir() / "cp"
    if len(os.fsencode(str(cp))) + 1 + name_length + SSH_MASTER_SUFFIX > SOCKET_PATH_MAX:
        cp = Path("/tmp") / f"ddpfix-cp-{os.getuid()}"
    return private_dir(cp, "SSH control path directory")


def state_dir() -> Path:
    """Per-user state (run directories). Honours DDPFIX_STATE_DIR and XDG_STATE_HOME."""
    env = os.environ.get("DDPFIX_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "ddpfix"


def private_dir(path: Path, what: str = "state directory") -> Path:
    """`path` as a directory only the caller can enter and write (0700), or DdpfixError (exit 2) naming the path, its
    owner and mode. Missing directories up to it are created 0700 (the state directory itself, when ddpfix creates
    it); an existing `path` of the caller's own that others may read is set to 0700; an existing ancestor (a
    DDPFIX_STATE_DIR someone else made, /tmp) is never changed. Refused (`check_private`): `path` is a symlink, not
    the caller's, or writable by others (what is in it could be anyone's: Ansible's plugins under ANSIBLE_HOME, the
    run's extra vars, the SSH control sockets), or an ancestor up to a root-owned one is someone else's or writable
    by others (a sticky one, /tmp, only above a directory of the caller's own)."""
    missing = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    if missing:  # nothing is made inside a directory someone else can change
        _check_ancestors(p, path, what)
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            continue
        except OSError as exc:
            raise DdpfixError(f"{what} {d}: cannot create it: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
        os.chmod(d, 0o700)
    check_private(path, what)
    if stat.S_IMODE(os.lstat(path).st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _refusal(what: str, path: object, st: os.stat_result, why: str) -> DdpfixError:
    return DdpfixError(
        f"{what} {path}: {why} (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}); ddpfix keeps Ansible's "
        "home, run directories and SSH control sockets there, so it refuses to run: remove it, or point "
        "DDPFIX_STATE_DIR (or XDG_STATE_HOME, HOME) to a directory of yours", ExitCode.INVALID_INPUT)


def check_private(path: Path, what: str = "state directory") -> None:
    """Raise DdpfixError (exit 2) unless `path` is a directory (not a symlink) of the caller's own that no one else
    may write, below ancestors no one else can change: each, up to the first one root owns that others cannot
    write, is owned by root or the caller and not writable by others, except a sticky one (/tmp 1777: others cannot
    rename or remove what is the caller's in it)."""
    me = os.geteuid()
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise DdpfixError(f"{what} {path}: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
    if stat.S_ISLNK(st.st_mode):
        raise _refusal(what, path, st, "is a symbolic link, not a directory")
    if not stat.S_ISDIR(st.st_mode):
        raise _refusal(what, path, st, "is not a directory")
    if st.st_uid != me:
        raise _refusal(what, path, st, f"is not yours (you are uid {me})")
    if st.st_mode & 0o022:
        raise _refusal(what, path, st, "others can write it")
    _check_ancestors(Path(os.path.abspath(path)).parent, path, what)


def _check_ancestors(top: Path, path: Path, what: str) -> None:
    """`top` and its ancestors (as written and as resolved), up to the first one root owns that others cannot
    write: each owned by root or the caller and not writable by others unless sticky; a symbolic link among them
    root's or the caller's."""
    me = os.geteuid()
    for chain in ((top, *top.parents), (Path(os.path.realpath(top)), *Path(os.path.realpath(top)).parents)):
        for a in chain:
            try:
                link = os.lstat(a)
                if stat.S_ISLNK(link.st_mode) and link.st_uid not in (0, me):  # its owner may point it elsewhere
                    raise _refusal(what, path, link, f"its parent {a} is a symbolic link of another user's")
                ast = os.stat(a)
            except OSError as exc:
                raise DdpfixError(f"{what} {path}: its parent {a}: {exc.strerror}", ExitCode.INVALID_INPUT) from exc
            if ast.st_uid not in (0, me):
                raise _refusal(what, path, ast, f"its parent {a} is another user's")
            others_write = ast.st_mode & 0o022
            if others_write and not ast.st_mode & stat.S_ISVTX:
                raise _refusal(what, path, ast, f"others can write its parent {a}")
            if ast.st_uid == 0 and not others_write:
                break  # above a directory root keeps to itself, only root can change the path
