// Golden tests of the rlx-hvp pass (format: see canonicalize.mlir), followed by cleanup.

// RUN: rlx-hvp{wrt=x},cleanup
// outputs [loss, grad, <grad, v>, Hv]: Hv = 2v
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<f32> {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %1 : tensor<f32>
  }
}
// CHECK:
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %tangent_x: tensor<3xf32> {rlx.kind = "input", rlx.name = "tangent_x"}) -> (tensor<f32>, tensor<3xf32>, tensor<f32>, tensor<3xf32>) {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    %2 = rlx.add %x, %x : tensor<3xf32>
    %3 = rlx.mul %tangent_x, %x : tensor<3xf32>
    %4 = rlx.add %3, %3 : tensor<3xf32>
    %5 = rlx.sum %4 axes = [0] : tensor<3xf32> -> tensor<f32>
    %6 = rlx.add %tangent_x, %tangent_x : tensor<3xf32>
    func.return %1, %2, %5, %6 : tensor<f32>, tensor<3xf32>, tensor<f32>, tensor<3xf32>
  }
}
// -----

// RUN: rlx-hvp{wrt=b},cleanup
// forward-over-reverse through tanh
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
  func.func @layer(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x4xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<4xf32> {rlx.kind = "param", rlx.name = "b"}, %tangent_b: tensor<4xf32> {rlx.kind = "input", rlx.name = "tangent_b"}) -> (tensor<f32>, tensor<4xf32>, tensor<f32>, tensor<4xf32>) {
    %0 = rlx.matmul %x, %w : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
    %1 = rlx.broadcast_to %b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %2 = rlx.add %0, %1 : tensor<2x4xf32>
    %3 = rlx.tanh %2 : tensor<2x4xf32>
    %4 = rlx.sum %3 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    %5 = rlx.constant dense<1.000000e+00> : tensor<2x4xf32>
    %6 = rlx.mul %3, %3 : tensor<2x4xf32>
    %7 = rlx.sub %5, %6 : tensor<2x4xf32>
    %8 = rlx.sum %7 axes = [0] : tensor<2x4xf32> -> tensor<4xf32>
    %9 = rlx.broadcast_to %tangent_b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %10 = rlx.mul %9, %7 : tensor<2x4xf32>
    %11 = rlx.sum %10 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    %12 = rlx.mul %10, %3 : tensor<2x4xf32>
    %13 = rlx.add %12, %12 : tensor<2x4xf32>
    %14 = rlx.neg %13 : tensor<2x4xf32>
    %15 = rlx.sum %14 axes = [0] : tensor<2x4xf32> -> tensor<4xf32>
    func.return %4, %8, %11, %15 : tensor<f32>, tensor<4xf32>, tensor<f32>, tensor<4xf32>
  }
}
