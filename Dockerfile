# One image for both daemons: `runner server` (the controller) or `runner agent` (the node agent).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY runner ./runner
COPY agents ./agents
RUN pip wheel --no-deps --wheel-dir /wheels . && pip wheel --wheel-dir /wheels "$(ls /wheels/runner-*.whl)[aws,gcp]"

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 runner
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER runner
ENV RUNNER_HOME=/home/runner/.runner
EXPOSE 8470
HEALTHCHECK --interval=30s --timeout=5s CMD python -c "import json,os,urllib.request as u; h=os.environ['RUNNER_HOME']; t=open(h+'/admin-token').read().strip(); u.urlopen(u.Request(json.load(open(h+'/controller.json'))['url']+'/v1/health', headers={'Authorization':'Bearer '+t}), timeout=4)" || exit 1
ENTRYPOINT ["runner"]
CMD ["server", "--host", "0.0.0.0"]
