#!/usr/bin/env bash
# A GPU call carries the working tree (tracked files included) and its carry in 64 MiB; since session 25 the committed
# results under bench/results/ (48 MiB of tree) and .whl + the llama.cpp tarball (15 MiB) no longer fit together.
# The device runs none of the committed results: hold them out of the tree for the lease, then put them back.
#   bash bench/lease-tree.sh hold       # before the first call: moves bench/results/* but the newest lease folders
#   bash bench/lease-tree.sh restore    # after the last call (also after a cut-off session: or git checkout them)
set -euo pipefail
cd "$(dirname "$0")/.."
held=${LEASE_HOLD:-/tmp/crashline-lease-hold}
case ${1:-} in
hold)
  [ ! -e "$held" ] || { echo "$held exists: restore first" >&2; exit 2; }
  mkdir -p "$held"
  # keep what a lease's steps may read: the two newest lease folders (resume) and bench/results/README-like files
  keep=$(ls -d bench/results/lease-* 2>/dev/null | sort | tail -2 | tr "\n" " ")
  for d in bench/results/*/; do
    d=${d%/}
    case " $keep " in *" $d "*) continue ;; esac
    mv "$d" "$held/"
  done
  echo "held $(du -sh "$held" | cut -f1) in $held; tree now $(git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '/total$/ {s+=$1} END {printf "%.1f MiB", s/1048576}') of tracked files present"
  ;;
restore)
  [ -d "$held" ] || { echo "nothing held in $held" >&2; exit 2; }
  for d in "$held"/*/; do mv "${d%/}" bench/results/; done
  rmdir "$held"
  git status --short bench/results | grep '^ D' && { echo "tracked files still missing: git checkout -- bench/results" >&2; exit 1; } || true
  echo restored
  ;;
*) echo "usage: $0 hold|restore" >&2; exit 2 ;;
esac
