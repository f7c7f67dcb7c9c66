"""The kernel build's lock: a `lock` file torch's builder left behind when a process died
mid-build used to hang every later engine load; under tandem's flock it is cleared."""

from __future__ import annotations

import subprocess
import sys

from cloud_engine.kernels.cpu_build import _build_lock


def test_a_stale_torch_lock_file_is_removed(tmp_path):
    (tmp_path / "lock").write_text("")
    with _build_lock(tmp_path):
        assert not (tmp_path / "lock").exists()


def test_a_live_builder_holds_the_lock_until_it_is_done(tmp_path):
    # A second process waits on the flock rather than deleting the lock file of a build in progress.
    code = (
        "import sys, time; from pathlib import Path; from cloud_engine.kernels.cpu_build import _build_lock\n"
        "with _build_lock(Path(sys.argv[1])):\n    (Path(sys.argv[1]) / 'lock').write_text('')\n"
        "    print('held', flush=True); time.sleep(1.0)\n    (Path(sys.argv[1]) / 'lock').unlink()\n"
        "    (Path(sys.argv[1]) / 'done').write_text('')\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with _build_lock(tmp_path):  # blocks until the holder released it; its lock file is gone by then
        assert (tmp_path / "done").exists()  # entered only after the holder finished its build
    assert holder.wait(10) == 0
