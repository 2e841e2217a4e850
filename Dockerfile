# The durable-sandbox operator image: `dsb operator` (kopf) in a Python virtualenv on Debian bookworm.
#
#   docker build -t durable-sandbox:0.1.0 .          (or: buildah bud -t durable-sandbox:0.1.0 .)
#
# Stages: `build` makes the wheel and installs it with its dependencies into /opt/durable-sandbox;
# the final stage has Debian's python3 and that virtualenv, nothing else (no pip, no compilers, no caches,
# no apt lists). It runs as the numeric non-root UID 10001, so Kubernetes' runAsNonRoot can verify it.
#
# Corporate networks: the standard proxy build args (http_proxy, https_proxy, no_proxy) are passed to
# apt and pip; PIP_INDEX_URL / PIP_EXTRA_INDEX_URL point pip at a mirror; PIP_CERT names a CA bundle that
# the build can read (for example a file bind-mounted into the build with `buildah bud --volume`).
# The tests build this same file: scripts/image-build.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim

FROM ${BASE_IMAGE} AS python
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*

# The runtime requirements (dependencies + the `kubernetes` and `otel` extras: traces, chart value `tracing`), extracted from pyproject.toml in a stage
# of their own: the build stage copies only this list, so a pyproject.toml change that leaves them alone
# (test extras, tool settings) does not download every dependency again.
FROM python AS requirements
COPY pyproject.toml /src/pyproject.toml
RUN python3 -c 'import tomllib; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + p["optional-dependencies"]["kubernetes"] + p["optional-dependencies"]["otel"]))' > /requirements.txt

FROM python AS build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_CERT
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
COPY --from=requirements /requirements.txt /tmp/requirements.txt
RUN python3 -m venv /opt/durable-sandbox \
 && /opt/durable-sandbox/bin/pip install -r /tmp/requirements.txt
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN /opt/durable-sandbox/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/durable-sandbox/bin/pip install --no-deps /wheels/*.whl \
 && /opt/durable-sandbox/bin/pip check \
 && /opt/durable-sandbox/bin/pip uninstall -y pip setuptools wheel \
 && find /opt/durable-sandbox -name '__pycache__' -prune -exec rm -rf {} + \
 && /opt/durable-sandbox/bin/python -m compileall -q -j 0 /opt/durable-sandbox/lib

FROM ${BASE_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
# python3 only (python3-minimal, the standard library); apt's lists, caches and logs are removed in the
# same layer so they never reach the image.
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
 && groupadd --gid 10001 dsb \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/durable-sandbox --no-create-home \
      --shell /usr/sbin/nologin dsb \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/durable-sandbox
COPY --from=build /opt/durable-sandbox /opt/durable-sandbox
# The root filesystem may be read-only (the Helm chart mounts writable emptyDirs at /tmp and at
# DURABLE_SANDBOX_HOME): bytecode is precompiled above and never written at run time.
ENV PATH=/opt/durable-sandbox/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DURABLE_SANDBOX_HOME=/var/lib/durable-sandbox \
    HOME=/var/lib/durable-sandbox
USER 10001:10001
WORKDIR /var/lib/durable-sandbox
# Metrics (/metrics) and liveness (/healthz) share one port.
EXPOSE 8080
ENTRYPOINT ["dsb", "operator"]
# Last, so a new revision or date does not invalidate the cached layers above.
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="durable-sandbox" \
      org.opencontainers.image.description="Kubernetes operator for durable AI-agent workflows against sandboxes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
