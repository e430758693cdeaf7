# The server image used by k8s/base/deployment.yaml: `docker build -t pvwire:0.1.0 .`
#
# page:    Node builds the demo page (clients/ts -> server/pvwire/static) and installs the exact
#          GraphiQL files of server/graphiql/package-lock.json.
# wheel:   gathers the runtime lock's wheels (building those the index has none of for this
#          Python: bitshuffle), vendors those GraphiQL files next to the server (their hashes
#          come from strawberry, so this needs Python) and builds pvwire's wheel (setup.py
#          compiles the PVA monitor module with Debian's g++, against the runtime lock's
#          pvxslibs) with the page, GraphiQL and that module inside, tagged for this platform.
# runtime: only the runtime lock (requirements-runtime.lock, no dev tools) and that wheel,
#          installed from the wheel stage's files: no compiler, no index.
#
# The base images are arguments: where no public registry is reachable, `make image` makes
# stand-ins from Debian's packages (scripts/base_images.sh) and passes them here. Their Python is
# Debian's, with a virtual environment over it in /usr/local: nothing below names a path.

# Debian 13 (trixie): its Python is 3.13, and Node 22 is the project's default LTS line.
ARG NODE_IMAGE=node:22-trixie-slim
ARG PYTHON_IMAGE=python:3.13-slim-trixie

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
# Python's headers come with the official image; Debian's Python keeps them in libpythonX.Y-dev
# (named or not: the unquoted $(...) is meant to give no word at all).
# hadolint ignore=DL3008,SC2046
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ $(python -c "import sysconfig, os, sys; \
        print('' if os.path.exists(sysconfig.get_path('include') + '/Python.h') \
        else 'libpython%d.%d-dev' % sys.version_info[:2])") \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY requirements-runtime.lock ./
# Every runtime wheel in /wheels for the runtime stage, then installed here: the wheel is built in
# this environment (no isolated one), so its module is compiled against exactly those EPICS wheels.
RUN pip wheel --no-cache-dir --wheel-dir /wheels -r requirements-runtime.lock \
    && pip install --no-cache-dir --no-index --find-links /wheels -r requirements-runtime.lock
COPY pyproject.toml setup.py MANIFEST.in README.md LICENSE ./
COPY scripts/build_ext.py ./scripts/
COPY server ./server
COPY --from=page /src/server/pvwire/static ./server/pvwire/static
COPY --from=page /src/server/graphiql/node_modules ./server/graphiql/node_modules
RUN PYTHONPATH=server python server/graphiql/vendor.py \
    && pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY requirements-runtime.lock ./
# pvwire's wheel is copied: podman 4.3 keeps a RUN that mounts another stage cached when only that
# stage changed, and so installed a stale pvwire into every image after the first; a copy is
# made again whenever the wheel differs (its layer keeps the wheel, a few MB). The runtime
# wheels are mounted, not copied (no layer keeps them): the lock copied above keys that RUN.
COPY --from=wheel /dist/ /tmp/dist/
RUN --mount=type=bind,from=wheel,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels -r requirements-runtime.lock \
    && pip install --no-cache-dir --no-index --no-deps /tmp/dist/pvwire-*.whl \
    && rm -rf /tmp/dist
USER 10001
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8080/healthz', timeout=4)"]
ENTRYPOINT ["pvwire-server"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
