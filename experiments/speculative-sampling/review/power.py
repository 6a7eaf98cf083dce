# power check: break the residual (sample p after a rejection) -> the PIT test must fail
import sys
sys.argv = ["x", "7", "3000", "0.3", "1.0", "default", "4"]
import sr_blockwise.decoding as D
D.residual_logits = lambda p, q, T: p.float() / T
__file__ = __import__("os").path.join(__import__("os").path.dirname(__import__("os").path.abspath(__file__)), "dist_test.py"); exec(open(__file__).read())
