"""The Python client beside the Rust client, in one run: try_send/try_recv pair cost, round trips, 64 KiB streams and bulk streams (64 KiB, 1 MiB, 16 MiB).

Host <-> host (any machine):

    cargo build --release -p mesh-py --example peer
    (cd crates/mesh-py && maturin build --release -o /tmp/wheels) && pip install /tmp/wheels/meshd-*.whl
    python3 crates/mesh-py/bench/bench.py

Host <-> GPU (a machine with meshd and a GPU; round trips through the echo program, 8 to 256 bytes,
and bulk streams host -> bulk_echo -> host at 64 KiB, 1 MiB and 16 MiB):

    python3 bench.py --gpu --meshd bin/meshd --echo programs/echo.ptx --bulk-echo programs/bulk_echo.ptx --peer bin/peer

(in a GPU bundle, whose ./run builds programs/*.ptx; in the repository `cargo xtask ptx` builds them into
target/programs, the default of --echo).

`--bulk-only` runs only the bulk tables (host <-> host, or with --gpu through bulk_echo).

Prints Markdown tables. The Rust side of every row is the peer (crates/mesh-py/examples/peer.rs)
doing the same thing with mesh-shm's API; each figure is one run (no loops of runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import meshd

SIZES = [8, 64, 256, 4096, 65536]
GPU_SIZES = [8, 64, 256]
STREAM_SIZE = 65536
STREAM_COUNT = 20_000
#: Bulk streams: size -> (ring capacity, messages per row: about 1-2 GB each).
BULK = {64 << 10: (8, 20_000), 1 << 20: (4, 2_000), 16 << 20: (2, 120)}


def run(peer: Path, *args: object) -> dict[str, str]:
    out = subprocess.run([str(peer), *map(str, args)], capture_output=True, text=True, timeout=600, check=True)
    return dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)


def start(peer: Path, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([str(peer), *map(str, args)], stdout=subprocess.PIPE, text=True)


def finish(child: subprocess.Popen[str]) -> dict[str, str]:
    out, _ = child.communicate(timeout=600)
    if child.returncode != 0:
        sys.exit(f"peer failed ({child.returncode}): {out}")
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def python_pair(mb: meshd.Mailbox, channel: str, count: int) -> tuple[float, float]:
    """ns per try_send + try_recv_into pair, and per try_send + try_recv (a new bytes each)."""
    with mb.producer(channel) as tx, mb.consumer(channel) as rx:
        msg = bytes(tx.msg_size)
        out = bytearray(tx.msg_size)
        send, recv_into, recv = tx.try_send, rx.try_recv_into, rx.try_recv
        t = time.perf_counter_ns()
        for _ in range(count):
            send(msg)
            recv_into(out)
        into = (time.perf_counter_ns() - t) / count
        t = time.perf_counter_ns()
        for _ in range(count):
            send(msg)
            recv()
        fresh = (time.perf_counter_ns() - t) / count
    return into, fresh


def python_ping(mb: meshd.Mailbox, out: str, back: str, count: int) -> tuple[float, float]:
    """Median and p99 round trip in ns (1,000 warm-up round trips first), the answer checked."""
    with mb.producer(out) as tx, mb.consumer(back) as rx:
        msg = np.zeros(tx.msg_size // 8, dtype=np.uint64)
        got = np.empty_like(msg)
        send, recv_into = tx.try_send, rx.try_recv_into
        rtt = []
        for i in range(1000 + count):
            msg[0] = i
            t = time.perf_counter_ns()
            while not send(msg):
                pass
            while not recv_into(got):
                pass
            if i >= 1000:
                rtt.append(time.perf_counter_ns() - t)
            if got[0] != i:
                sys.exit(f"round trip {i}: the answer differs")
    rtt.sort()
    return float(rtt[len(rtt) // 2]), float(rtt[len(rtt) * 99 // 100])


def python_stream_out(mb: meshd.Mailbox, channel: str, count: int) -> None:
    with mb.producer(channel) as tx:
        msg = np.zeros(tx.msg_size // 8, dtype=np.uint64)
        for i in range(count):
            msg[0] = i
            tx.send(msg, timeout=60)


def python_stream_in(mb: meshd.Mailbox, channel: str, count: int) -> float:
    """Seconds from the first message to the last, each message's number checked (as the peer's --first-word)."""
    with mb.consumer(channel) as rx:
        buf = np.empty(rx.msg_size // 8, dtype=np.uint64)
        rx.recv_into(buf, timeout=60)
        t = time.perf_counter()
        for i in range(1, count):
            rx.recv_into(buf, timeout=60)
            if buf[0] != i:
                sys.exit(f"stream: message {i} carries {buf[0]}")
        return time.perf_counter() - t


def python_stream_in_batch(mb: meshd.Mailbox, channel: str, count: int) -> float:
    """As python_stream_in, with recv_batch into a 16-message numpy buffer."""
    with mb.consumer(channel) as rx:
        buf = np.empty((16, rx.msg_size // 8), dtype=np.uint64)
        got = rx.recv_batch(buf[:1], timeout=60)
        t = time.perf_counter()
        while got < count:
            k = rx.recv_batch(buf[: min(16, count - got)], timeout=60)
            if not np.array_equal(buf[:k, 0], np.arange(got, got + k, dtype=np.uint64)):
                sys.exit(f"stream: out of sequence after {got}")
            got += k
        return time.perf_counter() - t


def gbps(size: int, count: int, seconds: float) -> float:
    return size * (count - 1) / seconds / 1e9


def host(peer: Path, pairs: int, pings: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="meshd-bench-"))
    path = tmp / "mailbox"
    chans = [f"p{s}:{s}:64" for s in SIZES] + [f"o{s}:{s}:64" for s in SIZES] + [f"i{s}:{s}:64" for s in SIZES]
    run(peer, "mailbox", path, *chans, f"stream:{STREAM_SIZE}:64")
    mb = meshd.Mailbox.open(path)
    print(f"## Python client beside the Rust client, host <-> host ({os.cpu_count()} CPUs)\n")
    print("### try_send + try_recv pair, one thread, ns (lower is better)\n")
    print("| message | Rust | Python, try_recv_into | Python, try_recv (new bytes) | Python - Rust |")
    print("| --- | --- | --- | --- | --- |")
    for s in SIZES:
        count = max(10_000, min(pairs, (1 << 30) // s))  # at most 1 GiB of copying per row
        rust = float(run(peer, "pair", path, f"p{s}", count)["ns_per_pair"])
        into, fresh = python_pair(mb, f"p{s}", count)
        print(f"| {s} B | {rust:.0f} | {into:.0f} | {fresh:.0f} | {into - rust:+.0f} |")
    print("\n### Round trip through a Rust echo peer (another process), median / p99, µs\n")
    print("| message | Rust | Python |")
    print("| --- | --- | --- |")
    for s in SIZES:
        echo = start(peer, "echo", path, f"o{s}", f"i{s}", 2 * (1000 + pings))
        assert echo.stdout is not None and echo.stdout.readline().strip() == "ready"
        r = run(peer, "ping", path, f"o{s}", f"i{s}", pings)
        py_med, py_p99 = python_ping(mb, f"o{s}", f"i{s}", pings)
        finish(echo)
        rm, rp = float(r["median_ns"]) / 1000, float(r["p99_ns"]) / 1000
        print(f"| {s} B | {rm:.2f} / {rp:.2f} | {py_med / 1000:.2f} / {py_p99 / 1000:.2f} |")
    print(f"\n### Streaming {STREAM_SIZE // 1024} KiB messages one way ({STREAM_COUNT} messages), GB/s\n")
    print("| producer -> consumer | GB/s |")
    print("| --- | --- |")
    n = STREAM_COUNT
    c = start(peer, "consume", path, "stream", n, "--first-word")
    run(peer, "produce", path, "stream", n, "--first-word")
    rr = gbps(STREAM_SIZE, n, float(finish(c)["seconds"]))
    print(f"| Rust -> Rust | {rr:.2f} |")
    base = mb.channel("stream").head
    c = start(peer, "consume", path, "stream", n, "--first-word", "--from-tail")
    # The Python producer numbers from the channel's position, as the peer's --from-tail expects.
    with mb.producer("stream") as tx:
        msg = np.zeros(STREAM_SIZE // 8, dtype=np.uint64)
        for i in range(base, base + n):
            msg[0] = i
            tx.send(msg, timeout=60)
    pr = gbps(STREAM_SIZE, n, float(finish(c)["seconds"]))
    print(f"| Python `send` (numpy) -> Rust | {pr:.2f} ({pr / rr:.0%} of Rust) |")
    p = start(peer, "produce", path, "stream", n, "--first-word")
    secs = python_stream_in(mb, "stream", n)
    finish(p)
    rp = gbps(STREAM_SIZE, n, secs)
    print(f"| Rust -> Python `recv_into` (numpy) | {rp:.2f} ({rp / rr:.0%} of Rust) |")
    # The batch forms, as the Rust consumer uses them (up to 16 messages per call).
    base = mb.channel("stream").head
    c = start(peer, "consume", path, "stream", n, "--first-word", "--from-tail")
    with mb.producer("stream") as tx:
        msgs = np.zeros((16, STREAM_SIZE // 8), dtype=np.uint64)
        for first in range(base, base + n, 16):
            k = min(16, base + n - first)
            msgs[:k, 0] = np.arange(first, first + k, dtype=np.uint64)
            tx.send_batch(msgs[:k], timeout=60)
    pb = gbps(STREAM_SIZE, n, float(finish(c)["seconds"]))
    print(f"| Python `send_batch` (numpy, 16 per call) -> Rust | {pb:.2f} ({pb / rr:.0%} of Rust) |")
    p = start(peer, "produce", path, "stream", n, "--first-word")
    secs = python_stream_in_batch(mb, "stream", n)
    finish(p)
    rb = gbps(STREAM_SIZE, n, secs)
    print(f"| Rust -> Python `recv_batch` (numpy, up to 16 per call) | {rb:.2f} ({rb / rr:.0%} of Rust) |")


def bulk_send(tx: meshd.Producer, first: int, count: int, in_place: bool) -> None:
    """Messages `first..first+count`, each numbered in word 0 (as the peer's --first-word)."""
    # Every page written (as the peer's producer does): an untouched buffer would be read from the zero page.
    msg = np.arange(tx.msg_size // 8, dtype=np.uint64)
    for i in range(first, first + count):
        msg[0] = i
        if in_place:
            # Written in place: the message's bytes land in the slot by numpy's copy (the one copy).
            with tx.send_view(timeout=60) as v:
                np.frombuffer(v, dtype=np.uint64)[:] = msg
        else:
            tx.send(msg, timeout=60)


def bulk_recv(rx: meshd.Consumer, count: int, in_place: bool) -> float:
    """Seconds from the first message to the last, each message's number checked."""
    buf = np.empty(rx.msg_size // 8, dtype=np.uint64)

    def one() -> int:
        if in_place:
            # Read in place: np.frombuffer copies nothing; the number word is read from the slot.
            with rx.recv_view(timeout=60) as v:
                return int(np.frombuffer(v, dtype=np.uint64, count=1)[0])
        rx.recv_into(buf, timeout=60)
        return int(buf[0])

    base = one()
    t = time.perf_counter()
    for i in range(1, count):
        got = one()
        if got != base + i:
            sys.exit(f"bulk stream: message {i} carries {got}, expected {base + i}")
    return time.perf_counter() - t


def bulk_threads(mb: meshd.Mailbox, to: str, back: str, n: int, in_place: bool) -> float:
    """A Python sender thread into `to` while this thread receives from `back`, one process (the GIL
    shared): through bulk_echo, or `to` == `back` host -> host. Seconds from the first message to the last."""
    with mb.producer(to) as tx, mb.consumer(back) as rx:
        sender = threading.Thread(target=bulk_send, args=(tx, mb.channel(to).head, n, in_place))
        sender.start()
        secs = bulk_recv(rx, n, in_place)
        sender.join()
    return secs


def bulk_host(peer: Path, repeats: int) -> None:
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    tmp = Path(tempfile.mkdtemp(prefix="meshd-bench-bulk-", dir=shm))
    path = tmp / "mailbox"
    total = sum(size * cap for size, (cap, _) in BULK.items()) + (16 << 20)
    run(peer, "mailbox", path, "--size", total, *[f"bulk{s}:{s}:{c}:bulk" for s, (c, _) in BULK.items()])
    mb = meshd.Mailbox.open(path)
    print(f"## Bulk channels, Python beside the Rust host end (BulkProducer/BulkConsumer), host -> host ({os.cpu_count()} CPUs)\n")
    for size in BULK:
        print(
            f"Copy settings at {size} B by default: a producer's {meshd.CopyConfig.for_producer(size)!r}, "
            f"a consumer's {meshd.CopyConfig.for_msg_size(size)!r}"
        )
    print(f"Mailbox in {tmp}.")
    print(
        f"Each cell the median of {repeats} streams of numbered messages (the columns interleaved), GB/s from the "
        "first message to the last; the other end the Rust peer (the last column: a Python thread of the same "
        "process, as the GPU rows' two ends share the GIL); in brackets the share of Rust -> Rust.\n"
    )
    print("| message | messages | Rust -> Rust | Python `send` -> Rust | Rust -> Python `recv_into` | Python `send_view` (numpy fill) -> Rust | Rust -> Python `recv_view` (no copy) | Python `send` thread -> Python `recv_into` |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for size, (_, n) in BULK.items():
        ch = f"bulk{size}"
        cols: list[list[float]] = [[] for _ in range(6)]
        for _ in range(repeats):  # interleaved, so that a noisy moment hits every column alike
            c = start(peer, "consume", path, ch, n, "--first-word", "--from-tail")
            run(peer, "produce", path, ch, n, "--first-word", "--from-head")
            cols[0].append(gbps(size, n, float(finish(c)["seconds"])))
            for k, in_place in ((1, False), (3, True)):
                c = start(peer, "consume", path, ch, n, "--first-word", "--from-tail")
                with mb.producer(ch) as tx:
                    bulk_send(tx, mb.channel(ch).head, n, in_place)
                cols[k].append(gbps(size, n, float(finish(c)["seconds"])))
                p = start(peer, "produce", path, ch, n, "--first-word", "--from-head")
                with mb.consumer(ch) as rx:
                    secs = bulk_recv(rx, n, in_place)
                finish(p)
                cols[k + 1].append(gbps(size, n, secs))
            cols[5].append(gbps(size, n, bulk_threads(mb, ch, ch, n, False)))
        med = [statistics.median(c) for c in cols]
        rr = med[0]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        cells = [f"{m:.2f} ({m / rr:.0%})" for m in med[1:]]
        print(f"| {label} | {n} | {rr:.2f} | " + " | ".join(cells) + " |")
    print()


def bulk_gpu(peer: Path, client: meshd.Client, shm: Path, bulk_echo: Path, repeats: int) -> None:
    """Host -> bulk_echo -> host streams: the Rust peer's ends (produce | consume), then Python's (two threads).

    Each cell is the median of `repeats` streams, the columns interleaved (a noisy moment hits every
    column alike); a stream of 500 MiB-messages lasts ~20 ms, too short for one sample to stand alone.
    """
    print("### Bulk streams through bulk_echo (host -> GPU -> host), GB/s each way\n")
    print(f"Each cell the median of {repeats} streams, columns interleaved; in brackets the share of the Rust ends.\n")
    print("| message | messages | Rust ends | Python `send` / `recv_into` | Python `send_view` / `recv_view` |")
    print("| --- | --- | --- | --- | --- |")
    mb = client.mailbox()
    for size, (cap, n) in BULK.items():
        n = max(8, n // 2)
        to, back = f"to-bulk{size}", f"from-bulk{size}"
        client.channel_create(to, msg_size=size, capacity=cap, protocol="bulk")
        client.channel_create(back, msg_size=size, capacity=cap, protocol="bulk")
        client.load(f"bulk-echo{size}", bulk_echo, block=1024, bind=[to, back])
        cols: list[list[float]] = [[] for _ in range(3)]
        for _ in range(repeats):
            c = start(peer, "consume", shm, back, n, "--first-word", "--from-tail")
            run(peer, "produce", shm, to, n, "--first-word", "--from-head")
            cols[0].append(gbps(size, n, float(finish(c)["seconds"])))
            for k, in_place in ((1, False), (2, True)):
                cols[k].append(gbps(size, n, bulk_threads(mb, to, back, n, in_place)))
        client.unload(f"bulk-echo{size}")
        med = [statistics.median(c) for c in cols]
        rr = med[0]
        cells = [f"{m:.2f} ({m / rr:.0%})" for m in med[1:]]
        label = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"
        print(f"| {label} | {n} | {rr:.2f} | " + " | ".join(cells) + " |")
    print()


def gpu(peer: Path, meshd_bin: Path, echo: Path, bulk_echo: Path | None, pings: int, bulk_only: bool, repeats: int) -> None:
    # On tmpfs, as meshd's default: the GPU registers only memory the driver can pin.
    tmp = Path(tempfile.mkdtemp(prefix="meshd-bench-gpu-", dir="/dev/shm"))
    sock, shm = tmp / "sock", tmp / "mailbox"
    args = [str(meshd_bin), "--socket", str(sock), "run", "--shm", str(shm), "--fresh", "--state-dir", str(tmp / "state")]
    args += ["--shm-size", "256M"]  # the bulk rows: a 16 MiB channel of 2 messages each way
    log = open(tmp / "meshd.log", "w")
    daemon = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    client = meshd.Client(sock, timeout=120)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                info = client.info()
                break
            except meshd.MeshdUnreachable:
                if time.monotonic() > deadline or daemon.poll() is not None:
                    sys.exit(f"meshd did not come up:\n{(tmp / 'meshd.log').read_text()[-2000:]}")
                time.sleep(0.1)
        print(f"## Python client beside the Rust client, host <-> GPU ({info['device']})\n")
        if bulk_echo is not None:
            bulk_gpu(peer, client, shm, bulk_echo, repeats)
        print("### Round trip through the echo program, median / p99, µs\n")
        print("| message | Rust | Python |")
        print("| --- | --- | --- |")
        mb = client.mailbox()
        for s in ([] if bulk_only else GPU_SIZES):
            client.channel_create(f"to{s}", msg_size=s, capacity=64)
            client.channel_create(f"from{s}", msg_size=s, capacity=64)
            client.load(f"echo{s}", echo, bind=[f"to{s}", f"from{s}"])
            r = run(peer, "ping", shm, f"to{s}", f"from{s}", pings)
            py_med, py_p99 = python_ping(mb, f"to{s}", f"from{s}", pings)
            client.unload(f"echo{s}")
            rm, rp = float(r["median_ns"]) / 1000, float(r["p99_ns"]) / 1000
            print(f"| {s} B | {rm:.2f} / {rp:.2f} | {py_med / 1000:.2f} / {py_p99 / 1000:.2f} |")
        client.shutdown()
        daemon.wait(timeout=60)
    finally:
        if daemon.poll() is None:
            daemon.kill()


def main() -> None:
    here = Path(__file__).resolve()
    default_peer = here.parents[3] / "target" / "release" / "examples" / "peer"
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", type=Path, default=default_peer, help="the Rust peer (release build)")
    ap.add_argument("--pairs", type=int, default=1_000_000)
    ap.add_argument("--pings", type=int, default=20_000)
    ap.add_argument("--gpu", action="store_true", help="round trips through meshd's echo program on the GPU")
    ap.add_argument("--meshd", type=Path, default=Path("meshd"))
    ap.add_argument("--echo", type=Path, default=here.parents[3] / "target" / "programs" / "echo.ptx")
    ap.add_argument("--bulk-echo", type=Path, default=None, help="bulk_echo.ptx (default: beside --echo)")
    ap.add_argument("--bulk-only", action="store_true", help="only the bulk tables")
    ap.add_argument("--repeats", type=int, default=5, help="streams per bulk cell (host <-> host; the median)")
    args = ap.parse_args()
    if not args.peer.exists():
        sys.exit(f"{args.peer}: build it with `cargo build --release -p mesh-py --example peer`")
    print(f"meshd package: {meshd.__file__}; Python {sys.version.split()[0]}; mailbox layout {meshd.LAYOUT_VERSION}\n")
    if args.gpu:
        if not args.echo.exists():
            sys.exit(f"{args.echo}: no echo program's PTX (`cargo xtask ptx` builds the test programs into target/programs)")
        bulk_echo = args.bulk_echo or args.echo.with_name("bulk_echo.ptx")
        if not bulk_echo.exists():
            print(f"{bulk_echo}: not found, so no bulk rows through bulk_echo\n")
            bulk_echo = None
        gpu(args.peer, args.meshd, args.echo, bulk_echo, args.pings, args.bulk_only, min(args.repeats, 3))
    else:
        bulk_host(args.peer, args.repeats)
        if not args.bulk_only:
            host(args.peer, args.pairs, args.pings)


if __name__ == "__main__":
    main()
