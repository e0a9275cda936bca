# The slorouter image the Helm chart (deploy/helm/slorouter) runs: `slorouter epp`, and the predictor's
# training and prediction servers, from one image. Build from the repository root:
#   docker build -t "$REGISTRY/slorouter:0.1.0" .   (then push it; docs/deploy.md, step 1)

FROM python:3.11-slim AS build
WORKDIR /src
# Exactly the tested versions (requirements.lock) in a virtual environment that the next stage copies.
COPY requirements.lock pyproject.toml README.md ./
COPY src ./src
# opentelemetry-proto goes in again, alone: xds-protos ships a stale copy of its modules under the same
# import path, and whichever is installed last wins (grpc/grpc#42926).
RUN python -m venv /opt/slorouter \
    && /opt/slorouter/bin/pip install --no-cache-dir --no-compile -c requirements.lock ".[tracing]" \
    && /opt/slorouter/bin/pip install --no-cache-dir --no-compile --no-deps --force-reinstall \
        -c requirements.lock opentelemetry-proto

FROM python:3.11-slim
RUN groupadd --system --gid 10001 slorouter \
    && useradd --system --uid 10001 --gid slorouter --no-create-home --home-dir /tmp slorouter
COPY --from=build /opt/slorouter /opt/slorouter
# Nothing is written beside the code: the chart mounts the root filesystem read-only, with /tmp,
# the model and state directories on emptyDir volumes.
ENV PATH=/opt/slorouter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp
USER 10001:10001
# ext_proc gRPC, gRPC health, metrics; the training server and the first prediction server.
EXPOSE 9002 9003 9090 8000 8001
ENTRYPOINT ["slorouter"]
CMD ["--help"]
