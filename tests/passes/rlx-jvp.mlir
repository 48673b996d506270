// Golden tests of the rlx-jvp pass (format: see canonicalize.mlir), followed by cleanup.

// RUN: rlx-jvp{wrt=x},cleanup
// adds input tangent_x; outputs [primal, tangent]
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<f32> {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %1 : tensor<f32>
  }
}
// CHECK:
builtin.module {
  func.func @sum_sq(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %tangent_x: tensor<3xf32> {rlx.kind = "input", rlx.name = "tangent_x"}) -> (tensor<f32>, tensor<f32>) {
    %0 = rlx.mul %x, %x : tensor<3xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<3xf32> -> tensor<f32>
    %2 = rlx.mul %tangent_x, %x : tensor<3xf32>
    %3 = rlx.add %2, %2 : tensor<3xf32>
    %4 = rlx.sum %3 axes = [0] : tensor<3xf32> -> tensor<f32>
    func.return %1, %4 : tensor<f32>, tensor<f32>
  }
}
// -----

// RUN: rlx-jvp{wrt=b},cleanup
// tangents of x and w are zero and never materialized
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
  func.func @layer(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x4xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<4xf32> {rlx.kind = "param", rlx.name = "b"}, %tangent_b: tensor<4xf32> {rlx.kind = "input", rlx.name = "tangent_b"}) -> (tensor<f32>, tensor<f32>) {
    %0 = rlx.matmul %x, %w : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
    %1 = rlx.broadcast_to %b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %2 = rlx.add %0, %1 : tensor<2x4xf32>
    %3 = rlx.tanh %2 : tensor<2x4xf32>
    %4 = rlx.sum %3 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    %5 = rlx.broadcast_to %tangent_b shape = [2, 4] : tensor<4xf32> -> tensor<2x4xf32>
    %6 = rlx.mul %3, %3 : tensor<2x4xf32>
    %7 = rlx.constant dense<1.000000e+00> : tensor<2x4xf32>
    %8 = rlx.sub %7, %6 : tensor<2x4xf32>
    %9 = rlx.mul %5, %8 : tensor<2x4xf32>
    %10 = rlx.sum %9 axes = [0, 1] : tensor<2x4xf32> -> tensor<f32>
    func.return %4, %10 : tensor<f32>, tensor<f32>
  }
}
