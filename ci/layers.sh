#!/usr/bin/env bash
# Layering check: no #include runs upward. Tiers, lowest first:
#   model (0) <- taps, fixtures, bench (1) <- reference, backends (2)
#   <- harness engine (3) <- reports (4) <- harness/cli (5)
# A file may include headers of its own tier or below (reference and the
# backends are one tier: the registry names the reference arms, the reference
# implements the shared forward contract). Tests are exempt. Exit 1 with one
# line per upward include.
set -euo pipefail
cd "$(dirname "$0")/.."
git rev-parse --git-dir >/dev/null 2>&1 || { echo "ci/layers.sh: not a git checkout: skipped"; exit 77; }

tier_of() { # path -> tier, or empty for paths outside the layered folders
  case $1 in
    model/*) echo 0 ;;
    bench/kernel_rate.c) echo 5 ;; # a standalone benchmark program over the cpu kernels, like the CLI on top
    taps/* | fixtures/* | bench/*) echo 1 ;;
    reference/* | backends/*) echo 2 ;;
    harness/cli/*) echo 5 ;;
    harness/*) echo 3 ;;
    reports/*) echo 4 ;;
  esac
}

declare -A header_tier
while IFS= read -r h; do
  t=$(tier_of "$h")
  [ -n "$t" ] && header_tier[$(basename "$h")]=$t
done < <(git ls-files '*.h' | grep -v '/tests/')

bad=0
while IFS= read -r f; do
  ft=$(tier_of "$f")
  [ -n "$ft" ] || continue
  while IFS= read -r inc; do
    ht=${header_tier[$inc]:-}
    [ -n "$ht" ] || continue # system, generated (td_config.h) or third-party header
    if [ "$ht" -gt "$ft" ]; then
      echo "ci/layers.sh: $f (tier $ft) includes $inc (tier $ht): an include runs upward"
      bad=1
    fi
  done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
done < <(git ls-files '*.c' '*.h' | grep -v '/tests/')
[ $bad -eq 0 ] && echo "ci/layers.sh: no upward include"
exit $bad
