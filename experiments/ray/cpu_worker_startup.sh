#!/usr/bin/env bash
# Start-up script of a CPU VM that runs trials for a Ray cluster (experiments/ray/README.md).
# Reads the head's address (HOST:6379) from the instance metadata key `ray-head`, installs the
# sandbox pieces, this package with its Ray extra and the mini-swe-agent harness, then joins
# the cluster offering every core for local (bubblewrap) trials and as many `sandbox` slots
# (one Docker trial each). Runs as root at every boot; idempotent.
set -euo pipefail

META=http://metadata.google.internal/computeMetadata/v1/instance/attributes
HEAD=$(curl -fsS -H 'Metadata-Flavor: Google' "$META/ray-head")
REPO_URL=${REPO_URL:-https://github.com/legorl/legorl_jax.git}
REF=${REF:-main}
VENV=/opt/legorl-venv
SRC=/opt/legorl_jax

export DEBIAN_FRONTEND=noninteractive
if [ ! -d "$SRC" ]; then
  apt-get update -qq
  apt-get install -y -qq git python3-venv python3-pip curl >/dev/null
  git clone --depth=1 --branch "$REF" "$REPO_URL" "$SRC"
fi
bash "$SRC/.ci/setup_system.sh"          # bubblewrap, python3-pytest, dockerd
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q -e "$SRC[ray]"
(cd "$SRC" && "$VENV/bin/python" -m legorl_jax.harnesses.install mini-swe-agent)

CPUS=$(nproc)
"$VENV/bin/ray" stop --force >/dev/null 2>&1 || true
"$VENV/bin/ray" start --address="$HEAD" --num-cpus="$CPUS" \
    --resources="{\"sandbox\": $CPUS}"
