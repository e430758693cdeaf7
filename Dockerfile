# The server image used by k8s/base/deployment.yaml: `docker build -t pvwire:0.1.0 .`
#
# page:    Node builds the demo page (clients/ts -> server/pvwire/static) and installs the exact
#          GraphiQL files of server/graphiql/package-lock.json.
# wheel:   vendors those GraphiQL files next to the server (their hashes come from strawberry,
#          so this needs Python) and builds pvwire's wheel (setup.py compiles the PVA monitor
#          module with Debian's g++, against the runtime lock's pvxslibs) with the page, GraphiQL
#          and that module inside, tagged for this platform.
# runtime: only the runtime lock (requirements-runtime.lock, no dev tools) and that wheel.
#
# The base images are arguments: where no public registry is reachable, `make image` makes
# stand-ins from Debian's packages (scripts/base_images.sh) and passes them here. Their Python is
# Debian's, in /usr/bin (the official image's is in /usr/local/bin): nothing below names a path.

ARG NODE_IMAGE=node:20-bookworm-slim
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${NODE_IMAGE} AS page
WORKDIR /src/clients/ts
COPY clients/ts/package.json clients/ts/package-lock.json ./
RUN npm ci --no-audit --no-fund
WORKDIR /src/server/graphiql
COPY server/graphiql/package.json server/graphiql/package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts --legacy-peer-deps
WORKDIR /src/clients/ts
# The client's code table is generated from the protocol's close-code table at build time.
COPY protocol/close_codes.json /src/protocol/close_codes.json
COPY clients/ts ./
RUN npm run build

FROM ${PYTHON_IMAGE} AS wheel
# The compiler is the base image's Debian release's; the module's ABI follows the pinned pvxslibs.
# Python's headers come with the official image; Debian's Python keeps them in libpython3.11-dev
# (named or not: the unquoted $(...) is meant to give no word at all).
# hadolint ignore=DL3008,SC2046
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ $(python -c "import sysconfig, os; \
        print('' if os.path.exists(sysconfig.get_path('include') + '/Python.h') else 'libpython3.11-dev')") \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements-runtime.lock ./
# The wheel is built in this environment (no isolated one): its module is then compiled against
# exactly the EPICS wheels the runtime stage installs. wheel: requirements.lock's, which
# setuptools 65 builds wheels with.
RUN pip install --no-cache-dir -r requirements-runtime.lock wheel==0.45.1
COPY pyproject.toml setup.py MANIFEST.in README.md ./
COPY scripts/build_ext.py ./scripts/
COPY server ./server
COPY --from=page /src/server/pvwire/static ./server/pvwire/static
COPY --from=page /src/server/graphiql/node_modules ./server/graphiql/node_modules
RUN PYTHONPATH=server python server/graphiql/vendor.py \
    && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements-runtime.lock ./
RUN pip install --no-cache-dir -r requirements-runtime.lock
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["pvwire-server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
