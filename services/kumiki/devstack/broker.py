"""Kafka-compatible brokers for local work: the pip-installed development broker, or Apache Kafka.

Apache Kafka comes from Maven Central (infra/kafka/pom.xml, fetched once into a cache with Maven) and
runs in KRaft mode as a single node on loopback. It is what CI and production semantics rest on.
`noida-db` is a development broker: it passed our checks but is young; see the README.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from kumiki.devstack.processes import StackError, spawn, wait_for_port

REPO_ROOT = Path(__file__).resolve().parents[3]
KAFKA_POM = REPO_ROOT / "infra" / "kafka" / "pom.xml"
KAFKA_VERSION = "4.1.1"
BROKER_KINDS = ("noida", "kafka")


@dataclass
class BrokerProcess:
    kind: str
    pid: int
    bootstrap: str
    data_dir: str
    log: str
    label: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def kafka_cache_dir() -> Path:
    base = Path(os.environ.get("KUMIKI_CACHE", Path.home() / ".cache" / "kumiki"))
    return base / f"kafka-{KAFKA_VERSION}"


def fetch_kafka_jars() -> Path:
    """Apache Kafka's jars via Maven (cached); returns the folder of jars."""
    lib = kafka_cache_dir() / "lib"
    if (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        return lib
    if shutil.which("mvn") is None:
        raise StackError("Apache Kafka needs Maven (mvn) to fetch its jars: apt-get install maven")
    lib.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        ["mvn", "-q", "-B", "-f", str(KAFKA_POM), "dependency:copy-dependencies", f"-DoutputDirectory={lib}"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise StackError(
            f"fetching Kafka {KAFKA_VERSION} jars with Maven failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}"
        )
    return lib


def _kafka_properties(data_dir: Path, port: int, controller_port: int) -> str:
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
            f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data_dir / 'logs'}",
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "group.initial.rebalance.delay.ms=0",
            "num.partitions=3",
            "log.cleaner.backoff.ms=1000",
            "",
        ]
    )


def start_kafka(data_dir: Path, port: int, log_path: Path) -> BrokerProcess:
    lib = fetch_kafka_jars()
    java = shutil.which("java")
    if java is None:
        raise StackError("Apache Kafka needs a Java runtime (17+): apt-get install default-jre-headless")
    data_dir.mkdir(parents=True, exist_ok=True)
    controller_port = port + 1
    properties = data_dir / "server.properties"
    properties.write_text(_kafka_properties(data_dir, port, controller_port))
    classpath = f"{lib}/*"
    log4j = REPO_ROOT / "infra" / "kafka" / "log4j2.yaml"
    # the JVM options Kafka's own start script (kafka-run-class.sh) uses: short G1 pauses keep the broker's
    # answer times, and with them every acks=all publish behind a Bind, even
    jvm = [
        "-Xms256m",
        "-Xmx768m",
        f"-Dlog4j2.configurationFile={log4j}",
        "-server",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        "-Djava.awt.headless=true",
    ]
    if not (data_dir / "logs" / "meta.properties").exists():
        cluster_id = (
            subprocess.run(
                [java, "-cp", classpath, "kafka.tools.StorageTool", "random-uuid"],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        formatted = subprocess.run(
            [
                java,
                *jvm,
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(properties),
            ],
            capture_output=True,
            text=True,
        )
        if formatted.returncode != 0:
            raise StackError(f"formatting Kafka storage failed: {formatted.stdout}{formatted.stderr}")
    pid = spawn([java, *jvm, "-cp", classpath, "kafka.Kafka", str(properties)], log_path)
    wait_for_port("127.0.0.1", port, 90, pid, "Apache Kafka", log_path)
    return BrokerProcess(
        "kafka", pid, f"127.0.0.1:{port}", str(data_dir), str(log_path), f"Apache Kafka {KAFKA_VERSION} (KRaft)"
    )


def start_noida(data_dir: Path, port: int, log_path: Path) -> BrokerProcess:
    executable = str(Path(sys.executable).parent / "noida-db")
    if not Path(executable).exists():
        executable = shutil.which("noida-db") or executable
    if not Path(executable).exists():
        raise StackError("the development broker needs the noida-db package: pip install 'kumiki[local]'")
    data_dir.mkdir(parents=True, exist_ok=True)
    pid = spawn(
        [executable, "start", "--data-dir", str(data_dir), "--only", "kafka", "--kafka-port", str(port)], log_path
    )
    wait_for_port("127.0.0.1", port, 30, pid, "noida-db", log_path)
    return BrokerProcess(
        "noida",
        pid,
        f"127.0.0.1:{port}",
        str(data_dir),
        str(log_path),
        "noida-db 0.2.3 (development broker, not for production)",
    )


def start_broker(kind: str, data_dir: Path, port: int, log_path: Path) -> BrokerProcess:
    if kind == "kafka":
        return start_kafka(data_dir, port, log_path)
    if kind == "noida":
        return start_noida(data_dir, port, log_path)
    raise StackError(f"--broker: expected one of {', '.join(BROKER_KINDS)}, got {kind!r}")


@dataclass(frozen=True)
class SecureListener:
    """What makes Apache Kafka's client listener SASL_SSL with SCRAM-SHA-512 (KIP-900: users at format time).

    `bundle`: the broker's PEM keystore (key then certificate, kumiki.devstack.tls.CertificateFiles.bundle);
    `cafile`: the PEM truststore; `users`: name -> password, created by kafka-storage when the storage is
    formatted; `admin`: the one the broker itself authenticates as between its own listeners. `authorizer`: run
    KRaft's StandardAuthorizer, so a user may do only what an ACL allows it (`admin` is a super user; so is
    ANONYMOUS, which is what the loopback-only PLAINTEXT controller listener sees the broker's own half as).
    """

    bundle: Path
    cafile: Path
    admin: str
    users: dict[str, str]
    authorizer: bool = False


def _secure_properties(data_dir: Path, port: int, controller_port: int, secure: SecureListener) -> str:
    plain = _kafka_properties(data_dir, port, controller_port)
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required"
        f' username="{secure.admin}" password="{secure.users[secure.admin]}";'
    )
    replaced = plain.replace(f"PLAINTEXT://127.0.0.1:{port}", f"SASL_SSL://127.0.0.1:{port}").replace(
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,", "listener.security.protocol.map=SASL_SSL:SASL_SSL,"
    )
    return replaced + "\n".join(
        [
            "inter.broker.listener.name=SASL_SSL",
            "sasl.enabled.mechanisms=SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={jaas}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={secure.bundle}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={secure.cafile}",
            "ssl.client.auth=none",
            *(
                [
                    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                    f"super.users=User:{secure.admin};User:ANONYMOUS",
                    "allow.everyone.if.no.acl.found=false",
                ]
                if secure.authorizer
                else []
            ),
            "",
        ]
    )


def kafka_tool(main_class: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One of Apache Kafka's own command-line tools (kafka.tools.StorageTool, kafka.admin.ConfigCommand) from
    the cached jars, as kafka-storage.sh / kafka-configs.sh run them."""
    java = shutil.which("java")
    if java is None:
        raise StackError("Apache Kafka needs a Java runtime (17+): apt-get install default-jre-headless")
    log4j = REPO_ROOT / "infra" / "kafka" / "log4j2.yaml"
    return subprocess.run(
        [java, "-Xmx256m", f"-Dlog4j2.configurationFile={log4j}", "-cp", f"{fetch_kafka_jars()}/*", main_class, *args],
        capture_output=True,
        text=True,
    )


def start_kafka_secure(data_dir: Path, port: int, log_path: Path, secure: SecureListener) -> BrokerProcess:
    """Apache Kafka whose only client listener is SASL_SSL + SCRAM-SHA-512, users created by kafka-storage
    format (`--add-scram`); add more later with `add_scram_user` (kafka-configs)."""
    lib = fetch_kafka_jars()
    java = shutil.which("java")
    if java is None:
        raise StackError("Apache Kafka needs a Java runtime (17+): apt-get install default-jre-headless")
    data_dir.mkdir(parents=True, exist_ok=True)
    properties = data_dir / "server.properties"
    properties.write_text(_secure_properties(data_dir, port, port + 1, secure))
    properties.chmod(0o600)  # it holds the broker's own SCRAM password
    if not (data_dir / "logs" / "meta.properties").exists():
        cluster_id = kafka_tool("kafka.tools.StorageTool", "random-uuid").stdout.strip().splitlines()[-1]
        scram = [
            arg
            for name, password in secure.users.items()
            for arg in ("--add-scram", f"SCRAM-SHA-512=[name={name},password={password}]")
        ]
        formatted = kafka_tool("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties), *scram)
        if formatted.returncode != 0:
            raise StackError(f"formatting Kafka storage failed: {formatted.stdout}{formatted.stderr}")
    jvm = ["-Xms256m", "-Xmx768m", f"-Dlog4j2.configurationFile={REPO_ROOT / 'infra' / 'kafka' / 'log4j2.yaml'}"]
    pid = spawn([java, *jvm, "-cp", f"{lib}/*", "kafka.Kafka", str(properties)], log_path)
    wait_for_port("127.0.0.1", port, 90, pid, "Apache Kafka (SASL_SSL)", log_path)
    return BrokerProcess(
        "kafka", pid, f"127.0.0.1:{port}", str(data_dir), str(log_path), f"Apache Kafka {KAFKA_VERSION} (SASL_SSL)"
    )


def add_scram_user(bootstrap: str, secure: SecureListener, name: str, password: str, folder: Path) -> None:
    """Create or update a SCRAM-SHA-512 user on a running broker with kafka-configs, as its admin."""
    admin = folder / "admin-client.properties"
    admin.write_text(
        "\n".join(
            [
                "security.protocol=SASL_SSL",
                "sasl.mechanism=SCRAM-SHA-512",
                "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required"
                f' username="{secure.admin}" password="{secure.users[secure.admin]}";',
                "ssl.truststore.type=PEM",
                f"ssl.truststore.location={secure.cafile}",
                "",
            ]
        )
    )
    admin.chmod(0o600)
    result = kafka_tool(
        "kafka.admin.ConfigCommand", "--bootstrap-server", bootstrap, "--command-config", str(admin), "--alter",
        "--add-config", f"SCRAM-SHA-512=[password={password}]", "--entity-type", "users", "--entity-name", name,
    )  # fmt: skip
    if result.returncode != 0:
        raise StackError(f"kafka-configs could not add user {name}: {result.stdout}{result.stderr}")
