#!/usr/bin/env bash
# Streams the training log of one worker (default 0, the one that prints metrics).
#
#   bash experiments/tpu/logs.sh v5p-32 [--worker=0|all] [--dry-run]

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
on_workers "$WORKER" "tail -n 200 -F ~/legorl_train.log"
