#!/usr/bin/env python3
"""compare.py GOT.npy WANT.npy TOL LABEL: max |got - want| <= TOL (and equal
shapes), printing the difference; exit 1 otherwise."""
import sys

import numpy as np

got, want = np.load(sys.argv[1]), np.load(sys.argv[2])
tol, label = float(sys.argv[3]), sys.argv[4]
if got.shape != want.shape:
    print(f"FAIL {label}: shape {got.shape}, expected {want.shape}")
    sys.exit(1)
d = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
print(f"{'ok' if d <= tol else 'FAIL'} {label}: max |diff| {d:.3g} (tolerance {tol:g})")
sys.exit(0 if d <= tol else 1)
