#!/bin/bash
# The ceiling of P2 in the lab: one host (rxe1) writing 4 KiB with ib_write_bw to one host alone,
# then to two at once (rxe2, rxe3), alternating, in one boot. Run inside the lab:
#   ops/lab run --hosts 3 --sh -- "$PWD/ops/lib/two_streams.sh"
# N sets the iterations per stream (default 20000).
set -u
gid() { # device, IPv4 address: the RoCE v2 GID index for it
  local want i t
  want=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' $(echo "$2" | tr . ' '))
  for f in /sys/class/infiniband/$1/ports/1/gids/*; do
    i=$(basename "$f")
    t=$(cat /sys/class/infiniband/$1/ports/1/gid_attrs/types/$i 2>/dev/null)
    case "$t" in *v2*) ;; *) continue ;; esac
    [ "$(cat "$f")" = "$want" ] && { echo "$i"; return; }
  done
}
g1=$(gid rxe1 192.0.2.11); g2=$(gid rxe2 192.0.2.12); g3=$(gid rxe3 192.0.2.13)
echo "gids: rxe1 $g1 rxe2 $g2 rxe3 $g3"
N=${N:-20000}
bw() { # output file -> average MB/s
  awk '$1 == 4096 && NF >= 5 { print $4 }' "$1" | tail -1
}
stream() { # server dev, server gid, server addr, port, out
  ib_write_bw -d "$1" -x "$2" -s 4096 -n "$N" -p "$4" -F > "$5.srv" 2>&1 &
  sleep 1
  for a in 1 2 3 4 5 6 7 8 9 10; do
    ib_write_bw -d rxe1 -x "$g1" -s 4096 -n "$N" -p "$4" -F "$3" > "$5" 2>&1 && break
    sleep 0.5
  done
  wait
}
for round in 1 2 3; do
  stream rxe2 "$g2" 192.0.2.12 18600 /tmp/solo
  echo "round $round solo rxe1->rxe2: $(bw /tmp/solo) MB/s"
  stream rxe2 "$g2" 192.0.2.12 18601 /tmp/two_a &
  stream rxe3 "$g3" 192.0.2.13 18602 /tmp/two_b &
  wait
  echo "round $round two at once: rxe1->rxe2 $(bw /tmp/two_a) MB/s, rxe1->rxe3 $(bw /tmp/two_b) MB/s"
done
