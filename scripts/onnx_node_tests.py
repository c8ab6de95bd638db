#!/usr/bin/env python3
"""Write the ONNX backend node tests (onnx.backend.test, built in memory since
onnx 1.23) to disk in the layout of onnx's old test directories:

    OUT/<test_name>/model.onnx
    OUT/<test_name>/test_data_set_N/input_K.pb, output_K.pb   (TensorProto)
    OUT/<test_name>/tolerance.txt                              "rtol atol"

Usage: onnx_node_tests.py OUT
Needs the `onnx` package (scripts/onnx-node-tests.sh installs 1.23 in a venv).
Inputs or outputs that are not plain tensors (sequences, optionals, maps) are
written as `input_K.unsupported` so the runner can count the case as
unsupported instead of guessing.
"""
import os
import sys
import warnings

warnings.filterwarnings("ignore")
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402
from onnx.backend.test.case import node as node_cases  # noqa: E402


def write_value(path_base, proto_type, value):
    """Writes one value as a TensorProto .pb; returns False when it is not a tensor."""
    if proto_type is not None and not proto_type.HasField("tensor_type"):
        open(path_base + ".unsupported", "w").write("non-tensor value\n")
        return False
    if isinstance(value, onnx.TensorProto):
        with open(path_base + ".pb", "wb") as f:
            f.write(value.SerializeToString())
        return True
    if not isinstance(value, np.ndarray):
        value = np.asarray(value)
    elem = proto_type.tensor_type.elem_type if proto_type is not None else None
    try:
        if elem is not None and elem not in (onnx.TensorProto.STRING,):
            t = numpy_helper.from_array(value)
            if t.data_type != elem:
                # onnx's custom dtypes (float8, int4, bfloat16) arrive as numpy
                # arrays of another type: let onnx convert with the declared one.
                t = onnx.helper.make_tensor("", elem, value.shape,
                                            value.flatten().tolist())
        else:
            t = numpy_helper.from_array(value)
    except Exception as e:  # noqa: BLE001
        open(path_base + ".unsupported", "w").write(f"{e}\n")
        return False
    with open(path_base + ".pb", "wb") as f:
        f.write(t.SerializeToString())
    return True


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    cases = node_cases.collect_testcases()
    written = 0
    for case in cases:
        d = os.path.join(out, case.name)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "model.onnx"), "wb") as f:
            f.write(case.model.SerializeToString())
        with open(os.path.join(d, "tolerance.txt"), "w") as f:
            f.write(f"{case.rtol} {case.atol}\n")
        g = case.model.graph
        init_names = {i.name for i in g.initializer}
        ins = [v for v in g.input if v.name not in init_names]
        for si, (inputs, outputs) in enumerate(case.data_sets or []):
            sd = os.path.join(d, f"test_data_set_{si}")
            os.makedirs(sd, exist_ok=True)
            for k, v in enumerate(inputs):
                write_value(os.path.join(sd, f"input_{k}"), ins[k].type if k < len(ins) else None, v)
            for k, v in enumerate(outputs):
                write_value(os.path.join(sd, f"output_{k}"), g.output[k].type if k < len(g.output) else None, v)
        written += 1
    print(f"onnx {onnx.__version__}: wrote {written} node tests to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
