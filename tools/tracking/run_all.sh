#!/usr/bin/env bash
# The whole measurement, in order, one process at a time (see README.md for the venvs).
# Work files go to $TRACKING_WORK (default /tmp/tracking). Seven scenes (common.SCENES: cross,
# crowd, fast, occlude, turns, crowd60, pairs): about 50 minutes of CPU on the 2-core
# development machine before the hour of the agent's own soak.
set -euo pipefail
cd "$(dirname "$0")"
W=${TRACKING_WORK:-/tmp/tracking}
NP2=${NP2:-/tmp/trackvenv/bin/python}
NP1=${NP1:-/tmp/trackvenv-np1/bin/python}
UL=${UL:-/tmp/trackvenv-ul/bin/python}
AGENT=${AGENT:-/work/main/.venv-3.12/bin/python}
export YOLO_OFFLINE=1
N="nice -n 10"

# 1. sequences (every scene; --scenes for some), tracker outputs, TrackEval scores
$N $AGENT make_sequences.py --source noisy --seeds 1 2 3 4
$N $AGENT make_sequences.py --source detector --seeds 1 2
$N $NP2 run_trackers.py --group np2
$N $NP1 run_trackers.py --group np1
$N $UL run_trackers.py --group ul
$N $AGENT run_trackers.py --group agent
$N $AGENT run_trackers.py --group agent --only 'agent+floor=0.1+high=0.25+new_track=0.25'
$N $NP2 evaluate.py > "$W/accuracy-tables.md"
$N $NP2 seq_stats.py > "$W/seq-stats.md"

# 2. cost per frame: the three venvs' processes alternate, three rounds each
mkdir -p "$W/results"
rm -f "$W/results/costs.jsonl"
for r in 0 1 2; do
  $N $NP2 bench_cost.py --group np2 --round-offset $r --out "$W/results/costs.jsonl"
  $N $NP1 bench_cost.py --group np1 --round-offset $r --out "$W/results/costs.jsonl"
  $N $UL bench_cost.py --group ul --round-offset $r --out "$W/results/costs.jsonl"
done

# 4. memory over 100,000 frames, one process per candidate
rm -f "$W/results/soak.jsonl"
$N $NP2 soak.py --candidate ours-lap --out "$W/results/soak.jsonl"
$N $NP2 soak.py --candidate trackers-bytetrack --out "$W/results/soak.jsonl"
$N $NP1 soak.py --candidate sv-bytetrack --out "$W/results/soak.jsonl"
$N $NP1 soak.py --candidate norfair --out "$W/results/soak.jsonl"
$N $UL soak.py --candidate ul-bytetrack --out "$W/results/soak.jsonl"

$NP2 summarize.py

# 5. the agent itself, an hour, four cameras, tracking on (RSS and tracker cost, first and
# last five minutes)
$AGENT ../soak.py --duration 3600 --objects 12 --world-margin 0.2 --out "$W/results/agent-soak"
