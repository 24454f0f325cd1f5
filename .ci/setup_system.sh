#!/usr/bin/env bash
# Installs and starts the system pieces the sandbox tests need: bubblewrap (local sandbox),
# debootstrap (rootfs for the Docker base image), a Docker engine (dockerd, overlay2) and
# pytest for the system python3 (the local sandbox's verifier of pytest-graded tasks).
# Idempotent: safe to run again on a machine that already has everything.
set -euo pipefail

need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v git >/dev/null 2>&1 || need+=(git)
command -v tar >/dev/null 2>&1 || need+=(tar)
command -v tmux >/dev/null 2>&1 || need+=(tmux)          # OpenHands' terminal tool
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # dashboard render test
# The local sandbox grades pytest tasks with the system python3 (the one its PATH finds).
/usr/bin/python3 -c 'import pytest' >/dev/null 2>&1 || need+=(python3-pytest)
if [ "${#need[@]}" -gt 0 ]; then
  echo "setup_system: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" ca-certificates iptables >/dev/null
fi

docker_ok() { timeout 10 docker info >/dev/null 2>&1; }

if ! docker_ok; then
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "setup_system: starting dockerd"
    mkdir -p /var/log
    setsid nohup dockerd --storage-driver=overlay2 >/var/log/dockerd.log 2>&1 </dev/null &
  fi
  for _ in $(seq 1 60); do
    docker_ok && break
    sleep 1
  done
  if ! docker_ok; then
    echo "setup_system: dockerd did not come up; last log lines:" >&2
    tail -n 30 /var/log/dockerd.log >&2 || true
    exit 1
  fi
fi
echo "setup_system: bwrap $(bwrap --version 2>/dev/null | head -1), $(docker version --format 'docker server {{.Server.Version}}' 2>/dev/null)"

# The Docker sandbox's base image (legorl_jax/sandbox/images.py): its debootstrap rootfs
# (~45 s, cached under ~/.cache/legorl_jax/images), built here rather than inside the first
# Docker test. Runs from the checkout like the installer below.
python -m legorl_jax.sandbox.images

# Harness CLIs, each in its own virtualenv / npm prefix (idempotent; pinned in
# legorl_jax/harnesses/install.py). Runs from the checkout, before the package is installed.
python -m legorl_jax.harnesses.install all
