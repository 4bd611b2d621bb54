# syntax=docker/dockerfile:1
# Turnstile: one image for `turnstile migrate`, `turnstile worker` and `turnstile serve`.
# docs/operations.md ("Container image") explains the choices; compose.yaml runs all three.

FROM python:3.11-slim AS build

# Optional model SDKs installed with the package (empty for the scripted model only).
ARG EXTRAS=openai,anthropic

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The package goes into a virtual environment of its own, copied whole into the final stage,
# so neither the source tree nor pip's build dependencies end up in the image.
RUN python -m venv /opt/turnstile
COPY . /src
# pip takes "/src[]" for a path that does not exist, so an empty EXTRAS drops the brackets.
RUN /opt/turnstile/bin/pip install "/src${EXTRAS:+[$EXTRAS]}"


FROM python:3.11-slim

ENV PATH=/opt/turnstile/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# A numeric user, so that Kubernetes' runAsNonRoot can verify it without a passwd lookup.
RUN groupadd --system --gid 10001 turnstile \
    && useradd --system --uid 10001 --gid turnstile --home-dir /app --shell /usr/sbin/nologin turnstile \
    && mkdir /app \
    && chown turnstile:turnstile /app

COPY --from=build /opt/turnstile /opt/turnstile

WORKDIR /app
USER 10001:10001

# serve's --port and worker's --health-port, as compose.yaml and docs/operations.md use them.
EXPOSE 8080 9090

# Liveness only (no database): a worker or a server on another port sets HEALTHCHECK_URL, and
# the probe ignores proxy variables, which must not route a loopback request.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as r; r.build_opener(r.ProxyHandler({})).open(os.environ.get('HEALTHCHECK_URL', 'http://127.0.0.1:8080/healthz'), timeout=4)"]

ENTRYPOINT ["turnstile"]
CMD ["--help"]
