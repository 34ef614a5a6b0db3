#!/usr/bin/env bash
# A whole GPU lease as one chain of bench/device-session.sh steps that runs in the background on the machine, so
# that no step is cut at a call's 600 s limit and resumed (bench/device.md, session 16):
#   bash bench/device-chain.sh start 'COMMAND' 'COMMAND' ...       # copies the working tree to /tmp/repo (a later
#                                                                  # call re-sends the tree: a running job must not
#                                                                  # read it), runs each step there one after another
#                                                                  # under setsid, then waits as `wait` does
#   bash bench/device-chain.sh wait                                # until the chain ends or WAIT_S (560) passed, then
#                                                                  # packs /tmp/res into $OUT, one tarball per folder
# Send `start`'s output to a file, not into a pipe: piped, the call waited until its 600 s limit (session 31).
# A step is a shell command run in /tmp/repo ('TUNE_LIMIT_S=900 bash bench/device-session.sh tune ...'). Each step's
# start, end and status go to /tmp/res/chain.jsonl; what it printed to /tmp/res/chain-N.txt.
set -euo pipefail
WAIT_S=${WAIT_S:-560}
case $1 in
start)
  shift
  rm -rf /tmp/repo /tmp/res/chain-done && mkdir -p /tmp/repo /tmp/res /tmp/chain-out && cp -a . /tmp/repo
  printf '%s\n' "$@" > /tmp/res/chain-steps.txt
  (cd /tmp/repo && setsid nohup bash bench/device-chain.sh run < /dev/null > /tmp/res/chain.log 2>&1 &)
  echo "chain of $# step(s) started: /tmp/res/chain-steps.txt"
  exec bash "$0" wait
  ;;
run)
  n=0
  while IFS= read -r step; do
    n=$((n + 1))
    begun=$(date +%s.%N)
    # device-session.sh packs into $OUT at its end: a folder of the chain's own, not a call's
    OUT=/tmp/chain-out bash -c "$step" > /tmp/res/chain-$n.txt 2>&1 && rc=0 || rc=$?
    python3 -c "import json, sys; print(json.dumps({'step': int(sys.argv[1]), 'command': sys.argv[2],
      'begun': float(sys.argv[3]), 'ended': float(sys.argv[4]), 'rc': int(sys.argv[5])}))" \
      "$n" "$step" "$begun" "$(date +%s.%N)" "$rc" >> /tmp/res/chain.jsonl
  done < /tmp/res/chain-steps.txt
  touch /tmp/res/chain-done
  ;;
wait)
  s=$(date +%s)
  while [ ! -e /tmp/res/chain-done ] && [ $(( $(date +%s) - s )) -lt "$WAIT_S" ]; do sleep 5; done
  cat /tmp/res/chain.jsonl 2>/dev/null || true
  [ -e /tmp/res/chain-done ] && echo "chain done" || echo "chain still running (step $(( $(wc -l < /tmp/res/chain.jsonl 2>/dev/null || echo 0) + 1 )))"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > /tmp/res/gpu.txt 2>/dev/null || true
  # one tarball per folder: a file that comes back is at most 16 MiB; files still being written are packed as far
  # as they are
  for d in /tmp/res/*/; do tar czf "$OUT/$(basename "$d").tgz" -C /tmp/res "$(basename "$d")" 2>/dev/null || true; done
  (cd /tmp/res && tar czf "$OUT/top.tgz" --exclude='*/' $(ls -p | grep -v /) 2>/dev/null) || true
  ls -l "$OUT"
  ;;
esac
