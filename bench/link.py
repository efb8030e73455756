"""Python side of the shaped two-namespace link (bench/link.sh does the work).

The driver uses `shaped_link()` to bring the link up and guarantee it comes
down again, whatever ends the run (exception, Ctrl-C, SIGTERM, SIGHUP).
Workers running inside a namespace use `qdisc_counters()` on their own end
to prove that their gradients really crossed the shaped link.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

LINK_SCRIPT = Path(__file__).with_name("link.sh")


@dataclass(frozen=True)
class LinkNames:
    namespaces: tuple[str, str]
    devices: tuple[str, str]
    addresses: tuple[str, str]


def _link(*args: str) -> str:
    return subprocess.run(
        [str(LINK_SCRIPT), *args], check=True, capture_output=True, text=True
    ).stdout


def names() -> LinkNames:
    raw = json.loads(_link("names"))
    return LinkNames(*(tuple(raw[k]) for k in ("namespaces", "devices", "addresses")))


def set_rate(rate: str) -> None:
    _link("rate", rate)


def _raise_on_signal(signum, _frame):
    # Turn a polite kill into an exception so that `finally` blocks run and
    # the namespaces (and the workers we started) are cleaned up.
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def shaped_link(rate: str):
    """Bring the link up at `rate` and take it down on any exit."""
    previous = {s: signal.signal(s, _raise_on_signal) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        _link("up", rate)
        yield names()
    finally:
        try:
            _link("down")
        except subprocess.CalledProcessError as err:  # pragma: no cover - best effort
            print(f"warning: link teardown failed: {err.stderr}", file=sys.stderr)
        for s, handler in previous.items():
            signal.signal(s, handler)


def parse_qdisc_json(text: str) -> dict:
    """Byte, packet and drop counters of the root qdisc from `tc -j -s`."""
    for entry in json.loads(text):
        if entry.get("root"):
            return {
                "kind": entry.get("kind"),
                "rate_bytes_per_s": entry.get("options", {}).get("rate"),
                "bytes": int(entry.get("bytes", 0)),
                "packets": int(entry.get("packets", 0)),
                "drops": int(entry.get("drops", 0)),
            }
    raise ValueError(f"no root qdisc in {text!r}")


def qdisc_counters(device: str) -> dict:
    """Counters of the root qdisc of `device` in the caller's own namespace."""
    out = subprocess.run(
        ["tc", "-j", "-s", "qdisc", "show", "dev", device],
        check=True, capture_output=True, text=True,
    ).stdout
    counters = parse_qdisc_json(out)
    # The interface counter is a cross-check: it also counts bytes that
    # bypass the qdisc, which should be none.
    stat = Path(f"/sys/class/net/{device}/statistics/tx_bytes")
    counters["iface_tx_bytes"] = int(stat.read_text()) if stat.exists() else None
    return counters


def in_namespace(end: int, argv: list[str], link: LinkNames) -> list[str]:
    """Wrap `argv` so that it runs inside namespace `end` of the link."""
    return ["ip", "netns", "exec", link.namespaces[end], *argv]


def current_device() -> str | None:
    """The link device a worker was told to use, if any."""
    return os.environ.get("GLOO_SOCKET_IFNAME")
