#!/usr/bin/env bash
# Deletes the TPU VM / slice (billing stops; anything not in the gs:// workdir is lost).
#
#   bash experiments/tpu/delete.sh v5p-32 [--name=NAME] [--dry-run]

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
tpu_vm delete "$TPU_NAME" --quiet
