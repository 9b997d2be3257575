#!/usr/bin/env bash
# An ordered kernel-module upgrade, end to end, on capstan's embedded cluster.
#
# Copies examples/repo into a fresh Git repository, runs `capstan sync` on it, and merges
# three pull requests into main (merge commits as GitHub's merge button makes them):
#
#   #101  bump my-kmod to v2 (version and both images in one commit): no node moves
#   #102  move worker-1 to v2: that node is upgraded, in four steps
#   #103  move worker-2 and worker-3 to v2: maxNodesInFlight 1, one after the other
#
# After each, it waits until capstan has carried the change out and shows the nodes and
# `capstan history`. See docs/ordered-upgrade.md.
#
# From a capstan checkout:
#
#   cargo build --release
#   examples/ordered-upgrade.sh
#
# Environment:
#   CAPSTAN       the capstan binary (default: target/release/capstan of this checkout)
#   KUBECTL       kubectl, for showing the cluster (default: kubectl on PATH; set it empty
#                 to see capstan's own output only)
#   WAIT_SECONDS  how long each wait may last before the script gives up (default: 120)
#   KEEP=1        keep the work folder (repository, cluster state, sync log)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CAPSTAN=${CAPSTAN:-$root/target/release/capstan}
KUBECTL=${KUBECTL-$(command -v kubectl || true)}
WAIT_SECONDS=${WAIT_SECONDS:-120}
KEEP=${KEEP:-0}

if [[ ! -f $CAPSTAN || ! -x $CAPSTAN ]]; then
    echo "error: no capstan binary at $CAPSTAN" >&2
    echo "       run \`cargo build --release\` in $root first, or set CAPSTAN=/path/to/capstan" >&2
    exit 1
fi
CAPSTAN=$(cd "$(dirname "$CAPSTAN")" && pwd)/$(basename "$CAPSTAN")
for tool in git sed grep awk; do
    command -v "$tool" >/dev/null || { echo "error: $tool is needed" >&2; exit 1; }
done

module=kmm-demo/my-kmod
module_label=kmm.node.kubernetes.io/version-module.kmm-demo.my-kmod

work=$(mktemp -d "${TMPDIR:-/tmp}/capstan-ordered-upgrade.XXXXXX")
cd "$work"
# Paths below are relative to the work folder.
fleet=fleet
kubeconfig=.capstan/kubeconfig
log=sync.log
sync_pid=
started=$SECONDS

cleanup() {
    local status=$?
    if [[ -n $sync_pid ]] && kill -0 "$sync_pid" 2>/dev/null; then
        # On SIGTERM capstan finishes the write in flight and exits.
        kill -TERM "$sync_pid" 2>/dev/null || true
        local deadline=$((SECONDS + 10))
        while kill -0 "$sync_pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
        kill -KILL "$sync_pid" 2>/dev/null || true
        wait "$sync_pid" 2>/dev/null || true
    fi
    if [[ $status -ne 0 && -f $work/$log ]]; then
        echo >&2
        echo "--- the last lines of the capstan sync log ($work/$log) ---" >&2
        tail -n 30 "$work/$log" >&2
    fi
    if [[ $KEEP == 1 || $status -ne 0 ]]; then
        echo "work folder kept: $work" >&2
    else
        cd /
        rm -rf "$work"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- showing -------------------------------------------------------------------------------

section() {
    echo
    echo "================================================================================"
    echo " $*"
    echo "================================================================================"
}

# Prints a command as one types it (quoting what needs it), then runs it.
show() {
    local shown arg
    case $1 in
        git_) shown=git ;;
        kubectl_) shown=kubectl ;;
        capstan_) shown=capstan ;;
        history_) shown="capstan history --kubeconfig $kubeconfig" ;;
        *) shown=$1 ;;
    esac
    for arg in "${@:2}"; do
        if [[ $arg =~ [^][A-Za-z0-9_./=:,@%+^-] ]]; then
            shown+=" '$arg'"
        else
            shown+=" $arg"
        fi
    done
    echo
    echo "\$ $shown"
    "$@"
}

git_() { git -C "$fleet" "$@"; }
capstan_() { "$CAPSTAN" "$@"; }
kubectl_() { "$KUBECTL" "$@"; }
history_() { capstan_ history --kubeconfig "$kubeconfig" "$@"; }

# kubectl columns: per worker, the Module's version labels (M, W and D of
# docs/ordered-upgrade.md), the version loaded, and the pull request that last set the
# labels from Git.
write_columns() {
    local kmm='kmm\.node\.kubernetes\.io' beta='beta\.kmm\.node\.kubernetes\.io' m='kmm-demo\.my-kmod'
    cat >nodes.columns <<EOF
NODE            MODULE(M)                                          WORKER-POD(W)                                          DEVICE-PLUGIN(D)                                          LOADED                                           PR
.metadata.name  .metadata.labels.$kmm/version-module\\.$m  .metadata.labels.$beta/version-worker-pod\\.$m  .metadata.labels.$beta/version-device-plugin\\.$m  .metadata.labels.$kmm/$m\\.version\\.ready  .metadata.annotations.capstan\\.dev/pull-request
EOF
    cat >daemonsets.columns <<'EOF'
NAME            DESIRED                             READY                     IMAGE
.metadata.name  .status.desiredNumberScheduled      .status.numberReady       .spec.template.spec.containers[0].image
EOF
    cat >pods.columns <<'EOF'
NAME            NODE             PHASE          IMAGE
.metadata.name  .spec.nodeName   .status.phase  .spec.containers[0].image
EOF
}

show_nodes() {
    if [[ -n $KUBECTL ]]; then
        show kubectl_ get nodes -l node-role.kubernetes.io/worker -o custom-columns-file=nodes.columns
    else
        echo
        echo "(no kubectl: the nodes' steps are in capstan history)"
    fi
}

show_device_plugins() {
    if [[ -n $KUBECTL ]]; then
        show kubectl_ get daemonsets -n kmm-demo -o custom-columns-file=daemonsets.columns
        show kubectl_ get pods -n kmm-demo -l kmm.node.kubernetes.io/role=device-plugin \
            -o custom-columns-file=pods.columns --sort-by=.spec.nodeName
    else
        echo
        echo "(no kubectl: what the device-plugin controller logged)"
        grep 'device-plugin DaemonSet' "$log" | sed 's/^/  /'
    fi
}

# --- waiting -------------------------------------------------------------------------------

# wait_for DESCRIPTION COMMAND...: runs COMMAND every half second until it succeeds, for at
# most WAIT_SECONDS; fails at once if capstan sync exits.
wait_for() {
    local what=$1
    shift
    local from=$SECONDS deadline=$((SECONDS + WAIT_SECONDS))
    echo
    echo "... waiting until $what"
    until "$@"; do
        if ! kill -0 "$sync_pid" 2>/dev/null; then
            echo "error: capstan sync exited while waiting until $what" >&2
            exit 1
        fi
        if ((SECONDS >= deadline)); then
            echo "error: not done after ${WAIT_SECONDS}s: $what" >&2
            exit 1
        fi
        sleep 0.5
    done
    echo "... done after $((SECONDS - from))s"
}

# The conditions read `capstan history` into a variable before grepping it: with pipefail,
# `grep -q` closing a pipe early would fail a query that succeeded.

# applied SHA: capstan recorded the sync of this commit.
applied() {
    local out
    out=$(history_ --commit "$1" 2>/dev/null) || return 1
    grep -q " Sync .* applied ${1:0:7} " <<<"$out"
}

# upgraded NODE FROM TO: every step of the node's upgrade FROM -> TO is recorded.
upgraded() {
    local out steps="4 of 4"
    [[ $2 == none ]] && steps="2 of 2"
    out=$(history_ --node "$1" 2>/dev/null) || return 1
    grep -q "^$1 $module $2 -> $3, commit .*: $steps steps" <<<"$out"
}

all_workers_on_v1() {
    upgraded worker-1 none v1 && upgraded worker-2 none v1 && upgraded worker-3 none v1
}

bump_applied() {
    applied "$1" || return 1
    if [[ -n $KUBECTL ]]; then
        kubectl_ get daemonset -n kmm-demo my-kmod-device-plugin-v2 >/dev/null 2>&1
    else
        grep -q 'applied device-plugin DaemonSet .*daemon_set=my-kmod-device-plugin-v2 ' "$log"
    fi
}

workers_2_3_upgraded() {
    upgraded worker-2 v1 v2 && upgraded worker-3 v1 v2
}

# --- Git, as GitHub's merge button does it -------------------------------------------------

export GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1
export GIT_AUTHOR_NAME="Fleet Admin" GIT_AUTHOR_EMAIL=admin@fleet.example
export GIT_COMMITTER_NAME="Fleet Admin" GIT_COMMITTER_EMAIL=admin@fleet.example

# pull_request NUMBER BRANCH TITLE EDIT...: runs EDIT on BRANCH (from main) and commits it
# as TITLE, then merges BRANCH into main with a merge commit as GitHub names it.
pull_request() {
    local number=$1 branch=$2 title=$3
    shift 3
    git_ checkout -q -b "$branch" main
    "$@"
    git_ commit -q -a -m "$title"
    git_ checkout -q main
    GIT_COMMITTER_NAME=GitHub GIT_COMMITTER_EMAIL=noreply@github.com \
        git_ merge -q --no-ff "$branch" -m "Merge pull request #$number from fleet/$branch" -m "$title"
    git_ branch -q -d "$branch"
}

bump_module() {
    sed -i -e 's/version: "v1"/version: "v2"/' \
        -e 's|/my-kmod:v1-|/my-kmod:v2-|' \
        -e 's|/my-kmod-device-plugin:v1$|/my-kmod-device-plugin:v2|' \
        "$fleet/modules/my-kmod.yaml"
}

relabel() {
    local node
    for node in "$@"; do
        sed -i "s|$module_label: \"v1\"|$module_label: \"v2\"|" "$fleet/nodes/$node.yaml"
    done
}

# --- the walkthrough -----------------------------------------------------------------------

section "The fleet: examples/repo as a new repository, branch main"
echo "work folder: $work (the commands below run there)"
mkdir "$fleet"
cp -R "$root/examples/repo/." "$fleet/"
git init -q -b main "$fleet"
git_ add -A
git_ commit -q -m "Initial fleet"
initial=$(git_ rev-parse --short HEAD)
show git_ log --oneline
show cat "$fleet/capstan.yaml"

section "capstan sync: the embedded cluster follows main"
echo "\$ capstan sync --repo $fleet --state-dir .capstan --listen 127.0.0.1:0 --interval 2s >$log 2>&1 &"
NO_COLOR=1 "$CAPSTAN" sync --repo "$fleet" --state-dir .capstan --listen 127.0.0.1:0 \
    --interval 2s >"$log" 2>&1 &
sync_pid=$!
wait_for "$initial is applied and my-kmod v1 runs on every worker" all_workers_on_v1
show history_
if [[ -n $KUBECTL ]]; then
    export KUBECONFIG=$work/$kubeconfig
    write_columns
    echo
    echo "\$ export KUBECONFIG=\$PWD/$kubeconfig"
    show kubectl_ get gitsyncs -n capstan-system
    show kubectl_ get modules -n kmm-demo
    echo
    echo "nodes.columns: per worker, the version labels M (from Git), W and D (set by the"
    echo "version-label controller), the version loaded and the pull request that set M."
fi
show_nodes
show_device_plugins

section "PR #101: bump my-kmod to v2 (version, kernel-module image, device-plugin image)"
pull_request 101 bump-v2 "Bump my-kmod to v2" bump_module
pr101=$(git_ rev-parse --short HEAD)
show git_ show --oneline HEAD^2
show git_ log --graph --oneline
wait_for "$pr101 is applied and the v2 device plugin exists" bump_applied "$pr101"
show history_ --commit "$pr101"
if [[ -n $KUBECTL ]]; then
    show kubectl_ get modules -n kmm-demo
fi
echo
echo "No node moved: each keeps the version its label names. The v2 device plugin selects"
echo "nodes whose D label is v2, and there are none yet."
show_nodes
show_device_plugins

section "PR #102: move worker-1 to v2"
pull_request 102 worker-1-v2 "Move worker-1 to v2" relabel worker-1
pr102=$(git_ rev-parse --short HEAD)
show git_ show --oneline HEAD^2
show git_ log --graph --oneline
wait_for "worker-1's upgrade v1 -> v2 has its four steps" upgraded worker-1 v1 v2
show history_ --node worker-1
show_nodes

section "PR #103: move worker-2 and worker-3 to v2"
pull_request 103 workers-2-3-v2 "Move worker-2 and worker-3 to v2" relabel worker-2 worker-3
pr103=$(git_ rev-parse --short HEAD)
show git_ show --stat --oneline HEAD^2
show git_ log --graph --oneline
wait_for "worker-2's and worker-3's upgrades v1 -> v2 have their four steps" workers_2_3_upgraded
show history_ --node worker-2
show history_ --node worker-3
show history_ --module "$module" --commit "$pr103"
# The nodes of the steps above, in time order: with maxNodesInFlight 1, two runs of four.
order=$(history_ --module "$module" --commit "$pr103" | awk '$3 == "UpgradeStep" { print $6 }' | uniq)
if [[ $(wc -l <<<"$order") -ne 2 ]]; then
    echo "error: the upgrades of $pr103 overlapped, despite maxNodesInFlight 1:" $order >&2
    exit 1
fi
echo
echo "maxNodesInFlight is 1: $(sed -n 1p <<<"$order") went through its four steps, then $(sed -n 2p <<<"$order")."
if [[ -n $KUBECTL ]]; then
    show kubectl_ get events --field-selector reason=UpgradeQueued
fi
show_nodes
show_device_plugins

section "capstan sync's log, from the first commit to the last"
show grep -E '^[0-9]{2}:[0-9]{2}:[0-9]{2} ' "$log"

section "Done in $((SECONDS - started))s"
echo "commits applied: $initial (initial), $pr101 (#101), $pr102 (#102), $pr103 (#103)"
