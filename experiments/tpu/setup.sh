#!/usr/bin/env bash
# Installs legorl_jax on every worker of a TPU VM / slice: Python 3.11 venv with jax[tpu],
# the mini-swe-agent harness, Docker access for the sandboxes, and the model weights.
#
#   bash experiments/tpu/setup.sh v5e-8 [--source=local|git] [--repo-url=URL] [--ref=main] [--dry-run]
#
# --source=local (default) copies this working tree (without .git) to every worker;
# --source=git clones --repo-url at --ref instead.

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"

case "$SOURCE" in
  local)
    archive=${TMPDIR:-/tmp}/legorl_jax_src.tgz
    run tar --exclude=.git --exclude='*.pyc' --exclude=__pycache__ -czf "$archive" -C "$ROOT" .
    tpu_vm scp "$archive" "$TPU_NAME:legorl_jax_src.tgz" --worker=all
    fetch="rm -rf ~/$REMOTE_REPO && mkdir -p ~/$REMOTE_REPO && tar -xzf ~/legorl_jax_src.tgz -C ~/$REMOTE_REPO"
    ;;
  git)
    fetch="rm -rf ~/$REMOTE_REPO && git clone --depth 1 --branch $REF $REPO_URL ~/$REMOTE_REPO"
    ;;
  *) die "--source must be local or git, got '$SOURCE'" ;;
esac

# Runs on each worker (in parallel). uv provides Python 3.11 whatever the image's python is.
remote="set -euo pipefail
$fetch
command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh
export PATH=\$HOME/.local/bin:\$PATH
uv venv --python 3.11 --allow-existing ~/$REMOTE_VENV
uv pip install --python ~/$REMOTE_VENV/bin/python -e \"\$HOME/$REMOTE_REPO[tpu]\" gcsfs huggingface_hub
command -v docker >/dev/null || curl -fsSL https://get.docker.com | sudo sh
sudo systemctl start docker && sudo usermod -aG docker \$USER
cd ~/$REMOTE_REPO && ~/$REMOTE_VENV/bin/python -m legorl_jax.harnesses.install mini-swe-agent
~/$REMOTE_VENV/bin/python -c \"from huggingface_hub import snapshot_download; snapshot_download('$HF_MODEL', local_dir='\$HOME/$MODEL_DIR')\"
~/$REMOTE_VENV/bin/python -c 'import jax; print(jax.local_device_count(), jax.devices()[0].device_kind)'"

on_workers all "$remote"
echo "# installed on $NUM_WORKERS worker(s); next: launch.sh $TPU_TYPE --workdir=gs://BUCKET/run" >&2
