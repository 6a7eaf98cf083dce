# Face-by-face differences between two rows of guidance.py's JSON (NEW - OLD, the mean
# with its standard error over the faces, and on how many faces NEW is better; paired.py's lines):
#   .venv/bin/python experiments/input-guidance/guidance_paired.py experiments/input-guidance/guidance.json "w=2 greedy matched" "w=1 greedy matched"
import json, sys
import sys; from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/paired.py
from paired import print_differences

log = json.load(open(sys.argv[1]))
print_differences("", log[sys.argv[2]], log[sys.argv[3]], sys.argv[2], sys.argv[3])
