"""A second connection to the state store in the same process (recovery's worker thread) must
not cost the first its locks: POSIX locks belong to the process, so the store never opens the
database file by other means once SQLite holds it (`AlertStore.connect_again`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobdiagd.alerts.store import DB_NAME, AlertStore


def _keys_seen_elsewhere(path: Path) -> list[str]:
    """What another process reads, then closes (as `jobdiagd nodes` does beside the daemon)."""
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]);"
        " print(' '.join(k for (k,) in c.execute('SELECT key FROM meta ORDER BY key'))); c.close()"
    )
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_a_reader_elsewhere_never_takes_itself_for_the_last_connection(tmp_path: Path) -> None:
    store = AlertStore.in_state_dir(tmp_path)
    with store.transaction() as c:
        c.execute("INSERT INTO meta (key, value) VALUES ('before', '1')")
    worker = store.connect_again()
    path = tmp_path / DB_NAME
    assert _keys_seen_elsewhere(path) == ["before", "schema_version"]
    # The reader's close left the live WAL alone: what is written next is seen by everyone.
    assert Path(f"{path}-wal").exists()
    with worker.transaction() as c:
        c.execute("INSERT INTO meta (key, value) VALUES ('after', '2')")
    assert _keys_seen_elsewhere(path) == ["after", "before", "schema_version"]
    assert [r[0] for r in store.conn.execute("SELECT key FROM meta WHERE key = 'after'")] == ["after"]
    worker.close()
    store.close()
