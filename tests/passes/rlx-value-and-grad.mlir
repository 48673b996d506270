// Golden tests of the rlx-value-and-grad pass (format: see canonicalize.mlir), followed by cleanup.

// RUN: rlx-value-and-grad{wrt=x},cleanup
// the loss first, then the gradient; one forward
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<f32> {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %1 : tensor<f32>
  }
}
// CHECK:
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<f32>, tensor<3xf32>) {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    %2 = rlx.add %x, %x : tensor<3xf32>
    func.return %1, %2 : tensor<f32>, tensor<3xf32>
  }
}
// -----

// RUN: rlx-value-and-grad{wrt=x,w},cleanup
// gradients w.r.t. an input and a param, in wrt order
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
  func.func @layer(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x4xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<4xf32> {rlx.kind = "param", rlx.name = "b"}) -> (tensor<f32>, tensor<2x3xf32>, tensor<3x4xf32>) {
    %0 = rlx.matmul %x, %w : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
    %1 = rlx.broadcast_to %b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %2 = rlx.add %0, %1 : tensor<2x4xf32>
    %3 = rlx.tanh %2 : tensor<2x4xf32>
    %4 = rlx.sum %3 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    %5 = rlx.constant dense<1.000000e+00> : tensor<2x4xf32>
    %6 = rlx.mul %3, %3 : tensor<2x4xf32>
    %7 = rlx.sub %5, %6 : tensor<2x4xf32>
    %8 = rlx.transpose %w perm = [1, 0] : tensor<3x4xf32> -> tensor<4x3xf32>
    %9 = rlx.matmul %7, %8 : tensor<2x4xf32>, tensor<4x3xf32> -> tensor<2x3xf32>
    %10 = rlx.transpose %x perm = [1, 0] : tensor<2x3xf32> -> tensor<3x2xf32>
    %11 = rlx.matmul %10, %7 : tensor<3x2xf32>, tensor<2x4xf32> -> tensor<3x4xf32>
    func.return %4, %9, %11 : tensor<f32>, tensor<2x3xf32>, tensor<3x4xf32>
  }
}
