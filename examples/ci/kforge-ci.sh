#!/usr/bin/env bash
# kforge in CI: the shell steps a workflow runs, in this order (examples/ci/github-actions.yml and
# gitlab-ci.yml; tests/examples/test_ci.py runs them in a temporary checkout).
#
#   bash examples/ci/kforge-ci.sh install   README's set-up: an in-tree .venv with kforge installed
#   (the runner restores out/ from its cache here: kforge decides rebuilds by content, so any earlier out/ is a
#    valid start and the cache key can be coarse)
#   bash examples/ci/kforge-ci.sh build     every target, one compile per available CPU; exits non-zero if any
#                                           target failed. With KFORGE_CACHE set, the shared cache is read, and
#                                           written only when KFORGE_CI_WRITE_CACHE=1 (main-branch runs)
#   bash examples/ci/kforge-ci.sh summary   Markdown for the job summary: counts, failures grouped by cause
#   (the runner saves out/ to its cache, and uploads out/dist/*.whl, out/build-report.json and
#    out/build-trace.json as artifacts)
#
# PYTHON picks the interpreter (default: the in-tree .venv's).
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}

case "${1:-}" in
    install)
        python3 -m venv .venv && .venv/bin/pip install -q -e .
        ;;
    build)
        [ -n "${KFORGE_CACHE:-}" ] || unset KFORGE_CACHE   # an unset CI variable arrives as ""
        [ -n "${KFORGE_CACHE_KEY:-}" ] || unset KFORGE_CACHE_KEY
        if [ "${KFORGE_CI_WRITE_CACHE:-0}" = 1 ]; then
            export KFORGE_CACHE_READONLY=0
        else   # pull requests (forks included) never write the shared cache
            export KFORGE_CACHE_READONLY=1
        fi
        "$PYTHON" -m doit
        ;;
    summary)
        "$PYTHON" -m kforge.ci_summary out/build-report.json
        ;;
    *)
        echo "usage: bash examples/ci/kforge-ci.sh install | build | summary" >&2
        exit 2
        ;;
esac
