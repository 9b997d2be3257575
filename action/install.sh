#!/usr/bin/env bash
# Installs the released capstan binary the GitHub Action of action.yml runs
# (docs/github-action.md): the release of the version in the action's own Cargo.toml, for
# this machine's platform, verified against the release's SHA256SUMS before it is run.
# Prints the installed binary's path on stdout; messages go to stderr.
#
# Exit codes, which action.yml tells apart:
#   0  installed
#   3  not available: no release for this version or platform, the release host did not
#      answer, or the binary does not run here; the action builds capstan from source
#   4  verification failed: the archive's sum differs from SHA256SUMS, or SHA256SUMS lacks
#      the archive; nothing is run or installed, and the action fails
#   1  anything else (a release archive without a capstan binary, no disk space)
#
# Reads: GITHUB_ACTION_PATH (the action's checkout; default this script's parent folder),
# CAPSTAN_RELEASE_URL (the folder holding v<version>/; default
# $GITHUB_SERVER_URL/<action repository>/releases/download), CAPSTAN_ACTION_REPOSITORY or
# GITHUB_ACTION_REPOSITORY (owner/name of the action's repository; when both are empty,
# as in composite actions they can be, the owner/name after `_actions/` in the action
# path), CAPSTAN_INSTALL_DIR (default $RUNNER_TEMP/capstan-v<version>-<arch>).
set -euo pipefail
# A failing command outside the handled cases must not pass its own exit code (curl's 3,
# tar's 2...) off as one of those above.
trap 'exit 1' ERR

readonly INSTALLED=0 NOT_AVAILABLE=3 VERIFICATION_FAILED=4

say() {
  printf 'capstan install: %s\n' "$*" >&2
}

action_path=${GITHUB_ACTION_PATH:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}

# The `version` of `[workspace.package]` in the action's Cargo.toml.
workspace_version() {
  awk '
    /^\[/ { section = $0 }
    section == "[workspace.package]" && $1 == "version" {
      sub(/^[^"]*"/, ""); sub(/".*$/, ""); print; exit
    }
  ' "$action_path/Cargo.toml"
}

# The release architecture of this machine, empty when capstan is not released for it.
release_arch() {
  if [[ $(uname -s) != Linux ]]; then
    return 0
  fi
  case $(uname -m) in
    x86_64 | amd64) echo amd64 ;;
    aarch64 | arm64) echo arm64 ;;
  esac
}

# owner/name of the action's repository, empty when unknown (an action used from a path).
action_repository() {
  local repository=${CAPSTAN_ACTION_REPOSITORY:-${GITHUB_ACTION_REPOSITORY:-}}
  if [[ -z $repository && $action_path =~ /_actions/([^/]+/[^/]+)/ ]]; then
    repository=${BASH_REMATCH[1]}
  fi
  printf '%s' "$repository"
}

# Downloads URL to FILE; on failure says why and returns 1.
download() {
  local error
  if ! error=$(curl --fail --silent --show-error --location --retry 2 \
    --connect-timeout 10 --max-time 300 --output "$2" "$1" 2>&1); then
    say "could not download $1: ${error:-curl failed}"
    return 1
  fi
}

version=$(workspace_version)
if [[ -z $version ]]; then
  say "no [workspace.package] version in $action_path/Cargo.toml"
  exit 1
fi
arch=$(release_arch)
if [[ -z $arch ]]; then
  say "capstan v$version is not released for $(uname -s) $(uname -m): not available"
  exit "$NOT_AVAILABLE"
fi
release_url=${CAPSTAN_RELEASE_URL:-}
if [[ -z $release_url ]]; then
  repository=$(action_repository)
  if [[ -z $repository ]]; then
    say "the action's repository is unknown, so is its release: not available"
    exit "$NOT_AVAILABLE"
  fi
  release_url=${GITHUB_SERVER_URL:-https://github.com}/$repository/releases/download
fi
release=${release_url%/}/v$version
asset=capstan-v$version-linux-$arch.tar.gz

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The archive first: a release without this platform's archive is one to build instead.
# An archive without a sum to check it against is never run.
if ! download "$release/$asset" "$work/$asset"; then
  say "$asset of release v$version is not available"
  exit "$NOT_AVAILABLE"
fi
if ! download "$release/SHA256SUMS" "$work/SHA256SUMS"; then
  say "$asset cannot be verified: release v$version has no SHA256SUMS ($release/SHA256SUMS)"
  exit "$VERIFICATION_FAILED"
fi
# sha256sum's lines: the sum, a space, then a space (text) or `*` (binary), then the name.
expected=$(awk -v name="$asset" '$2 == name || $2 == "*" name { print $1; exit }' "$work/SHA256SUMS")
if [[ -z $expected ]]; then
  say "$asset is not listed in the release's SHA256SUMS ($release/SHA256SUMS): it cannot be verified and is not run"
  exit "$VERIFICATION_FAILED"
fi
actual=$(sha256sum "$work/$asset" | awk '{ print $1 }')
if [[ ${expected,,} != "$actual" ]]; then
  say "checksum mismatch for $asset: SHA256SUMS says $expected, the download is $actual; it is not run"
  exit "$VERIFICATION_FAILED"
fi

mkdir "$work/unpacked"
if ! tar -xzf "$work/$asset" -C "$work/unpacked" capstan 2>"$work/tar.err" ||
  [[ ! -f $work/unpacked/capstan ]]; then
  say "$asset holds no capstan binary: $(tr '\n' ' ' <"$work/tar.err")"
  exit 1
fi
chmod 0755 "$work/unpacked/capstan"
# A binary this runner's system cannot load (an older glibc or OpenSSL) is one to build.
if ! "$work/unpacked/capstan" --version >/dev/null 2>"$work/version.err"; then
  say "the released capstan does not run here ($(tr '\n' ' ' <"$work/version.err")): not available"
  exit "$NOT_AVAILABLE"
fi

install_dir=${CAPSTAN_INSTALL_DIR:-${RUNNER_TEMP:-${TMPDIR:-/tmp}}/capstan-v$version-$arch}
mkdir -p "$install_dir"
mv -f "$work/unpacked/capstan" "$install_dir/capstan"
say "installed capstan v$version ($asset, sha256 $actual)"
printf '%s\n' "$install_dir/capstan"
exit "$INSTALLED"
