"""Waiting for a forked test child without risking a hung test run."""

from __future__ import annotations

import os
import signal
import time

import pytest


def wait_for_child(pid: int, timeout: float) -> int:
    """waitpid with a deadline: returns the child's exit code; a child that
    is still running after timeout seconds (hung calling into Go) is killed
    and the test fails, rather than the whole run hanging."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"forked child {pid} still running after {timeout}s: it hung calling into Go")
