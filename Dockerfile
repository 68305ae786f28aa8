# pidctl: a Kafka producer-ID controller, as a sidecar image.
#   docker build -t pidctl .
#   docker run --rm -v pidctl-data:/data pidctl format      # once: a new cluster in the volume
#   docker run -p 9093:9093 -p 9464:9464 -v pidctl-data:/data \
#       -e PIDCTL_ADVERTISED_LISTENER=localhost:9093 pidctl
# `serve` starts only on a formatted /data: without the volume (or before `format`) it exits
# 2 saying so, rather than begin a new cluster that grants producer ids from 0 again. It
# listens on 0.0.0.0, and so starts only with PIDCTL_ADVERTISED_LISTENER, the HOST:PORT its
# clients reach it at (Kafka clients reconnect to the address it advertises): without it the
# container exits 2 saying so, rather than advertise its own hostname, which no client outside
# the container can reach.

# The wheel, built as a release is (python -m build): on Linux x86-64 it carries the request
# path compiled to C extensions by mypyc beside its sources (setup.py, ops/compiled.py), 30-45 %
# fewer instructions per request. mypyc type-checks what it compiles, so the build installs
# pidctl's dependencies for itself; the compiler stays in this stage.
FROM python:3.11-slim AS wheel
# Debian's compiler of the day: only what it builds reaches the image, and the tests build
# the same modules with theirs.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE ./
COPY protocol ./protocol
COPY controller ./controller
COPY ops/__init__.py ops/compiled.py ./ops/
COPY ops/client ./ops/client
COPY ops/broker ./ops/broker
COPY ops/spark ./ops/spark
RUN pip install --no-cache-dir build==1.2.2 \
    && python -m build --wheel --outdir /dist

FROM python:3.11-slim

# No .pyc files in the image, unbuffered logs straight to the container runtime.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# What ships, and nothing else: the wheel (the test harnesses and benchmarks are not in it).
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install /tmp/dist/pidctl-*.whl \
    && rm -rf /tmp/dist \
    && pidctl --version \
    && useradd --system --uid 10001 --home-dir /data --shell /usr/sbin/nologin pidctl \
    && mkdir -p /data \
    && chown pidctl:pidctl /data

# The settings a container needs; everything else keeps its embedded default and can be
# overridden with more PIDCTL_* variables or a mounted --config file.
ENV PIDCTL_LISTEN=0.0.0.0:9093 \
    PIDCTL_METRICS_LISTEN=0.0.0.0:9464 \
    PIDCTL_DATA_DIR=/data

USER 10001:10001
VOLUME ["/data"]
EXPOSE 9093 9464

# Ready means: log recovered and the Kafka listener bound.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9464/readyz', timeout=2)"]

# Exec form: SIGTERM from the runtime reaches pidctl, which finishes in-flight requests,
# flushes the log and exits 0.
ENTRYPOINT ["pidctl"]
CMD ["serve"]
