#!/usr/bin/env bash
# `capstan plan` for a pull request, as the GitHub Action of action.yml runs it
# (docs/github-action.md): plans what merging the pull request does, appends the plan to
# the step summary, sets the outputs has-changes and exit-code, sets the commit status
# `capstan/plan` on the pull request's head commit with the plan's summary line, and, when
# asked, comments the plan on the pull request (updating the comments of an earlier run).
# Fails only when the plan fails (head would be rejected, or capstan could not plan).
#
# Reads: CAPSTAN_BIN (default capstan), CAPSTAN_REPO_PATH (default .), CAPSTAN_PATH,
# CAPSTAN_BRANCH (default GITHUB_BASE_REF, else main), CAPSTAN_COMMENT (true|false,
# default false), CAPSTAN_STATUS (true|false, default true), GITHUB_TOKEN, and the
# variables GitHub sets: GITHUB_EVENT_PATH, GITHUB_SHA, GITHUB_REPOSITORY, GITHUB_API_URL,
# GITHUB_SERVER_URL, GITHUB_RUN_ID, GITHUB_STEP_SUMMARY, GITHUB_OUTPUT.
set -euo pipefail

capstan=${CAPSTAN_BIN:-capstan}
repo_path=${CAPSTAN_REPO_PATH:-.}
path=${CAPSTAN_PATH:-}
branch=${CAPSTAN_BRANCH:-${GITHUB_BASE_REF:-}}
branch=${branch:-main}
comment=${CAPSTAN_COMMENT:-false}
status=${CAPSTAN_STATUS:-true}
api=${GITHUB_API_URL:-https://api.github.com}
marker='<!-- capstan-plan -->'
# The status's context, as Atlantis names its own `atlantis/plan`.
status_context=capstan/plan

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The pull request number of the event; empty outside pull-request events.
pull_request_number() {
  if [[ -z ${GITHUB_EVENT_PATH:-} || ! -f $GITHUB_EVENT_PATH ]]; then
    return 0
  fi
  python3 -c '
import json, sys
event = json.load(open(sys.argv[1]))
print((event.get("pull_request") or {}).get("number") or "")
' "$GITHUB_EVENT_PATH"
}

# The commit the status belongs to: the pull request's head (GITHUB_SHA is the merge
# commit, which the pull request's page does not show), else GITHUB_SHA.
head_sha() {
  local sha=
  if [[ -n ${GITHUB_EVENT_PATH:-} && -f $GITHUB_EVENT_PATH ]]; then
    sha=$(python3 -c '
import json, sys
event = json.load(open(sys.argv[1]))
print(((event.get("pull_request") or {}).get("head") or {}).get("sha") or "")
' "$GITHUB_EVENT_PATH")
  fi
  printf '%s' "${sha:-${GITHUB_SHA:-}}"
}

# Makes the base branch's history available: a shallow checkout is deepened, and a
# missing origin/<branch> fetched (capstan reads it when there is no local branch).
fetch_base() {
  local git=(git -C "$repo_path")
  if [[ $("${git[@]}" rev-parse --is-shallow-repository) == true ]]; then
    "${git[@]}" fetch --quiet --no-tags --unshallow origin \
      "+refs/heads/$branch:refs/remotes/origin/$branch"
  elif ! "${git[@]}" rev-parse --verify --quiet "refs/heads/$branch^{commit}" >/dev/null &&
    ! "${git[@]}" rev-parse --verify --quiet "refs/remotes/origin/$branch^{commit}" >/dev/null; then
    "${git[@]}" fetch --quiet --no-tags origin "+refs/heads/$branch:refs/remotes/origin/$branch"
  fi
}

# Runs the plan: markdown parts in $work/plan.md, $work/plan.md.2, ...; sets $code.
run_plan() {
  local args=(plan --repo "$repo_path" --branch "$branch" --head HEAD
    --format markdown --detailed-exitcode --output "$work/plan.md")
  if [[ -n $path ]]; then
    args+=(--path "$path")
  fi
  if [[ -n $pull_request ]]; then
    args+=(--pull-request "$pull_request")
  fi
  code=0
  "$capstan" "${args[@]}" >/dev/null 2>"$work/stderr" || code=$?
  cat "$work/stderr" >&2
  if [[ ! -f $work/plan.md ]]; then
    # No plan at all (capstan missing, the repository unreadable): report why instead.
    {
      printf '**capstan plan** failed (exit code %s):\n\n```\n' "$code"
      cat "$work/stderr"
      printf '```\n'
    } >"$work/plan.md"
  fi
}

# The plan's parts, in order.
plan_parts() {
  parts=("$work/plan.md")
  local n=2
  while [[ -f $work/plan.md.$n ]]; do
    parts+=("$work/plan.md.$n")
    n=$((n + 1))
  done
}

write_summary_and_outputs() {
  if [[ -n ${GITHUB_STEP_SUMMARY:-} ]]; then
    local part
    for part in "${parts[@]}"; do
      cat "$part" >>"$GITHUB_STEP_SUMMARY"
      printf '\n' >>"$GITHUB_STEP_SUMMARY"
    done
  fi
  local has_changes=false
  if [[ $code == 2 ]]; then
    has_changes=true
  fi
  if [[ -n ${GITHUB_OUTPUT:-} ]]; then
    printf 'has-changes=%s\nexit-code=%s\n' "$has_changes" "$code" >>"$GITHUB_OUTPUT"
  fi
}

# One call of the REST API: method, URL, and optionally a file holding the JSON body.
github() {
  local args=(--silent --show-error --fail -X "$1"
    -H "Authorization: Bearer ${GITHUB_TOKEN:-}"
    -H "Accept: application/vnd.github+json"
    -H "X-GitHub-Api-Version: 2022-11-28")
  if [[ -n ${3:-} ]]; then
    args+=(-H "Content-Type: application/json" --data-binary "@$3")
  fi
  curl "${args[@]}" "$2"
}

# Lists in $work/ids the comments an earlier run posted (they start with the marker),
# oldest first.
earlier_comments() {
  local page=1 count
  while :; do
    github GET "$1?per_page=100&page=$page" >"$work/page.json" || return 1
    count=$(python3 -c '
import json, sys
comments = json.load(open(sys.argv[1]))
with open(sys.argv[3], "a") as ids:
    for comment in comments:
        if (comment.get("body") or "").startswith(sys.argv[2]):
            print(comment["id"], file=ids)
print(len(comments))
' "$work/page.json" "$marker" "$work/ids") || return 1
    if ((count < 100)); then
      return 0
    fi
    page=$((page + 1))
  done
}

# Writes the JSON body of a comment holding one part, marked as this action's.
comment_body() {
  python3 -c '
import json, sys
print(json.dumps({"body": sys.argv[2] + "\n" + open(sys.argv[1]).read()}))
' "$1" "$marker" >"$work/body.json"
}

# Writes the JSON body of the commit status: success when the plan ran (with changes or
# without), failure when it did not or head would be rejected; the description is the
# plan's summary line (the first line of its markdown, unescaped), cut to GitHub's 140
# characters.
status_body() {
  local state=failure target_url=
  if [[ $code == 0 || $code == 2 ]]; then
    state=success
  fi
  if [[ -n ${GITHUB_RUN_ID:-} ]]; then
    target_url=${GITHUB_SERVER_URL:-https://github.com}/$GITHUB_REPOSITORY/actions/runs/$GITHUB_RUN_ID
  fi
  python3 -c '
import json, re, sys
plan, state, code, context, target_url = sys.argv[1:6]
with open(plan) as lines:
    first = lines.readline().rstrip("\n")
prefix = "**capstan plan**: "
if first.startswith(prefix):
    description = re.sub(r"\\(.)", r"\1", first[len(prefix):])
    description = description.replace("&lt;", "<").replace("&gt;", ">")
else:
    description = "capstan plan failed (exit code %s)" % code
if len(description) > 140:
    description = description[:139] + "\u2026"
body = {"state": state, "context": context, "description": description}
if target_url:
    body["target_url"] = target_url
print(json.dumps(body))
' "$work/plan.md" "$state" "$code" "$status_context" "$target_url" >"$work/status.json"
}

# Sets the commit status of the plan on the head commit.
post_status() {
  status_body || return 1
  github POST "$api/repos/$GITHUB_REPOSITORY/statuses/$1" "$work/status.json" >/dev/null
}

# Updates the earlier comments with the parts, posts the parts beyond them, and deletes
# earlier comments left over.
post_comments() {
  local comments="$api/repos/$GITHUB_REPOSITORY/issues/$pull_request/comments"
  local edit="$api/repos/$GITHUB_REPOSITORY/issues/comments"
  : >"$work/ids"
  earlier_comments "$comments" || return 1
  local earlier=() index=0 part
  mapfile -t earlier <"$work/ids"
  for part in "${parts[@]}"; do
    comment_body "$part" || return 1
    if ((index < ${#earlier[@]})); then
      github PATCH "$edit/${earlier[index]}" "$work/body.json" >/dev/null || return 1
    else
      github POST "$comments" "$work/body.json" >/dev/null || return 1
    fi
    index=$((index + 1))
  done
  local id
  for id in "${earlier[@]:index}"; do
    github DELETE "$edit/$id" >/dev/null || return 1
  done
}

pull_request=$(pull_request_number)
if ! fetch_base; then
  echo "::warning::could not fetch the base branch $branch; planning with what the checkout has"
fi
run_plan
plan_parts
write_summary_and_outputs
if [[ $comment == true ]]; then
  if [[ -z $pull_request ]]; then
    echo "::notice::not a pull request event: the plan is not commented"
  elif ! post_comments; then
    echo "::warning::the plan could not be commented on pull request #$pull_request"
  fi
fi
if [[ $status == true ]]; then
  sha=$(head_sha)
  if [[ -z $sha || -z ${GITHUB_REPOSITORY:-} ]]; then
    echo "::notice::no commit to set the status on: the plan's status is not set"
  elif ! post_status "$sha"; then
    echo "::warning::the commit status $status_context could not be set on $sha (the token needs statuses: write)"
  fi
fi
# 0: no changes, 2: changes; anything else is a failed plan.
if [[ $code != 0 && $code != 2 ]]; then
  exit 1
fi
