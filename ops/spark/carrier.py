"""pidctl-kafka's JVM carrier: ``write_kafka``'s rows written by Spark's own JVM tasks, with the
producer ids and the plan decided on the driver — as ``write_sql`` lets Spark's JDBC writer
carry its rows (docs/spark-kafka.md, docs/design-decisions.md).

The carrier is Java (``ops/spark/jvm/``: ``KafkaCarrier``, the DataSource V2 that Spark loads
by class name; ``CarrierWriter``, one task's producer, the twin of ``kafka_producer.py``;
``Wire``, the connections), built against Spark's jars and Kafka's client library
(``kafka-clients``, which Spark's own Kafka connector brings too) into a jar that Spark needs
on its class path, as it needs its own connector's:

    spark-submit --jars "$(python -m pidctl.spark.carrier)" ...

prints the jar's path, building it first (``javac``, cached by the sources' hash under
``~/.cache/pidctl``); ``--kafka-clients JAR`` names the Kafka client jar to build against
(default: ``PIDCTL_KAFKA_CLIENTS_JAR``, else the newest one in the local Maven or Ivy cache).
Without the carrier on the class path, ``write_kafka`` writes from Python tasks, as the data
source does, and says so. The carrier speaks PLAINTEXT only: a secured cluster is written
from Python.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from pidctl.spark.kafka_options import KafkaSinkOptions

#: The class Spark loads (``format(CARRIER)``) and the Java sources.
CARRIER = "pidctl.spark.KafkaCarrier"
SOURCES = Path(__file__).resolve().parent / "jvm"
#: Where built jars are kept (by the hash of the sources and of the jars built against).
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pidctl"


class CarrierUnavailable(RuntimeError):
    """The carrier cannot be built or used: the message says what is missing."""


def kafka_clients_jar() -> Path:
    """The Kafka client jar to build against: ``PIDCTL_KAFKA_CLIENTS_JAR``, else the newest
    ``kafka-clients-*.jar`` of the local Maven repository or Ivy cache (where ``--packages``
    puts Spark's Kafka connector and its dependencies)."""
    named = os.environ.get("PIDCTL_KAFKA_CLIENTS_JAR")
    if named:
        return Path(named)
    home = Path.home()
    found = sorted(
        [
            *(home / ".m2" / "repository" / "org" / "apache" / "kafka").glob(
                "kafka-clients/*/kafka-clients-*.jar"
            ),
            *home.glob(".ivy2*/jars/org.apache.kafka_kafka-clients-*.jar"),
        ],
        key=lambda path: path.stat().st_mtime,
    )
    jars = [p for p in found if not p.name.endswith(("-sources.jar", "-javadoc.jar"))]
    if not jars:
        raise CarrierUnavailable(
            "no kafka-clients jar found to build pidctl-kafka's carrier against: set "
            "PIDCTL_KAFKA_CLIENTS_JAR (or fetch it: --packages org.apache.kafka:kafka-clients)"
        )
    return jars[-1]


def spark_jars() -> Path:
    """The jars of the installed pyspark."""
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "jars"


def build(kafka_clients: Path | None = None) -> Path:
    """The carrier's jar, built if this checkout's sources have not been (``javac`` and
    ``jar`` of the JDK Spark runs on)."""
    clients = kafka_clients or kafka_clients_jar()
    sources = sorted(SOURCES.rglob("*.java"))
    if not sources:
        raise CarrierUnavailable(f"the carrier's Java sources are not installed ({SOURCES})")
    digest = hashlib.sha256(str(clients).encode())
    for source in sources:
        digest.update(source.read_bytes())
    target = CACHE / f"pidctl-kafka-carrier-{digest.hexdigest()[:16]}.jar"
    if target.is_file():
        return target
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise CarrierUnavailable("javac and jar (a JDK, 17 or newer) build pidctl-kafka's carrier")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as out:
        classpath = f"{spark_jars()}/*{os.pathsep}{clients}"
        done = subprocess.run(
            [javac, "-nowarn", "-d", out, "-cp", classpath, *map(str, sources)],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise CarrierUnavailable(f"javac failed: {done.stderr.strip()[-2000:]}")
        partial = target.with_suffix(".tmp")
        subprocess.run([jar, "cf", str(partial), "-C", out, "."], check=True)
        partial.replace(target)
    return target


def available(spark: Any) -> bool:
    """Whether Spark's driver can load the carrier (it is on the class path)."""
    try:
        return bool(spark._jvm.org.apache.spark.util.Utils.classIsLoadable(CARRIER))
    except Exception:  # Spark Connect, or no JVM at hand
        return False


def usable(options: KafkaSinkOptions) -> bool:
    """Whether the carrier can write for these options (PLAINTEXT Kafka)."""
    return not options.connection


def plan_json(
    options: KafkaSinkOptions,
    allocation: Any,
    plan: Any,
    name: tuple[str, int] | None,
) -> tuple[str, str]:
    """The carrier's ``plan`` option, and the write id its reports come back under."""
    write_id = uuid.uuid4().hex
    o, settings = options, options.producer
    body = {
        "write_id": write_id,
        "bootstrap": list(o.bootstrap_servers),
        "topic": o.topic,
        "partitions": plan.partitions,
        "blocks": [list(block) for block in allocation.blocks],
        "epoch": allocation.epoch,
        "expected": {str(k): v for k, v in plan.expected.items()},
        "started_ms": plan.started_ms,
        "expiration_ms": plan.expiration_ms,
        "app_id": name[0] if name else "",
        "version": name[1] if name else -1,
        "batch_bytes": settings.batch_bytes,
        "request_timeout_ms": int(settings.request_timeout_s * 1000),
        "delivery_timeout_ms": int(settings.delivery_timeout_s * 1000),
        "retry_backoff_ms": int(settings.retry_backoff_s * 1000),
        "retry_backoff_max_ms": int(settings.retry_backoff_max_s * 1000),
        "retries": settings.retries,
        "compression": settings.compression,
        "client_id": o.client_id,
    }
    return json.dumps(body), write_id


def write(df: Any, plan_option: str, write_id: str) -> list[dict[str, Any]]:
    """Write ``df`` with the carrier; the tasks' reports (one per Kafka partition a task
    wrote: topic, partition, rows, written, skipped, last_sequence)."""
    df.write.format(CARRIER).mode("append").option("plan", plan_option).save()
    reports = df.sparkSession._jvm.pidctl.spark.KafkaCarrier.reports(write_id)
    return list(json.loads(reports)) if reports else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kafka-clients", type=Path, metavar="JAR", help="kafka-clients jar")
    args = parser.parse_args(argv)
    try:
        print(build(args.kafka_clients))
    except CarrierUnavailable as e:
        print(f"pidctl.spark.carrier: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
