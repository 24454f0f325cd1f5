#!/usr/bin/env bash
# Stops the run started by launch.sh on every worker (the slice keeps running; the workdir
# keeps its checkpoints, so launch.sh resumes).
#
#   bash experiments/tpu/stop.sh v5p-32 [--dry-run]

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
on_workers all "test -f ~/legorl_train.pid && kill \$(cat ~/legorl_train.pid) 2>/dev/null; rm -f ~/legorl_train.pid; true"
