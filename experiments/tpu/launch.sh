#!/usr/bin/env bash
# Starts experiments.train on every worker of the slice at once (one JAX process per host).
#
#   bash experiments/tpu/launch.sh v5p-32 --workdir=gs://BUCKET/runs/NAME [--follow] [--dry-run] \
#       [-- --config.trainer.steps=50 ...]
#
# The run keeps going after ssh returns (nohup); its output is in ~/legorl_train.log on each
# worker (logs.sh streams it). Launching again with the same --workdir resumes from the latest
# checkpoint. Flags after `--` go to experiments.train.

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
[[ -n "$WORKDIR" ]] || die "--workdir is required (a gs://BUCKET/path shared by all workers)"
if ((NUM_WORKERS > 1)) && [[ "$WORKDIR" != gs://* ]]; then
  die "a $NUM_WORKERS-host slice needs a shared --workdir (gs://...), got '$WORKDIR'"
fi

train=(python -m experiments.train --config="$CONFIG" --workdir="$WORKDIR"
       "--config.model.checkpoint=\$HOME/$MODEL_DIR" "${EXTRA[@]}")
printf -v train_cmd '%q ' "${train[@]}"
train_cmd=${train_cmd//\\\$HOME/\$HOME}   # keep $HOME for the remote shell to expand

remote="cd ~/$REMOTE_REPO && . ~/$REMOTE_VENV/bin/activate && \
(test -f ~/legorl_train.pid && kill -0 \$(cat ~/legorl_train.pid) 2>/dev/null && \
echo 'a run is already going: stop.sh first' && exit 1 || true) && \
nohup ${train_cmd% } > ~/legorl_train.log 2>&1 < /dev/null & echo \$! > ~/legorl_train.pid"

on_workers all "$remote"
echo "# started on $NUM_WORKERS worker(s) of $TPU_NAME; logs: logs.sh $TPU_TYPE" >&2
if ((FOLLOW)); then
  exec bash "$HERE/logs.sh" "$TPU_TYPE" --name="$TPU_NAME" --zone="$ZONE" \
    ${PROJECT:+--project="$PROJECT"} $([[ "$DRY_RUN" == 1 ]] && echo --dry-run)
fi
