"""Where a server keeps its files when no setting says: $TANDEM_DATA_DIR, else ~/.local/share/tandem
(the spend ledger, the traffic record, the stored responses)."""

from __future__ import annotations

import os


def data_path(name: str) -> str:
    """`name` in the data directory: $TANDEM_DATA_DIR/NAME, else ~/.local/share/tandem/NAME."""
    root = os.environ.get("TANDEM_DATA_DIR") or os.path.join(os.path.expanduser("~"), ".local", "share", "tandem")
    return os.path.join(root, name)
