#!/usr/bin/env bash
# From a fresh clone to a first context, as the README's first commands do it: clone, a new
# virtualenv with the core install, `cce demo --data-dir demo_data`, then `cce context`. Prints each
# step's wall time, the virtualenv's size and its package count.
# Usage: bash benchmarks/first_context.sh [REPOSITORY] [WORK_FOLDER]   (defaults: this clone, a new temp folder)
set -euo pipefail
repo=${1:-$(cd "$(dirname "$0")/.." && pwd)}
work=${2:-$(mktemp -d)}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f} s')" "$1" "$2"; }
date -u +"start %Y-%m-%dT%H:%M:%SZ"; uptime
t0=$(now)
git clone -q "$repo" "$work/cce_duck"
cd "$work/cce_duck"
t1=$(now)
python3 -m venv .venv
.venv/bin/python -m pip install -q -e .
t2=$(now)
.venv/bin/cce demo --data-dir demo_data > "$work/demo.out"
t3=$(now)
.venv/bin/cce context demo "What did we decide about the SMS rate limit?" --data-dir demo_data > "$work/context.out"
t4=$(now)
echo "git clone: $(since "$t0" "$t1")"
echo "venv + core install (pip install -e .): $(since "$t1" "$t2")"
echo "cce demo --data-dir demo_data: $(since "$t2" "$t3")"
echo "cce context demo ...: $(since "$t3" "$t4")"
echo "clone to first context: $(since "$t0" "$t4")"
echo "venv size: $(du -sh .venv | cut -f1); packages: $(.venv/bin/python -m pip list 2>/dev/null | tail -n +3 | wc -l)"
tail -1 "$work/context.out"
date -u +"end %Y-%m-%dT%H:%M:%SZ"; uptime
