# One image for the sidecar and the demo workload (the demo needs the `jax` extra, its
# host CPU profiles `host-profiling`).
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY exporter ./exporter
ARG EXTRAS=jax,host-profiling
RUN pip install ".[${EXTRAS}]"
RUN useradd --uid 10001 --create-home mlprof && mkdir -p /data && chown mlprof /data
USER 10001
ENV MLPROF_SHARED_DIR=/data/shared MLPROF_STORE=/data/store
EXPOSE 9464
ENTRYPOINT ["mlprof"]
CMD ["serve"]
