#!/usr/bin/env bash
# Regenerates deploy/sbom.cdx.json, the CycloneDX (1.6, JSON) software bill of materials of
# the Python packages the container image installs: every package of
# deploy/requirements.lock with its version, package URL and the hashes the lock allows,
# under Portcullis itself as the root component (from pyproject.toml).
#
# The generator is cyclonedx-bom (cyclonedx-py) at a pinned version, installed into a
# throwaway venv. Its output is reproducible: no serial number, and the timestamp is
# the lock's resolution date (the "uploaded before" date deploy/lock.sh writes into the
# lock's header), so the same lock file always gives the same SBOM, byte for byte.
# cyclonedx-py validates the document against the CycloneDX schema before writing it.
#
#   deploy/sbom.sh            # rewrite deploy/sbom.cdx.json
#   deploy/sbom.sh --check    # exit 1 if it is not what this would write
#
# The SBOM covers the Python packages only; the base image's Debian packages are listed
# by scanning the built image (see docs/deploy.md).
set -euo pipefail
cd "$(dirname "$0")/.."

CYCLONEDX_BOM_VERSION=7.5.0
INDEX_URL=https://pypi.org/simple
LOCK=deploy/requirements.lock
SBOM=deploy/sbom.cdx.json

check=false
case "${1:-}" in
    "") ;;
    --check) check=true ;;
    *) echo "usage: deploy/sbom.sh [--check]" >&2; exit 2 ;;
esac

resolved=$(sed -n 's/.*files uploaded before \([0-9TZ:-]*\)).*/\1/p' "$LOCK" | head -1)
if [ -z "$resolved" ]; then
    echo "deploy/sbom.sh: $LOCK has no 'files uploaded before' date in its header; regenerate it with deploy/lock.sh" >&2
    exit 1
fi
SOURCE_DATE_EPOCH=$(date -u -d "$resolved" +%s)
export SOURCE_DATE_EPOCH

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
python3 -m venv "$scratch/tools"
env -u PIP_FIND_LINKS -u PIP_EXTRA_INDEX_URL -u PIP_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
    "$scratch/tools/bin/pip" install --quiet --disable-pip-version-check --index-url "$INDEX_URL" "cyclonedx-bom==$CYCLONEDX_BOM_VERSION"

# The root component's dependency graph is not in a requirements file; the generator's
# warning that it is incomplete says only that.
PYTHONWARNINGS=ignore::UserWarning "$scratch/tools/bin/cyclonedx-py" requirements "$LOCK" \
    --pyproject pyproject.toml --mc-type application \
    --spec-version 1.6 --output-format JSON --output-reproducible --validate \
    --output-file "$scratch/sbom.cdx.json"

if $check; then
    if ! cmp -s "$scratch/sbom.cdx.json" "$SBOM"; then
        echo "deploy/sbom.sh: $SBOM is out of date; run deploy/sbom.sh" >&2
        exit 1
    fi
    echo "deploy/sbom.sh: $SBOM is up to date"
else
    mv "$scratch/sbom.cdx.json" "$SBOM"
    echo "deploy/sbom.sh: wrote $SBOM ($(grep -c '"purl"' "$SBOM") package URLs)"
fi
