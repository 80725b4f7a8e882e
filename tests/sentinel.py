"""A real Redis Sentinel set (Debian's ``redis-server`` and ``redis-sentinel``): a primary, one
replica and three Sentinels (quorum 2), on free ports in a temporary folder, without
persistence; everything is killed at the end of the session.

The primary is reached through a relay (``Relay``) whose replication stream the test can
hold: while held, what the primary writes does not reach the replica, as in a partition
between the two, so a failover that follows promotes a replica that missed those writes,
deterministically.
``Sentinels.url`` is the ``redis+sentinel://`` URL callgate's processes are given.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.acceptance.prometheus_server import free_port_block

SERVICE = "callgate"
DOWN_AFTER_MS = 1000
FAILOVER_TIMEOUT_MS = 3000


class Relay:
    """A TCP relay from ``port`` to the primary, the address the Sentinels know it by.

    ``hold()`` stops the replication stream (the connections whose client sent
    ``REPLCONF``: the replica's) and nothing else, as a partition between primary and replica
    would; ``cut()`` closes every connection, and what was held is never delivered. (A relay
    only on the replica's side would not do: Sentinel sees a replica following an address
    that is not the primary's, and points it at the primary directly.)"""

    def __init__(self, port: int, upstream: tuple[str, int]) -> None:
        self.port = port
        self.upstream = upstream
        self.flowing = threading.Event()
        self.flowing.set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", port))
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream, timeout=2)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self.lock:
                self.sockets += [client, server]
            replication = threading.Event()
            threading.Thread(
                target=self._pump, args=(client, server, replication, True), daemon=True
            ).start()
            threading.Thread(
                target=self._pump, args=(server, client, replication, False), daemon=True
            ).start()

    def _pump(
        self, source: socket.socket, sink: socket.socket, replication: threading.Event, up: bool
    ) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if up and b"REPLCONF" in data.upper():
                    replication.set()  # before it is forwarded, so before any reply
                if not up and replication.is_set():
                    self.flowing.wait()  # held; after a cut, sendall fails: dropped
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                with contextlib.suppress(OSError):
                    s.close()

    def hold(self) -> None:
        self.flowing.clear()

    def cut(self) -> None:
        """Close every relayed connection; what was held is lost."""
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.sockets.clear()
        self.flowing.set()

    def close(self) -> None:
        self.closed = True
        self.listener.close()
        self.cut()


class Sentinels:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        base = free_port_block(6)
        self.primary_port, self.replica_port, self.relay_port = base, base + 1, base + 2
        self.sentinel_ports = [base + 3, base + 4, base + 5]
        self.servers: dict[int, subprocess.Popen[bytes]] = {}
        self.sentinels: list[subprocess.Popen[bytes]] = []
        self.relay = Relay(self.relay_port, ("127.0.0.1", self.primary_port))
        self._server(self.primary_port)
        self._server(self.replica_port, "--replicaof", "127.0.0.1", str(self.relay_port))
        # The Sentinels know the primary by the relay's address, as the replica does.
        for port in self.sentinel_ports:
            config = folder / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"logfile {folder / f'sentinel-{port}.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {self.relay_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.sentinels.append(
                subprocess.Popen(
                    ["redis-sentinel", str(config)],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self.wait_ready()

    def _server(self, port: int, *extra: str) -> None:
        self.servers[port] = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.folder),
                "--logfile",
                str(self.folder / f"redis-{port}.log"),
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def sentinel(self, i: int = 0) -> redis.Redis:
        return redis.Redis(port=self.sentinel_ports[i], socket_timeout=2, decode_responses=True)

    def primary_port_now(self, i: int = 0) -> int | None:
        """Where Sentinel ``i`` says the primary is."""
        try:
            address = self.sentinel(i).execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", SERVICE)
        except redis.RedisError:
            return None
        return int(address[1]) if address else None

    def server(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Every Sentinel knows the primary, the replica and the two other Sentinels, and
        the replica is in sync."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                states = [
                    self.sentinel(i).execute_command("SENTINEL MASTER", SERVICE) for i in range(3)
                ]
                info = self.server(self.replica_port).info("replication")
                ready = info.get("master_link_status") == "up" and all(
                    int(_field(s, "num-slaves")) == 1 and int(_field(s, "num-other-sentinels")) == 2
                    for s in states
                )
            except (redis.RedisError, ValueError):
                ready = False
            if ready:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the Sentinel set did not come up: {self.logs()}")
            time.sleep(0.1)

    def kill(self, port: int) -> None:
        proc = self.servers[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted(self.folder.glob("*.log"))
        )

    def stop(self) -> None:
        for proc in [*self.sentinels, *self.servers.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.relay.close()


def _field(flat: list[str] | dict[str, str], name: str) -> str:
    if isinstance(flat, dict):
        return flat[name]
    return dict(zip(flat[::2], flat[1::2], strict=True))[name]


@pytest.fixture(scope="session")
def redis_sentinels() -> Iterator[Sentinels]:
    """The set, for the session. tests/acceptance/test_sentinel.py's failover leaves it with
    the replica as primary and no replica; it checks the set is as built before it starts."""
    for binary in ("redis-server", "redis-sentinel"):
        if shutil.which(binary) is None:
            pytest.fail(f"Debian's {binary} is required for this test (apt-get install {binary})")
    folder = Path(tempfile.mkdtemp(prefix="callgate-sentinel-"))
    sentinels = Sentinels(folder)
    yield sentinels
    sentinels.stop()
    shutil.rmtree(folder, ignore_errors=True)
