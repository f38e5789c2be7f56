# syntax=docker/dockerfile:1
# specgate container images. Build from the repository root:
#   docker build -t specgate:0.1.0 .                                        # runtime (default)
#   docker build --target gateway-only -t specgate-gateway:0.1.0 .          # gateway only
#
# runtime      SGLang 0.5.23 (CUDA 13) + specgate: `specgate serve` starts and supervises the
#              EAGLE-3 and the plain SGLang server itself ([launch] engine = "sglang").
# gateway-only A slim image with the gateway alone, for SGLang servers running elsewhere
#              ([[backends]] tables) or for the simulated backends ([launch] engine = "sim").
# Both run `specgate serve --config /etc/specgate/specgate.toml`; mount the config there.

# SGLang's release workflow tags each release lmsysorg/sglang:v<version> (its default CUDA build)
# and v<version>-cu130 (CUDA 13.0), each also as a leaner -runtime variant without the build
# toolchain (compilers, dev headers, profilers). sglang 0.5.23's wheels are a CUDA 13 stack (torch 2.14,
# cuda-python>=13, flashinfer cu13), so the cu130 runtime variant is the matching image. It needs
# a host driver that supports CUDA 13.0 (R580 or newer).
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130-runtime
# Same Python minor as the SGLang image, so both targets run specgate on one interpreter version.
ARG PYTHON_IMAGE=python:3.12.12-slim-trixie

# ---- specgate's wheel, built once for both targets ------------------------------------------
FROM ${PYTHON_IMAGE} AS wheel
# A C compiler for gateway/relay/_sse.c, the relay's per-read check (3 us of CPU a relayed chunk less).
# The wheel builds without one too (pure Python), so the check after it makes sure the image has it.
# The compiler is whatever the base image's Debian release ships: this stage is thrown away.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md hatch_build.py ./
COPY specgate ./specgate
COPY gateway ./gateway
COPY backends ./backends
COPY loadtest ./loadtest
COPY tokencount ./tokencount
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist . \
 && python -c "import glob, sys, zipfile; names = zipfile.ZipFile(glob.glob('/dist/*.whl')[0]).namelist(); sys.exit(not any(n.startswith('gateway/relay/_sse.') and n.endswith('.so') for n in names))"

# ---- gateway-only ------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS gateway-venv
COPY --from=wheel /dist /dist
# The wheel pins every dependency to an exact version (pyproject.toml).
RUN python -m venv /opt/specgate \
 && /opt/specgate/bin/pip install --no-cache-dir /dist/specgate-*.whl

FROM ${PYTHON_IMAGE} AS gateway-only
# The venv comes first on PATH; simulated backends run on the same interpreter as the gateway.
ENV PATH=/opt/specgate/bin:${PATH} \
    PYTHONUNBUFFERED=1
COPY --from=gateway-venv /opt/specgate /opt/specgate
# Group 0 lets platforms that run containers under an arbitrary UID (OpenShift) use the image too.
RUN useradd --no-log-init --uid 10001 --gid 0 --no-create-home --shell /usr/sbin/nologin specgate \
 && mkdir -p /etc/specgate
USER 10001:0
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["specgate", "serve", "--config", "/etc/specgate/specgate.toml"]
CMD []

# ---- runtime: SGLang + specgate ------------------------------------------------------------------
# specgate gets its own venv: SGLang pins its own fastapi, uvicorn, pydantic, aiohttp and orjson,
# and installing specgate's pins into the same site-packages would change what SGLang runs on.
# The venv is built on the SGLang image so it links the very interpreter the runtime stage has.
FROM ${SGLANG_IMAGE} AS sglang-venv
COPY --from=wheel /dist /dist
# --without-pip: Ubuntu's Python may lack ensurepip; the image's own pip installs into the venv.
RUN python3 -m venv --without-pip /opt/specgate \
 && python3 -m pip --python /opt/specgate/bin/python install --no-cache-dir /dist/specgate-*.whl

FROM ${SGLANG_IMAGE} AS runtime
# SGLang's images run as root by default, but SGLang itself does not need root. A non-root user
# needs writable caches (Triton, FlashInfer JIT, torch inductor, Hugging Face), so they all point
# under /var/cache/specgate (mount a volume there to keep compiled kernels across restarts), and
# FlashInfer's bundled cubin package, where FlashInfer creates symlinks at run time for some
# kernels (FP4/FP8 MoE), gets group-writable directories. /dev/shm must be large (ipc: host or
# shm_size) for SGLang's tensor-parallel workers.
ENV HOME=/home/specgate \
    XDG_CACHE_HOME=/var/cache/specgate \
    HF_HOME=/var/cache/specgate/huggingface \
    TRITON_CACHE_DIR=/var/cache/specgate/triton \
    TORCHINDUCTOR_CACHE_DIR=/var/cache/specgate/torchinductor \
    FLASHINFER_WORKSPACE_BASE=/var/cache/specgate \
    PYTHONUNBUFFERED=1
COPY --from=sglang-venv /opt/specgate /opt/specgate
# Only the `specgate` command goes on PATH: `python3` must stay SGLang's interpreter, since the
# launcher starts `python3 -m sglang.launch_server` ([launch] python).
RUN useradd --no-log-init --uid 10001 --gid 0 --create-home --home-dir /home/specgate --shell /usr/sbin/nologin specgate \
 && mkdir -p /var/cache/specgate /etc/specgate \
 && chown -R 10001:0 /var/cache/specgate /home/specgate \
 && chmod -R g+rwX /var/cache/specgate /home/specgate \
 && ln -s /opt/specgate/bin/specgate /usr/local/bin/specgate \
 && cubins="$(python3 -c 'import pathlib, flashinfer_cubin; print(pathlib.Path(flashinfer_cubin.__file__).parent / "cubins")' 2>/dev/null || true)" \
 && if [ -n "${cubins}" ] && [ -d "${cubins}" ]; then find "${cubins}" -type d -exec chmod g+w {} +; fi
WORKDIR /home/specgate
USER 10001:0
EXPOSE 8000
# Loading a large model and capturing CUDA graphs for both servers takes many minutes; /health
# answers only once a backend can serve.
HEALTHCHECK --interval=30s --timeout=5s --start-period=40m --retries=3 \
  CMD ["/opt/specgate/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]
ENTRYPOINT ["specgate", "serve", "--config", "/etc/specgate/specgate.toml"]
CMD []
