// Golden tests of the cleanup pipeline: canonicalize, constant-fold, cse, dce to a
// fixed point (format: see canonicalize.mlir).

// RUN: cleanup
builtin.module {
  func.func @f(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3x2xf32> {
    %0 = rlx.constant dense<1.000000e+00> : tensor<f32>
    %1 = rlx.constant dense<2.000000e+00> : tensor<f32>
    %2 = rlx.sub %1, %0 : tensor<f32>
    %3 = rlx.broadcast_to %2 shape = [2, 3] : tensor<f32> -> tensor<2x3xf32>
    %4 = rlx.mul %x, %3 : tensor<2x3xf32>
    %5 = rlx.transpose %4 perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
    %6 = rlx.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
    %7 = rlx.neg %6 : tensor<3x2xf32>
    %8 = rlx.neg %7 : tensor<3x2xf32>
    %9 = rlx.add %5, %8 : tensor<3x2xf32>
    func.return %9 : tensor<3x2xf32>
  }
}
// CHECK:
builtin.module {
  func.func @f(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3x2xf32> {
    %0 = rlx.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
    %1 = rlx.add %0, %0 : tensor<3x2xf32>
    func.return %1 : tensor<3x2xf32>
  }
}
