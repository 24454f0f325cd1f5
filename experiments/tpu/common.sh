# Shared by the Cloud TPU scripts (sourced, not run): flags, the slice table, dry-run.
#
# Every script takes the slice type first (v5e-8, v6e-8, v5p-32) and these flags:
#   --name=NAME        TPU VM name (default: legorl-TYPE, or $TPU_NAME)
#   --zone=ZONE        zone (default: the slice's zone in experiments/tpu/slices.py, or $ZONE)
#   --project=PROJECT  GCP project (default: gcloud's configured project, or $PROJECT)
#   --dry-run          print the commands instead of running them (also DRY_RUN=1)
# Anything after `--` is passed through (to experiments.train in launch.sh).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
DRY_RUN=${DRY_RUN:-0}
TPU_NAME=${TPU_NAME:-}
ZONE=${ZONE:-}
PROJECT=${PROJECT:-}
SPOT=0
WORKDIR=""
SOURCE="local"
REPO_URL="https://github.com/legorl/legorl_jax.git"
REF="main"
WORKER="0"
FOLLOW=0
EXTRA=()
TPU_TYPE=""

die() { echo "error: $*" >&2; exit 2; }

# parse_args ARGS...: fills the variables above; script-specific flags are accepted by all.
parse_args() {
  while (($#)); do
    case "$1" in
      --name=*) TPU_NAME=${1#*=} ;;
      --zone=*) ZONE=${1#*=} ;;
      --project=*) PROJECT=${1#*=} ;;
      --workdir=*) WORKDIR=${1#*=} ;;
      --source=*) SOURCE=${1#*=} ;;
      --repo-url=*) REPO_URL=${1#*=} ;;
      --ref=*) REF=${1#*=} ;;
      --worker=*) WORKER=${1#*=} ;;
      --spot) SPOT=1 ;;
      --follow) FOLLOW=1 ;;
      --dry-run) DRY_RUN=1 ;;
      -h|--help) sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      --) shift; EXTRA=("$@"); break ;;
      -*) die "unknown flag $1 (see --help)" ;;
      *) [[ -z "$TPU_TYPE" ]] || die "unexpected argument $1"; TPU_TYPE=$1 ;;
    esac
    shift
  done
  [[ -n "$TPU_TYPE" ]] || die "give the slice type first: one of v5e-8, v6e-8, v5p-32"
  local table
  table=$(cd "$ROOT" && python3 -m experiments.tpu.slices "$TPU_TYPE" 2>&1) \
    || die "unknown slice type '$TPU_TYPE' ($table)"
  eval "$table"
  TPU_NAME=${TPU_NAME:-legorl-$TPU_TYPE}
  ZONE=${ZONE:-$DEFAULT_ZONE}
  if [[ "$DRY_RUN" != 1 ]] && ! command -v gcloud >/dev/null 2>&1; then
    die "gcloud is not installed: see https://cloud.google.com/sdk/docs/install (or pass --dry-run)"
  fi
}

# quote ARG: single-quotes an argument for display when it holds shell metacharacters.
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@,+%^-]+$ ]]; then printf '%s' "$1"
  else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

# run CMD ARGS...: runs a command, or prints it (one line, copy-pasteable) under --dry-run.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    local out="" a
    for a in "$@"; do out+="$(quote "$a") "; done
    echo "${out% }"
  else
    "$@"
  fi
}

# tpu_vm SUBCOMMAND ARGS...: gcloud compute tpus tpu-vm with zone and project filled in.
tpu_vm() {
  local sub=$1; shift
  run gcloud compute tpus tpu-vm "$sub" "$@" --zone="$ZONE" ${PROJECT:+--project="$PROJECT"}
}

# on_workers WHICH COMMAND: runs a shell command on worker WHICH (a number or "all").
on_workers() {
  tpu_vm ssh "$TPU_NAME" --worker="$1" --command="$2"
}
