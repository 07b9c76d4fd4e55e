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
