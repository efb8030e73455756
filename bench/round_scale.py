"""What one agreement round costs as the group grows: N simulated ranks.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.round_scale [--ranks 8 16 ... 1024] [--repeat 3] [--differ 0]

Each rank is a thread with its own TCPStore client to one TCPStore server
in this process (as torchrun's ranks each talk to the one server on its
host), and runs one round of goddp.measure.plan_exchange, the plan check's
exchange at a DDP module's first training step, with its typical statement.
Each client counts its calls and the bytes the server sent back. Prints per
N the round's wall time (first start to last return: median, min and max
over --repeat rounds), store calls per rank and bytes read per rank (median
and max over ranks, from the last round), and what went through the server
in all. --differ K: K ranks state another plan fingerprint, so their
statements differ from the others'. The round's time includes every
thread's own Python work, on this machine's cores: what one server sees
from N ranks on other hosts is the calls and bytes.

docs/ranks-scale.md holds the tables this printed, for goddp's round and
for the one before it (run with PYTHONPATH pointing at another checkout's
python/ to measure that one: the first line says which goddp ran).
"""

from __future__ import annotations

import argparse
import collections
import inspect
import statistics
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch.distributed as dist

from goddp.measure import plan_exchange

DEFAULT_RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]


class CountingStore:
    """A store client that counts its calls and the bytes it gets back."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self.calls: collections.Counter[str] = collections.Counter()
        self.bytes_read = 0

    def reset(self) -> None:
        self.calls.clear()
        self.bytes_read = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)
        if not callable(method):
            return method

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            value = method(*args, **kwargs)
            self.bytes_read += _size(value)
            return value

        return counted


def _size(value: Any) -> int:
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    if isinstance(value, int):
        return 8  # a counter's value (add) or a check's answer
    return 0


def _all_at_once(work: Callable[[int, threading.Barrier], None], n: int) -> float:
    """Runs work(i, ready) in n threads; each calls ready.wait() once set
    up. Returns the time from the moment all are ready until the last
    one ends."""
    ready = threading.Barrier(n + 1)
    threads = [threading.Thread(target=work, args=(i, ready), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    started = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def one_round(stores: list[CountingStore], key: str, timeout_s: float, differ: int) -> float:
    """Runs one round among len(stores) ranks; returns its wall time."""
    n = len(stores)
    errors: list[BaseException] = []

    def rank(r: int, ready: threading.Barrier) -> None:
        # (only when asked: an older goddp's plan_exchange has no fingerprint)
        other = {"fingerprint": 0x0FF0_0000_0000_0000 + r} if r >= n - differ else {}
        exchange = plan_exchange(stores[r], key, r, range(n), timeout_s, **other)
        stores[r].reset()
        ready.wait()
        try:
            said = exchange()
            assert len(said) == n, f"rank {r} read {len(said)} statements of {n}"
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    took = _all_at_once(rank, n)
    if errors:
        raise RuntimeError(f"{len(errors)} rank(s) failed; first: {errors[0]!r}")
    return took


def server_rate(clients: list[CountingStore], calls: int, value: bytes) -> dict[str, float]:
    """Calls per second the one server answered, by kind, with every
    client calling at once (an `add`, a `get` of value): what bounds the
    server's serial work per call from above (the clients share this
    machine's cores with it)."""
    clients[0].set("bench/rate", value)
    rates = {}
    for kind, call in (("add", lambda s: s.add("bench/rate/n", 1)), ("get", lambda s: s.get("bench/rate"))):

        def loop(i: int, ready: threading.Barrier) -> None:
            ready.wait()
            for _ in range(calls):
                call(clients[i])

        rates[kind] = len(clients) * calls / _all_at_once(loop, len(clients))
    return rates


def kib(b: float) -> str:
    return f"{b / 1024:.1f} KiB" if b < 1024 * 1024 else f"{b / 2**20:.2f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="*", default=DEFAULT_RANKS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--differ", type=int, default=0, help="ranks whose statement differs")
    parser.add_argument("--timeout", type=float, default=900.0, help="the round's bound (s)")
    parser.add_argument("--server-rate", type=int, default=0, metavar="CALLS",
                        help="then: CALLS calls from each of 64 clients at once, the server's calls per second")
    args = parser.parse_args()
    print(f"goddp: {inspect.getsourcefile(plan_exchange)}", flush=True)
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    clients: list[CountingStore] = []
    header = ("ranks", "round (median)", "min-max", "calls/rank (median, max)", "bytes read/rank (median, max)",
              "calls through the server", "read through the server")
    print(" | ".join(header), flush=True)
    for n in args.ranks:
        while len(clients) < n:
            clients.append(CountingStore(dist.TCPStore("127.0.0.1", server.port, is_master=False,
                                                       timeout=timedelta(seconds=600))))
        stores = clients[:n]
        times = [one_round(stores, f"bench/{n}/{rep}", args.timeout, min(args.differ, n)) for rep in range(args.repeat)]
        calls = sorted(sum(s.calls.values()) for s in stores)
        read = sorted(s.bytes_read for s in stores)
        print(" | ".join([
            str(n), f"{statistics.median(times):.3f} s", f"{min(times):.3f}-{max(times):.3f} s",
            f"{statistics.median(calls):.0f}, {calls[-1]}", f"{kib(statistics.median(read))}, {kib(read[-1])}",
            f"{sum(calls)}", kib(sum(read)),
        ]), flush=True)
    kinds: collections.Counter[str] = collections.Counter()
    for s in clients[: args.ranks[-1]]:
        kinds.update(s.calls)
    print(f"calls by kind at {args.ranks[-1]} ranks (last round): {dict(sorted(kinds.items()))}")
    if args.server_rate:
        # a get the size of the reference: the typical statement and its digest
        rates = server_rate(clients[:64], args.server_rate, b"x" * 450)
        print("server: " + ", ".join(f"{k} {v:,.0f} calls/s ({1e6 / v:.1f} us each)" for k, v in rates.items()))


if __name__ == "__main__":
    main()
