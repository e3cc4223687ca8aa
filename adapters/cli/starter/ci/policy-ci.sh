#!/usr/bin/env bash
# Every change to the bundle goes through these steps, locally and in CI alike:
#   test (with a coverage threshold) -> check -> lint -> diff against the live
#   revision's decision log -> sign -> build.
# Run it from anywhere: ci/policy-ci.sh. A step that fails stops the run (exit non-zero).
#
# Settings (environment variables; all optional):
#   PORTCULLIS          the portcullis command (default: portcullis on PATH)
#   COVERAGE_THRESHOLD  percent of the Rego's lines the tests must reach (default 70)
#   GATEWAY_CONFIG      the gateway configuration `check` and `diff` judge the bundle's
#                       providers and PII detectors by (default ci/gateway.yaml; empty:
#                       none). Without policy.public_keys: the bundle is not signed yet
#   LIVE_BUNDLE         the live revision: a bundle directory or .tar.gz
#   LIVE_REF            else a git revision whose policies/ is the live one
#                       (e.g. origin/main); read with git archive, nothing is checked out.
#                       One that does not resolve to a commit is an error; one without
#                       policies/.manifest (a first revision) skips the diff, loudly
#   DECISION_LOG        decision-log files (JSONL of OPA decision-log events, gzip
#                       accepted), separated by spaces: the requests replayed by `diff`
#   SIGNING_KEY         a PEM private key file: the bundle is signed with it (RSA: RS256)
#   SIGNING_KEY_ID      the id the gateway's policy.public_keys knows it by (default release)
#   ALLOW_WIDENING      true: the diff reports widenings without failing (a widening
#                       reviewers approved)
#   ALLOW_MASKED        true: the diff accepts decisions it cannot replay as they
#                       happened (the gateway's decision_logs.mask erases something
#                       under /input, e.g. the user); otherwise they fail the gate as
#                       "uncompared"
#   REQUIRE_DIFF        true: a skipped diff fails the run (set it once a live revision
#                       and a decision log are always given)
#   REQUIRE_SIGNATURE   true: an unsigned build fails the run (no SIGNING_KEY)
# Docs: docs/policy-authoring.md in the Portcullis repository.
set -euo pipefail

cd "$(dirname "$0")/.."
PORTCULLIS=${PORTCULLIS:-portcullis}
COVERAGE_THRESHOLD=${COVERAGE_THRESHOLD:-70}
BUNDLE=policies
TESTS=policy-tests
OUT=build
GATEWAY_CONFIG=${GATEWAY_CONFIG-ci/gateway.yaml}
unset PORTCULLIS_CONFIG # the configuration is this script's to name, not the shell's
CONFIG_ARGS=()
if [[ -n "$GATEWAY_CONFIG" ]]; then
  CONFIG_ARGS=(--config "$GATEWAY_CONFIG")
fi
SKIPPED=()
if [[ -n "${REQUIRE_ALL_STEPS:-}" ]]; then # an older starter's setting: not ignored in silence
  printf 'REQUIRE_ALL_STEPS is gone: set REQUIRE_DIFF and REQUIRE_SIGNATURE instead\n' >&2
  exit 1
fi

step() { printf '\n==> %s\n' "$*"; }
fail() {
  printf '\n!!! %s\n' "$*" >&2
  exit 1
}
# A step that did not run says so on stderr and in the summary: never a silent pass.
# With its setting (REQUIRE_DIFF, REQUIRE_SIGNATURE) true it fails the run there, so
# nothing after it runs.
skip() {
  printf '\n!!! %s SKIPPED: %s\n' "$1" "$2" >&2
  SKIPPED+=("$1: $2")
  if [[ "${!3:-false}" == true ]]; then
    fail "$3 is true: the $1 step must run, failing"
  fi
}

rm -rf "$OUT"
mkdir -p "$OUT"

step "test: $TESTS against $BUNDLE, coverage at least $COVERAGE_THRESHOLD %"
"$PORTCULLIS" policy test "$BUNDLE" "$TESTS" --coverage --threshold "$COVERAGE_THRESHOLD"

step "check: every activation check the gateway runs"
"$PORTCULLIS" policy check "$BUNDLE" ${CONFIG_ARGS[@]+"${CONFIG_ARGS[@]}"}

step "lint: this engine's traps in the Rego"
"$PORTCULLIS" policy lint "$BUNDLE" "$TESTS"

step "diff: the live revision against this one, on the decision log's requests"
live=""
if [[ -n "${LIVE_BUNDLE:-}" ]]; then
  live=$LIVE_BUNDLE
elif [[ -n "${LIVE_REF:-}" ]]; then
  # A revision that does not resolve is an error, not a skip: a mistyped or unfetched
  # ref must not pass for "nothing to compare with".
  if ! git rev-parse --git-dir >/dev/null 2>&1; then
    fail "LIVE_REF is $LIVE_REF, but $(pwd) is not in a git repository: set LIVE_BUNDLE instead, or unset LIVE_REF"
  fi
  if ! commit=$(git rev-parse --verify --quiet "$LIVE_REF^{commit}"); then
    fail "LIVE_REF $LIVE_REF does not resolve to a commit here (mistyped, or not fetched: CI needs the history, fetch-depth: 0): the change cannot be compared with what is served"
  fi
  # The bundle as the live revision has it, wherever this repository sits in its git tree.
  prefix=$(git rev-parse --show-prefix)
  if git cat-file -e "$commit:$prefix$BUNDLE/.manifest" 2>/dev/null; then
    mkdir -p "$OUT/live"
    git -C "$(git rev-parse --show-toplevel)" archive --format=tar "$commit:$prefix$BUNDLE" | tar -x -C "$OUT/live"
    live=$OUT/live
  fi
fi
read -r -a logs <<<"${DECISION_LOG:-}"
if [[ -z "$live" && -n "${LIVE_REF:-}" ]]; then
  skip diff "LIVE_REF $LIVE_REF (${commit:0:12}) holds no $BUNDLE/.manifest, a first revision: the change was not compared with what is served" REQUIRE_DIFF
elif [[ -z "$live" ]]; then
  skip diff "no live revision (set LIVE_BUNDLE, or LIVE_REF to a git revision): the change was not compared with what is served" REQUIRE_DIFF
elif [[ ${#logs[@]} -eq 0 ]]; then
  skip diff "no decision log (set DECISION_LOG): the change was not replayed against real requests" REQUIRE_DIFF
else
  inputs=()
  for log in "${logs[@]}"; do inputs+=(--inputs "$log"); done
  gate=(--fail-on widen)
  if [[ "${ALLOW_WIDENING:-false}" == true ]]; then
    gate=()
    printf '\n!!! ALLOW_WIDENING is true: widenings below are reported, not refused\n' >&2
  elif [[ "${ALLOW_MASKED:-false}" == true ]]; then
    gate+=(--allow-masked)
  fi
  "$PORTCULLIS" policy diff "$live" "$BUNDLE" "${inputs[@]}" ${gate[@]+"${gate[@]}"} ${CONFIG_ARGS[@]+"${CONFIG_ARGS[@]}"}
fi

step "sign"
# A copy is signed: a gateway without policy.public_keys refuses a signed bundle, and
# the source tree stays as reviewed.
cp -R "$BUNDLE" "$OUT/bundle"
if [[ -n "${SIGNING_KEY:-}" ]]; then
  "$PORTCULLIS" policy sign "$OUT/bundle" --signing-key "$SIGNING_KEY" --key-id "${SIGNING_KEY_ID:-release}"
else
  skip sign "no SIGNING_KEY: a gateway with policy.public_keys refuses this bundle" REQUIRE_SIGNATURE
fi

step "build"
"$PORTCULLIS" policy build "$OUT/bundle" -o "$OUT/bundle.tar.gz"

if [[ ${#SKIPPED[@]} -gt 0 ]]; then
  printf '\ndone, with steps skipped:\n' >&2
  printf '  %s\n' "${SKIPPED[@]}" >&2
else
  printf '\ndone: every step ran\n'
fi
