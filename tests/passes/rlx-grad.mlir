// Golden tests of the rlx-grad pass (format: see canonicalize.mlir), followed by cleanup.

// RUN: rlx-grad{wrt=x},cleanup
// RLX parity: d/dx sum(x*x) = 2x, fan-out of x accumulated
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<f32> {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %1 : tensor<f32>
  }
}
// CHECK:
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3xf32> {
    %0 = rlx.add %x, %x : tensor<3xf32>
    func.return %0 : tensor<3xf32>
  }
}
// -----

// RUN: rlx-grad{wrt=w,b},cleanup
// a dense tanh layer: the broadcast bias sums its cotangent; the forward is reused
builtin.module {
  func.func @layer(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x4xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<4xf32> {rlx.kind = "param", rlx.name = "b"}) -> tensor<f32> {
    %0 = rlx.matmul %x, %w : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
    %1 = rlx.broadcast_to %b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %2 = rlx.add %0, %1 : tensor<2x4xf32>
    %3 = rlx.tanh %2 : tensor<2x4xf32>
    %4 = rlx.sum %3 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    func.return %4 : tensor<f32>
  }
}
// CHECK:
builtin.module {
  func.func @layer(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x4xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<4xf32> {rlx.kind = "param", rlx.name = "b"}) -> (tensor<3x4xf32>, tensor<4xf32>) {
    %0 = rlx.matmul %x, %w : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
    %1 = rlx.broadcast_to %b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %2 = rlx.add %0, %1 : tensor<2x4xf32>
    %3 = rlx.tanh %2 : tensor<2x4xf32>
    %4 = rlx.constant dense<1.000000e+00> : tensor<2x4xf32>
    %5 = rlx.mul %3, %3 : tensor<2x4xf32>
    %6 = rlx.sub %4, %5 : tensor<2x4xf32>
    %7 = rlx.sum %6 axes = [0] : tensor<2x4xf32> -> tensor<4xf32>
    %8 = rlx.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
    %9 = rlx.matmul %8, %6 : tensor<3x2xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
    func.return %9, %7 : tensor<3x4xf32>, tensor<4xf32>
  }
}
