# Face-by-face differences between two rows of results/guidance.py's JSON (NEW - OLD, the mean
# with its standard error over the faces, and on how many faces NEW is better; paired.py's lines):
#   .venv/bin/python results/guidance_paired.py results/s23-guidance/guidance.json "w=2 greedy matched" "w=1 greedy matched"
import json, sys
from paired import print_differences

log = json.load(open(sys.argv[1]))
print_differences("", log[sys.argv[2]], log[sys.argv[3]], sys.argv[2], sys.argv[3])
