# shellcheck shell=bash
# Sourced by tests that bind ranks (launcher_bind.sh, ssh_hosts.sh): sets
# MASK to the cpus this shell may use, as the kernel lists them ("0-3,8"),
# and the array CPUS to them one by one (0 1 2 3 8).
MASK=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
CPUS=()
IFS=, read -ra parts <<<"$MASK"
for p in "${parts[@]}"; do
  if [[ $p == *-* ]]; then
    for ((c = ${p%-*}; c <= ${p#*-}; c++)); do CPUS+=("$c"); done
  else
    CPUS+=("$p")
  fi
done
unset parts p c
