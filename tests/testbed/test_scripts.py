"""The test bed's scripts fail as one clear error (exit 2), not a traceback, and prepare what they need."""

from __future__ import annotations

import os
import subprocess

import pytest

from sglfleet.pipeline.errors import EXIT_USAGE, PipelineError
from testbed import REPO_ROOT
from testbed.testbed import ScriptError, run_script

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="scripts/testhosts.sh needs root (ip netns)")


def test_a_failing_script_is_one_pipeline_error_with_exit_2():
    with pytest.raises(ScriptError) as err:
        run_script("services.sh", "start", "nosuch")
    assert isinstance(err.value, PipelineError)
    assert err.value.exit_code == EXIT_USAGE
    assert "scripts/services.sh start exited" in str(err.value)


def test_unchecked_script_returns_its_exit_code():
    proc = run_script("services.sh", "start", "nosuch", check=False)
    assert proc.returncode != 0


@needs_root
def test_testhosts_start_checks_n_after_preparing_its_packages(tmp_path):
    # need_pkgs runs first: sshd is installed when missing (make demo on a fresh machine), then N is checked
    proc = subprocess.run(["bash", "scripts/testhosts.sh", "start", "0", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, env={**os.environ, "TESTHOSTS_PREFIX": "zq"})
    assert proc.returncode == 2, proc.stderr
    assert "N must be 1..64" in proc.stderr
    assert os.access("/usr/sbin/sshd", os.X_OK)
    assert not list(tmp_path.iterdir())  # nothing made for a refused start


@needs_root
def test_testhosts_stop_needs_no_sshd(tmp_path):
    proc = subprocess.run(["bash", "scripts/testhosts.sh", "stop", str(tmp_path)], cwd=REPO_ROOT,
                          capture_output=True, text=True, env={**os.environ, "TESTHOSTS_PREFIX": "zq"})
    assert proc.returncode == 0, proc.stderr
