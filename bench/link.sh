#!/usr/bin/env bash
# A two-host link on one machine: two network namespaces joined by a veth
# pair, each end shaped with a token bucket (tbf) at the same rate. netem is
# unavailable here, so the link has bandwidth but no added delay.
#
#   bench/link.sh up [RATE]        create (or recreate) the link; RATE defaults to 1gbit
#   bench/link.sh rate RATE        reshape both ends of an existing link
#   bench/link.sh down             remove everything; safe to repeat
#   bench/link.sh stats            qdisc counters of both ends, as JSON lines
#   bench/link.sh names            the namespaces, devices and addresses, as JSON
#   bench/link.sh run RATE CMD...  up, run CMD on the host, down on any exit
#
# Everything is private to the two namespaces: addresses 10.77.0.1/24 (end 0,
# the rendezvous host) and 10.77.0.2/24 (end 1); nothing is routed outside.
# Names can be moved with GODDP_LINK_PREFIX so that two benches never share a link.
set -euo pipefail

PREFIX=${GODDP_LINK_PREFIX:-goddpb}
NS=("${PREFIX}-ns0" "${PREFIX}-ns1")
DEV=("${PREFIX}v0" "${PREFIX}v1")
ADDR=("10.77.0.1/24" "10.77.0.2/24")

down() {
    # Deleting a namespace destroys the veth end inside it, and a veth end
    # never outlives its peer, so this removes the pair and its qdiscs too.
    local ns
    for ns in "${NS[@]}"; do
        ip netns del "$ns" 2>/dev/null || true
    done
}

shape() {
    local rate=$1 i
    for i in 0 1; do
        # burst 64kb holds one full GSO segment; latency 400ms bounds the queue.
        ip netns exec "${NS[$i]}" tc qdisc replace dev "${DEV[$i]}" root \
            tbf rate "$rate" burst 64kb latency 400ms
    done
}

up() {
    local rate=${1:-1gbit} i
    down
    # A half-built link is worse than none: undo on any failure below.
    trap down ERR
    for i in 0 1; do
        ip netns add "${NS[$i]}"
        ip netns exec "${NS[$i]}" ip link set lo up
    done
    ip link add "${DEV[0]}" netns "${NS[0]}" type veth peer name "${DEV[1]}" netns "${NS[1]}"
    for i in 0 1; do
        ip netns exec "${NS[$i]}" ip addr add "${ADDR[$i]}" dev "${DEV[$i]}"
        ip netns exec "${NS[$i]}" ip link set "${DEV[$i]}" up
    done
    shape "$rate"
    trap - ERR
}

stats() {
    local i
    for i in 0 1; do
        ip netns exec "${NS[$i]}" tc -j -s qdisc show dev "${DEV[$i]}"
        echo
    done
}

case "${1:-}" in
    up) up "${2:-1gbit}" ;;
    rate) shape "${2:?rate}" ;;
    down) down ;;
    stats) stats ;;
    names)
        printf '{"namespaces": ["%s", "%s"], "devices": ["%s", "%s"], "addresses": ["%s", "%s"]}\n' \
            "${NS[0]}" "${NS[1]}" "${DEV[0]}" "${DEV[1]}" "${ADDR[0]%/*}" "${ADDR[1]%/*}"
        ;;
    run)
        rate=${2:?rate}
        shift 2
        trap down EXIT
        up "$rate"
        "$@"
        ;;
    *)
        sed -n '2,17p' "$0" >&2
        exit 2
        ;;
esac
