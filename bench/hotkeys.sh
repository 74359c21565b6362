#!/usr/bin/env bash
# bench/hotkeys.sh: the local tier's hot-key scenario (issue 6); the same as
# bench/run.sh --scenario hotkeys, with the same flags (--quick, --rounds N,
# --targets, --tests, --keep). See bench/README.md, "Local tier".
exec "$(dirname "${BASH_SOURCE[0]}")/run.sh" --scenario hotkeys "$@"
