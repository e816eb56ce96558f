"""Real Redis topologies on loopback: one server, a cluster, a sentinel group and a TLS server,
each optionally behind an ACL user, with the failures tests need (SIGKILL a primary, wait for
the promotion, restart the old node).

Every process is a Debian package's `redis-server` on 127.0.0.1 and a free port, started by
`start()` and stopped by its pid by `stop()`. `deploy/local` runs the same classes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests.support.loopback import (
    HOST,
    Certificates,
    Credentials,
    LoopbackProcesses,
    RedisProcess,
    Topology,
    TopologyError,
    free_ports,
    stop_pid,
    tls_only,
)
from tests.support.waiting import wait_until

__all__ = ["Certificates", "Credentials", "RedisCluster", "RedisProcess", "RedisSentinel",
           "RedisSingle", "TlsRedis", "Topology", "TopologyError", "free_ports", "stop_pid"]

SERVICE_NAME = "memp"


class RedisSingle(LoopbackProcesses):
    """One Redis server, with the append-only file on unless told not to."""

    def __init__(self, workdir: Path | None = None, *, credentials: Credentials | None = None,
                 appendonly: bool = True) -> None:
        super().__init__(workdir, credentials)
        self.server = self._data_node("redis", free_ports(1)[0], [], appendonly=appendonly)
        self.processes = [self.server]

    @property
    def url(self) -> str:
        return f"redis://{self._userinfo()}{HOST}:{self.server.port}/0"


class TlsRedis(LoopbackProcesses):
    """One Redis server that speaks only TLS (`--port 0`), with a certificate for 127.0.0.1
    and localhost from a CA made for this run; `mutual` also requires client certificates."""

    def __init__(self, workdir: Path | None = None, *, credentials: Credentials | None = None,
                 mutual: bool = False) -> None:
        super().__init__(workdir, credentials, tls=True)
        assert self.certificates is not None
        self.mutual = mutual
        self.port = free_ports(1)[0]
        certs = self.certificates
        self.ca_file, self.cert_file, self.key_file = certs.ca_file, certs.cert_file, \
            certs.key_file
        self.client_cert_file, self.client_key_file = certs.client_cert_file, \
            certs.client_key_file
        self.server = self._data_node("redis-tls", self.port, [])
        if mutual:
            tls_only(self.server, certs, mutual=True)
        self.processes = [self.server]

    @property
    def url(self) -> str:
        return f"rediss://{self._userinfo()}{HOST}:{self.port}/0"

    @property
    def url_with_ca(self) -> str:
        """`url` naming the CA file as redis-py's `ssl_ca_certs` query parameter."""
        return self._with_ca(self.url)

    def client_tls(self) -> dict[str, Any]:
        """redis-py keyword arguments for a client that trusts the CA (and has a certificate
        when the server requires one)."""
        assert self.certificates is not None
        return self.certificates.client_options(self.mutual)


@dataclass(frozen=True)
class ClusterNode:
    """One line of CLUSTER NODES."""

    id: str
    port: int
    flags: frozenset[str]
    primary_id: str | None
    slots: tuple[tuple[int, int], ...]

    @property
    def primary(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        return "fail" in self.flags or "fail?" in self.flags

    def owns(self, slot: int) -> bool:
        return any(low <= slot <= high for low, high in self.slots)


def parse_cluster_nodes(text: str) -> list[ClusterNode]:
    nodes = []
    for line in text.strip().splitlines():
        parts = line.split()
        address = parts[1].split("@")[0]
        slots = []
        for item in parts[8:]:
            if item.startswith("["):  # a slot being migrated or imported
                continue
            low, _, high = item.partition("-")
            slots.append((int(low), int(high or low)))
        nodes.append(ClusterNode(
            id=parts[0], port=int(address.rsplit(":", 1)[1]), flags=frozenset(
                parts[2].split(",")), primary_id=None if parts[3] == "-" else parts[3],
            slots=tuple(slots)))
    return nodes


class RedisCluster(LoopbackProcesses):
    """A Redis Cluster: `primaries` primaries with `replicas` replicas each, created with
    `redis-cli --cluster create`; a short node timeout so a killed primary's replica takes
    over within a few seconds."""

    def __init__(self, workdir: Path | None = None, *, credentials: Credentials | None = None,
                 primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 1000,
                 appendonly: bool = False, tls: bool = False) -> None:
        super().__init__(workdir, credentials, tls)
        self.primaries, self.replicas = primaries, replicas
        count = primaries * (1 + replicas)
        ports = free_ports(2 * count)
        self.processes = [
            self._data_node(f"cluster-{port}", port, [
                "cluster-enabled yes", "cluster-config-file nodes.conf",
                f"cluster-port {bus}", f"cluster-node-timeout {node_timeout_ms}",
                # Any replica may take over, however long ago it last heard from its primary.
                "cluster-replica-validity-factor 0",
                # Healthy shards serve their slots while another shard fails over
                # (docs/redis.md, "Failover").
                "cluster-require-full-coverage no",
                *(["tls-cluster yes"] if tls else [])], appendonly=appendonly)
            for port, bus in zip(ports[:count], ports[count:], strict=True)]
        self._killed: tuple[RedisProcess, ClusterNode, float] | None = None
        self._paused: set[int] = set()  # ports of nodes SIGSTOPped by pause_primary

    @property
    def url(self) -> str:
        seeds = ",".join(f"{HOST}:{p.port}" for p in self.processes)
        scheme = "redis+cluster+tls" if self.certificates else "redis+cluster"
        return f"{scheme}://{self._userinfo()}{seeds}"

    @property
    def url_with_ca(self) -> str:
        """`url` naming the CA file (`ssl_ca_certs`) when the cluster speaks TLS."""
        return self._with_ca(self.url)

    def _settle(self) -> None:
        command = [shutil.which("redis-cli") or "redis-cli", "--cluster", "create",
                   *(f"{HOST}:{p.port}" for p in self.processes),
                   "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        env = dict(os.environ)
        if self.certificates is not None:
            command[1:1] = ["--tls", "--cacert", str(self.certificates.ca_file)]
        if self.credentials is not None:
            command[1:1] = ["--user", self.credentials.user]
            env["REDISCLI_AUTH"] = self.credentials.password
        created = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60,
                                 check=False)
        if created.returncode != 0:
            raise TopologyError(f"redis-cli --cluster create failed:\n{created.stdout}"
                                f"{created.stderr}")
        self.wait_ok()

    def process(self, port: int) -> RedisProcess:
        return next(p for p in self.processes if p.port == port)

    def _live(self) -> list[RedisProcess]:
        """The nodes running and not paused (`pause_primary`)."""
        return [p for p in self.processes if p.running and p.port not in self._paused]

    def nodes(self) -> list[ClusterNode]:
        """The cluster as the first live process sees it."""
        for process in self._live():
            if process.running:
                with contextlib.suppress(redis.RedisError), process.client() as client:
                    return parse_cluster_nodes(client.execute_command("CLUSTER", "NODES"))
        raise TopologyError("no cluster node answers")

    def primary_for(self, slot: int) -> RedisProcess:
        node = next(n for n in self.nodes() if n.primary and not n.failed and n.owns(slot))
        return self.process(node.port)

    def slot_of(self, key: str) -> int:
        for process in self._live():
            if process.running:
                with process.client() as client:
                    return int(client.execute_command("CLUSTER", "KEYSLOT", key))
        raise TopologyError("no cluster node answers")

    def healthy(self) -> bool:
        """Every running node says `cluster_state:ok`, sees every node, and every slot has a
        primary that is not failing."""
        live = self._live()
        for process in live:
            with process.client(timeout=0.5) as client:
                info = client.execute_command("CLUSTER", "INFO")
                if "cluster_state:ok" not in info or "cluster_slots_ok:16384" not in info:
                    return False
                nodes = parse_cluster_nodes(client.execute_command("CLUSTER", "NODES"))
                if len(nodes) != len(self.processes):
                    return False
                failed = {n.port for n in nodes if n.failed}
                if failed - {p.port for p in self.processes if p not in live}:
                    return False
                # Gossip is slower than CLUSTER REPLICATE: until it spreads, a node still sees
                # a new replica as a primary without slots.
                if sum(n.primary and not n.failed for n in nodes) != self.primaries:
                    return False
        return True

    def wait_ok(self, timeout: float = 30) -> float:
        """Wait until healthy() and every running replica is in sync with its primary."""
        def settled() -> bool:
            return self.healthy() and all(self._replica_linked(p) for p in self._live())
        return wait_until(settled, "cluster_state:ok on every node", timeout, 0.05,
                          ignoring=(redis.RedisError, OSError))

    @staticmethod
    def _replica_linked(process: RedisProcess) -> bool:
        info = process.info("replication")
        return info["role"] == "master" or info.get("master_link_status") == "up"

    def kill_primary(self, target: int | RedisProcess = 0) -> RedisProcess:
        """SIGKILL the primary serving `target` (a slot) or `target` itself (a primary)."""
        process = self.primary_for(target) if isinstance(target, int) else target
        node = next(n for n in self.nodes() if n.port == process.port)
        if not node.primary:
            raise TopologyError(f"{process.name} is not a primary")
        process.kill()
        self._killed = (process, node, time.monotonic())
        return process

    def pause_primary(self, target: int | RedisProcess = 0) -> RedisProcess:
        """SIGSTOP the primary serving `target` (a slot) or `target` itself: to the cluster it
        is as good as dead, so `wait_promoted` works as after a kill; `resume` ends it."""
        process = self.primary_for(target) if isinstance(target, int) else target
        node = next(n for n in self.nodes() if n.port == process.port)
        assert process.process is not None and node.primary
        process.process.send_signal(signal.SIGSTOP)
        self._paused.add(process.port)
        self._killed = (process, node, time.monotonic())
        return process

    def resume(self, process: RedisProcess, timeout: float = 30) -> None:
        """SIGCONT a paused node (a former primary rejoins as a replica of its heir) and wait
        until the cluster is ok."""
        assert process.process is not None
        process.process.send_signal(signal.SIGCONT)
        self._paused.discard(process.port)
        self._killed = None
        self.wait_ok(timeout)

    def wait_promoted(self, timeout: float = 30) -> float:
        """Wait until a replica holds the killed primary's slots and the cluster is ok again;
        the seconds since the kill."""
        if self._killed is None:
            raise TopologyError("no primary was killed")
        _, dead, killed_at = self._killed

        def promoted() -> bool:
            nodes = self.nodes()
            heirs = [n for n in nodes if n.primary and not n.failed and n.id != dead.id
                     and n.slots == dead.slots]
            return bool(heirs) and self.healthy()
        wait_until(promoted, f"a replica of {dead.port} promoted", timeout, 0.05,
                   ignoring=(redis.RedisError, OSError))
        return time.monotonic() - killed_at

    def restart(self, process: RedisProcess, timeout: float = 30) -> None:
        """Start a killed node again (it rejoins from its nodes.conf; a former primary comes
        back as a replica of its heir) and wait until the cluster is ok."""
        process.stop()
        process.start(detach=self.detach)
        self.wait_ok(timeout)

    def heal(self) -> None:
        """Resume paused nodes, restart every node that is down and wait until the cluster
        is ok."""
        for process in self.processes:
            if process.port in self._paused and process.process is not None:
                process.process.send_signal(signal.SIGCONT)
        self._paused.clear()
        for process in self.processes:
            if not process.running:
                process.stop()
                process.start(detach=self.detach)
        self.wait_ok()


# Sentinels learn of each other and of replicas from hello messages (every 2 s) and INFO
# (every 10 s); tests shorten both (SENTINEL DEBUG, Redis 7.0+). Failure detection is
# down-after-milliseconds either way: 2 s, two of the sentinels' 1 s pings, since at 1 s one
# late reply on a loaded machine could start a failover no test asked for.
QUICK_SENTINEL_TIMERS = ("info-period", "1000", "publish-period", "500")


class RedisSentinel(LoopbackProcesses):
    """One primary, `replicas` replicas and `sentinels` sentinels (quorum `quorum`) watching
    them as service `service_name`. With credentials, the data nodes and (unless
    `protect_sentinels` is off) the sentinels require the ACL user; the broker asks the
    sentinels with the URL's credentials (broker/storage/urls.py). With `min_replicas_max_lag`
    (seconds) a primary refuses writes while no replica acknowledged its stream that recently
    (`min-replicas-to-write 1`, docs/redis.md, "Failover")."""

    def __init__(self, workdir: Path | None = None, *, credentials: Credentials | None = None,
                 replicas: int = 1, sentinels: int = 3, quorum: int = 2,
                 down_after_ms: int = 2000, failover_timeout_ms: int = 10_000,
                 service_name: str = SERVICE_NAME, protect_sentinels: bool = True,
                 quick_discovery: bool = False, appendonly: bool = False,
                 tls: bool = False, min_replicas_max_lag: int | None = None) -> None:
        super().__init__(workdir, credentials, tls)
        self.quick_discovery = quick_discovery
        self.protect_sentinels = protect_sentinels
        self.service_name = service_name
        ports = free_ports(1 + replicas + sentinels)
        self.data = [self._data_node(f"redis-{port}", port, [], appendonly=appendonly)
                     for port in ports[:1 + replicas]]
        for replica in self.data[1:]:
            replica.config_lines.append(f"replicaof {HOST} {ports[0]}")
        if min_replicas_max_lag is not None:
            for node in self.data:
                node.config_lines += ["min-replicas-to-write 1",
                                      f"min-replicas-max-lag {min_replicas_max_lag}"]
        monitor = [f"sentinel monitor {service_name} {HOST} {ports[0]} {quorum}",
                   f"sentinel down-after-milliseconds {service_name} {down_after_ms}",
                   f"sentinel failover-timeout {service_name} {failover_timeout_ms}",
                   f"sentinel parallel-syncs {service_name} 1"]
        if credentials is not None:
            monitor += [f"sentinel auth-user {service_name} {credentials.user}",
                        f"sentinel auth-pass {service_name} {credentials.password}"]
            if protect_sentinels:
                monitor += [*credentials.acl_lines(),
                            f"sentinel sentinel-user {credentials.user}",
                            f"sentinel sentinel-pass {credentials.password}"]
        self.sentinels = [
            RedisProcess(f"sentinel-{port}", port, self.workdir / f"sentinel-{port}",
                         [f"bind {HOST}", f"port {port}", f"dir {self.workdir}/sentinel-{port}",
                          *monitor], sentinel=True,
                         credentials=credentials if protect_sentinels else None)
            for port in ports[1 + replicas:]]
        if self.certificates is not None:
            for sentinel in self.sentinels:
                tls_only(sentinel, self.certificates)
        self.processes = [*self.data, *self.sentinels]
        self.primary = self.data[0]
        self._killed: tuple[RedisProcess, float] | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        # Sentinels without a password: an empty sentinel_password (broker/storage/urls.py).
        query = "?sentinel_password=" if self.credentials and not self.protect_sentinels else ""
        scheme = "redis+sentinel+tls" if self.certificates else "redis+sentinel"
        return f"{scheme}://{self._userinfo()}{hosts}/{self.service_name}{query}"

    @property
    def url_with_ca(self) -> str:
        """`url` naming the CA file (`ssl_ca_certs`) when the group speaks TLS."""
        return self._with_ca(self.url)

    def _settle(self) -> None:
        if self.quick_discovery:
            for sentinel in self.sentinels:
                with sentinel.client() as client:
                    client.execute_command("SENTINEL", "DEBUG", *QUICK_SENTINEL_TIMERS)
        self.wait_ready()

    def reported_primaries(self) -> list[int | None]:
        """The primary's port as each sentinel reports it (None: a sentinel not answering)."""
        ports: list[int | None] = []
        for sentinel in self.sentinels:
            try:
                with sentinel.client(timeout=0.5) as client:
                    reply = client.sentinel_get_master_addr_by_name(self.service_name)
                ports.append(int(reply[1]) if reply else None)
            except redis.RedisError:
                ports.append(None)
        return ports

    def wait_ready(self, timeout: float = 60) -> float:
        """Wait until the sentinels agree on a primary (`primary` follows them), each knows its
        replicas and the other sentinels, and every replica is in sync. On timeout, the error
        names what was still missing."""
        missing = ["nothing checked yet"]

        def ready() -> bool:
            missing[0] = "a sentinel or data node did not answer"
            reported = set(self.reported_primaries())
            if len(reported) != 1 or None in reported:
                missing[0] = f"the sentinels name {sorted(map(str, reported))}"
                return False
            port = reported.pop()  # whichever they agree on (a test may have failed over)
            self.primary = next((p for p in self.data if p.port == port), self.primary)
            for sentinel in self.sentinels:
                with sentinel.client(timeout=0.5) as client:
                    state = client.sentinel_master(self.service_name)
                    replicas = client.sentinel_slaves(self.service_name)
                problems = [
                    f"names {state['port']}" if state["port"] != self.primary.port else "",
                    "sees the primary down" if state["is_odown"] or state["is_sdown"] else "",
                    f"knows {state['num-other-sentinels']} other sentinels"
                    if state["num-other-sentinels"] < len(self.sentinels) - 1 else "",
                    f"knows {len(replicas)} replicas" if len(replicas) < len(self.data) - 1
                    else "",
                    "sees a replica down" if any(r["is_sdown"] or r["is_disconnected"]
                                                 for r in replicas) else ""]
                if any(problems):
                    missing[0] = f"sentinel {sentinel.port} " + ", ".join(p for p in problems if p)
                    return False
            lagging = [p.port for p in self.data if p is not self.primary
                       and p.info("replication").get("master_link_status") != "up"]
            missing[0] = f"replicas {lagging} not in sync"
            return not lagging
        try:
            return wait_until(ready, "sentinels agreeing on the primary and replicas", timeout,
                              0.05, ignoring=(redis.RedisError, OSError))
        except TimeoutError as error:
            raise TimeoutError(f"{error}: {missing[0]}") from None

    def kill_primary(self) -> RedisProcess:
        """SIGKILL the current primary."""
        killed = self.primary
        killed.kill()
        self._killed = (killed, time.monotonic())
        return killed

    def pause_primary(self) -> RedisProcess:
        """SIGSTOP the current primary (a frozen VM, a long pause): to the sentinels it is as
        good as dead, so `wait_failover` works as after a kill."""
        paused = self.primary
        assert paused.process is not None
        paused.process.send_signal(signal.SIGSTOP)
        self._killed = (paused, time.monotonic())
        return paused

    def resume(self, paused: RedisProcess, timeout: float = 30) -> None:
        """SIGCONT a paused node, and wait until the sentinels made it a replica of the
        current primary and it is in sync."""
        assert paused.process is not None
        paused.process.send_signal(signal.SIGCONT)
        if self._killed is not None and self._killed[0] is paused:
            self._killed = None
        self.wait_ready(timeout)

    def wait_failover(self, timeout: float = 30) -> float:
        """Wait until every sentinel reports a new primary that says it is one; the seconds
        since the kill."""
        if self._killed is None:
            raise TopologyError("no primary was killed")
        dead, killed_at = self._killed

        def promoted() -> bool:
            ports = set(self.reported_primaries())
            if len(ports) != 1 or None in ports or dead.port in ports:
                return False
            heir = next(p for p in self.data if p.port in ports)
            if heir.info("replication")["role"] != "master":
                return False
            self.primary = heir
            return True
        wait_until(promoted, f"sentinels failing over from {dead.port}", timeout, 0.05,
                   ignoring=(redis.RedisError, OSError))
        return time.monotonic() - killed_at

    def restart_old_primary(self, timeout: float = 30) -> RedisProcess:
        """Start the killed primary again as a replica of the current one, as the sentinels
        would make it, and wait until it is in sync and known to them."""
        if self._killed is None:
            raise TopologyError("no primary was killed")
        old, _ = self._killed
        old.stop()
        old.start(detach=self.detach, extra=["--replicaof", HOST, str(self.primary.port)])
        self._killed = None
        self.wait_ready(timeout)
        return old

    def heal(self) -> None:
        """After a kill: wait for the failover and bring the old primary back as a replica."""
        if self._killed is not None:
            self.wait_failover()
            self.restart_old_primary()
