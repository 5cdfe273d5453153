# syntax=docker/dockerfile:1
# One image for both daemons: `runner server` (the controller, the default) or `runner agent` (the node agent,
# e.g. the Kubernetes sidecar in deploy/kubernetes/). Build: docker build -t runner .
FROM python:3.11-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY agents ./agents
# Wheels for the package and every dependency (the cloud SDKs the controller uses included).
RUN pip wheel --no-deps --wheel-dir /wheels . \
 && pip wheel --wheel-dir /wheels "$(ls /wheels/spot_runner-*.whl)[aws,gcp]"

FROM python:3.11-slim
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    RUNNER_HOME=/var/lib/runner
# The wheels are bind-mounted from the build stage, so no layer keeps a copy of them.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "$(ls /wheels/spot_runner-*.whl)[aws,gcp]" \
 && useradd --uid 10001 --user-group --home-dir /var/lib/runner --no-create-home --shell /usr/sbin/nologin runner \
 && install -d -o 10001 -g 10001 -m 0700 /var/lib/runner /var/lib/runner/scratch
COPY --chmod=0755 deploy/healthcheck.py /usr/local/bin/runner-healthcheck
# Numeric, so Kubernetes can enforce runAsNonRoot. The controller's state (RUNNER_HOME) belongs on a volume.
USER 10001:10001
WORKDIR /var/lib/runner
EXPOSE 8470
# The controller: its API answers /v1/health. The agent: its control channel accepts a connection (a
# sidecar opens it at once; a supervising agent once registered, which it tries for 5 minutes, hence the
# 6-minute start period).
HEALTHCHECK --interval=30s --timeout=5s --start-period=6m --retries=3 CMD ["runner-healthcheck"]
ENTRYPOINT ["runner"]
CMD ["server", "--host", "0.0.0.0"]
