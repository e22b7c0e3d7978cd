"""One run at a time per output folder: ``hold_folder`` (``eval --out``, the synthesis recipes' ``--out``,
``train``'s ``out_dir``).

Two runs writing one folder clash: both resume from the same files and write the same names (two evals logged
every utterance twice, and every later run refused the log; two synthesis runs took each other's half-written
temporary files). The run that holds ``FOLDER/.lock`` writes; another stops at once with one line (exit 2). The lock
is the kernel's (``flock``): it goes with the process that holds it, however that process ends, so a killed run
leaves nothing to clean up. On a file system that takes no locks the run goes on unlocked, with a note.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from speechstream.errors import InputError

LOCK_FILE = ".lock"  # FOLDER/.lock: held by the run writing FOLDER; names its process
# flock's errors on a file system that takes no locks (a cluster's Lustre mounted without flock, some NFS setups):
# the run goes on unlocked, with a note, rather than not at all
UNLOCKABLE = {errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


@contextmanager
def hold_folder(folder: Path, setting: str = "--out") -> Iterator[None]:
    """Hold ``folder/.lock`` (an existing folder) while the block runs; InputError when another run holds it (it
    names ``setting``, what gives the folder)."""
    path = Path(folder) / LOCK_FILE
    try:
        handle = path.open("a+", encoding="utf-8")
    except OSError as error:
        raise InputError(f"{path}: cannot open the lock file ({error.strerror or error})") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()
            raise InputError(f"{folder} is being written by another run{f' ({holder})' if holder else ''}: wait "
                             f"for it to finish, or use another {setting}") from None
        except OSError as error:
            if error.errno not in UNLOCKABLE:
                raise
            print(f"speechstream: note: {folder} is on a file system without locks ({error.strerror}): nothing "
                  "stops a second run writing it at the same time", file=sys.stderr)
        else:
            handle.seek(0)
            handle.truncate()
            handle.write(f"pid {os.getpid()}\n")
            handle.flush()
        yield
