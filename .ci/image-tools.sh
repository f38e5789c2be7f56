#!/usr/bin/env bash
# Install podman and make the Python base image the image checks (tests/image, marker `image`) build on.
#
#   usage: .ci/image-tools.sh        prints the base image's tag on its last line
#   then:  SPECGATE_IMAGE_BASE=<tag> pytest -m image
#
# No image registry is reachable here, so the Dockerfile's PYTHON_IMAGE (python:3.12-slim-trixie)
# cannot be pulled. Its stand-in is made from Debian packages: mmdebstrap builds a minimal Debian
# trixie root file system with Python 3.13, pip, venv and Python's headers, as the official image
# has them (about 30 s on an idle machine, 80 s on a busy one; a 250 MB tar), and `podman import`
# turns it into an image. The tar is kept under ~/.cache/specgate, named for its package list, and
# reused for a week; delete it to rebuild sooner.
#
# Podman's setup on these machines (Debian 12, run as root):
#   - rootful podman with the overlay storage driver and netavark networking. netavark needs iptables
#     for published ports (`-p 127.0.0.1:PORT:8000`), aardvark-dns for service names on compose
#     networks. The CNI warning about /etc/cni/net.d/87-podman-bridge.conflist is harmless: podman
#     uses netavark.
#   - runc, not crun: crun refuses the hybrid cgroup layout of some of these sandboxes, so every
#     container is started with `--runtime runc` (and runc is the only runtime installed here).
#   - where the sandbox lacks CAP_SYS_RESOURCE, a container may not raise its own limits, so the checks
#     pass explicit `--ulimit nofile=1024:1024 --ulimit nproc=1024:1024`.
set -euo pipefail

tag=${SPECGATE_IMAGE_BASE:-localhost/specgate-python:trixie}
cache=${SPECGATE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specgate}
include=python3,python3-venv,python3-pip,python3-dev,python-is-python3,ca-certificates
tar="$cache/python-base-trixie-$(printf '%s' "$include" | sha256sum | cut -c1-12).tar"
# netavark + iptables: published ports; aardvark-dns: service names on compose networks; catatonit:
# podman's init. uidmap, slirp4netns and fuse-overlayfs serve rootless podman (the checks run as root).
packages=(podman runc mmdebstrap netavark aardvark-dns iptables catatonit uidmap slirp4netns fuse-overlayfs)

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
podman --version
runc --version | head -n1

mkdir -p "$cache"
if [[ ! -s $tar ]] || [[ -z $(find "$tar" -mtime -7) ]]; then
    started=$SECONDS
    rm -f "$tar.partial"
    mmdebstrap --quiet --format=tar --variant=minbase \
        --include="$include" \
        trixie "$tar.partial"
    mv "$tar.partial" "$tar"
    podman rmi --ignore "$tag" >/dev/null
    echo "image-tools: made $tar in $((SECONDS - started)) s"
fi
if ! podman image exists "$tag"; then
    podman import --quiet --change 'CMD ["python3"]' "$tar" "$tag" >/dev/null
fi
version=$(podman run --rm --runtime runc --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 "$tag" python --version)
echo "image-tools: base $tag, $version"
echo "$tag"
