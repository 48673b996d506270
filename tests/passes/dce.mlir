// Golden tests of the dce pass (format: see canonicalize.mlir).

// RUN: dce
// unused chains disappear in one pass; unused arguments stay (they are the signature).
builtin.module {
  func.func @dce(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %unused: tensor<3xf32> {rlx.kind = "param", rlx.name = "unused"}) -> tensor<3xf32> {
    %0 = rlx.exp %x : tensor<3xf32>
    %1 = rlx.log %0 : tensor<3xf32>
    %2 = rlx.sum %1 axes = [0] : tensor<3xf32> -> tensor<f32>
    %3 = rlx.constant dense<1.000000e+00> : tensor<3xf32>
    %4 = rlx.tanh %x : tensor<3xf32>
    func.return %4 : tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @dce(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %unused: tensor<3xf32> {rlx.kind = "param", rlx.name = "unused"}) -> tensor<3xf32> {
    %0 = rlx.tanh %x : tensor<3xf32>
    func.return %0 : tensor<3xf32>
  }
}
