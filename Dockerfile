# One image for every callgate process of docker-compose.yml (migrate, worker, relayer,
# sweeper); the command picks the process: `docker run callgate:local worker`.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# The code is all in callgate/; the checkout's top-level producer/, worker/, store/ and ops/
# are links into it for readers, and the build needs none of them.
COPY pyproject.toml README.md LICENSE ./
COPY callgate ./callgate
# The api extra: `callgate api` (the HTTP API and the approval console) runs from this image too;
# the otel extra: every process exports traces when OTEL_EXPORTER_OTLP_ENDPOINT is set.
RUN pip install '.[api,otel]' \
    && useradd --system --no-create-home callgate

USER callgate
WORKDIR /tmp
# /metrics (CALLGATE_METRICS_PORT=9100 in docker-compose.yml).
EXPOSE 9100
ENTRYPOINT ["callgate"]
CMD ["--help"]
