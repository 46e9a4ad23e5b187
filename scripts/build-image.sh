#!/usr/bin/env bash
# Builds voxrt's image (Containerfile) where no image registry is reachable: Debian's buildah
# and debootstrap (installed when missing, as root), a bookworm minbase made here and imported
# as the base image, torch's CPU wheel fetched into wheels/ by pip (from the local wheel
# directory, or TORCH_INDEX). Prints the image's size and the build time.
#   IMAGE=localhost/voxrt:latest MODELS="whisper-tiny.en whisper-base" bash scripts/build-image.sh
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${IMAGE:-localhost/voxrt:latest}
MODELS=${MODELS:-whisper-tiny.en}
TORCH_INDEX=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
BASE_IMAGE=localhost/voxrt-base:bookworm
BUILDAH=(buildah --storage-driver vfs)
started=$(date +%s)

need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! "${BUILDAH[@]}" inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
    # The mirror apt already uses (deb822 sources first, then sources.list).
    mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
    mirror=${mirror:-$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)}
    rootfs=$(mktemp -d)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase bookworm "$rootfs" "${mirror:-http://deb.debian.org/debian}" >/dev/null
    container=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" copy "$container" "$rootfs" / >/dev/null
    "${BUILDAH[@]}" commit -q "$container" "$BASE_IMAGE" >/dev/null
    "${BUILDAH[@]}" rm "$container" >/dev/null
fi

mkdir -p wheels
# The CPU wheel from pip's own wheel directory where it has one, else from TORCH_INDEX.
wheel=(python3 -m pip download -q --no-deps --only-binary :all: -d wheels "torch==2.13.0+cpu")
if "${wheel[@]}" --no-index 2>/dev/null; then
    TORCH_INDEX=""  # the build finds it in wheels/
else
    "${wheel[@]}" --extra-index-url "$TORCH_INDEX"
fi
# resemblyzer's webrtcvad comes as source only: built here, where a compiler is, for the
# image's Python (bookworm's 3.11, as this machine's).
python3 -m pip wheel -q --no-deps -w wheels webrtcvad==2.0.10
# pip in the build verifies TLS with this machine's certificates (a proxy's CA may be among them).
cp /etc/ssl/certs/ca-certificates.crt wheels/ca-certificates.crt
"${BUILDAH[@]}" bud -q --isolation chroot --format docker --layers=false \
    --build-arg BASE="$BASE_IMAGE" --build-arg MODELS="$MODELS" --build-arg PIP_CERT=/wheels/ca-certificates.crt \
    --build-arg TORCH_INDEX="$TORCH_INDEX" \
    -t "$IMAGE" -f Containerfile . >/dev/null
# vfs keeps every image whole: the one this build replaced goes (2 GB each).
"${BUILDAH[@]}" rmi --prune >/dev/null 2>&1 || true
echo "built $IMAGE (models: $MODELS) in $(($(date +%s) - started)) s; $("${BUILDAH[@]}" images --format '{{.Size}}' "$IMAGE") uncompressed"
