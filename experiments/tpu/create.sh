#!/usr/bin/env bash
# Creates a Cloud TPU VM or multi-host slice.
#
#   bash experiments/tpu/create.sh v5e-8 [--name=NAME] [--zone=ZONE] [--project=P] [--spot] [--dry-run]
#
# Accelerator type, TPU software version and the default zone come from experiments/tpu/slices.py.
# --spot asks for Spot capacity (cheaper, can be reclaimed: training resumes from its checkpoint).

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"

args=(--accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION")
((SPOT)) && args+=(--spot)
tpu_vm create "$TPU_NAME" "${args[@]}"
echo "# $TPU_NAME: $ACCELERATOR_TYPE, $NUM_WORKERS worker(s) in $ZONE; next: setup.sh $TPU_TYPE" >&2
