// Golden tests of the rlx-decompose-conv pass (dialect/conv_decompose.py). Format: cases
// separated by a line holding only the separator `// -- ---` (without the space); each case
// has a `// RUN: <pipeline>` line, the input module, a line `// CHECK:` and the expected
// module. tests/test_cleanup.py runs them; RLXC_UPDATE_GOLDEN=1 rewrites CHECK.

// RUN: rlx-decompose-conv
// A 1x1 stride-1 conv is a GEMM on x reshaped: no im2col.
builtin.module {
  func.func @pointwise(%x: tensor<2x3x4x4xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<5x3x1x1xf32> {rlx.kind = "param", rlx.name = "w"}) -> tensor<2x5x4x4xf32> {
    %0 = rlx.conv2d %x, %w stride = [1, 1] padding = [0, 0, 0, 0] dilation = [1, 1] groups = 1 : tensor<2x3x4x4xf32>, tensor<5x3x1x1xf32> -> tensor<2x5x4x4xf32>
    func.return %0 : tensor<2x5x4x4xf32>
  }
}
// CHECK:
builtin.module {
  func.func @pointwise(%x: tensor<2x3x4x4xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<5x3x1x1xf32> {rlx.kind = "param", rlx.name = "w"}) -> tensor<2x5x4x4xf32> {
    %0 = rlx.reshape %x shape = [2, 3, 16] : tensor<2x3x4x4xf32> -> tensor<2x3x16xf32>
    %1 = rlx.transpose %w perm = [0, 2, 3, 1] : tensor<5x3x1x1xf32> -> tensor<5x1x1x3xf32>
    %2 = rlx.reshape %1 shape = [5, 3] : tensor<5x1x1x3xf32> -> tensor<5x3xf32>
    %3 = rlx.matmul %2, %0 : tensor<5x3xf32>, tensor<2x3x16xf32> -> tensor<2x5x16xf32>
    %4 = rlx.reshape %3 shape = [2, 5, 4, 4] : tensor<2x5x16xf32> -> tensor<2x5x4x4xf32>
    func.return %4 : tensor<2x5x4x4xf32>
  }
}
// -----

// RUN: rlx-decompose-conv
// A 2x1 kernel, stride 2, padded, 2 groups: pad, two strided windows concatenated with K
// ordered (i, j, c), the weight permuted to match, one grouped GEMM.
builtin.module {
  func.func @grouped(%x: tensor<1x4x5x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<2x2x2x1xf32> {rlx.kind = "param", rlx.name = "w"}) -> tensor<1x2x3x2xf32> {
    %0 = rlx.conv2d %x, %w stride = [2, 2] padding = [1, 0, 0, 0] dilation = [1, 1] groups = 2 : tensor<1x4x5x3xf32>, tensor<2x2x2x1xf32> -> tensor<1x2x3x2xf32>
    func.return %0 : tensor<1x2x3x2xf32>
  }
}
// CHECK:
builtin.module {
  func.func @grouped(%x: tensor<1x4x5x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<2x2x2x1xf32> {rlx.kind = "param", rlx.name = "w"}) -> tensor<1x2x3x2xf32> {
    %0 = rlx.pad %x low = [0, 0, 1, 0] high = [0, 0, 0, 0] : tensor<1x4x5x3xf32> -> tensor<1x4x6x3xf32>
    %1 = rlx.slice %0 starts = [0, 0, 0, 0] limits = [1, 4, 5, 3] strides = [1, 1, 2, 2] : tensor<1x4x6x3xf32> -> tensor<1x4x3x2xf32>
    %2 = rlx.slice %0 starts = [0, 0, 1, 0] limits = [1, 4, 6, 3] strides = [1, 1, 2, 2] : tensor<1x4x6x3xf32> -> tensor<1x4x3x2xf32>
    %3 = rlx.reshape %1 shape = [1, 2, 2, 6] : tensor<1x4x3x2xf32> -> tensor<1x2x2x6xf32>
    %4 = rlx.reshape %2 shape = [1, 2, 2, 6] : tensor<1x4x3x2xf32> -> tensor<1x2x2x6xf32>
    %5 = rlx.concat %3, %4 axis = 2 : (tensor<1x2x2x6xf32>, tensor<1x2x2x6xf32>) -> tensor<1x2x4x6xf32>
    %6 = rlx.transpose %w perm = [0, 2, 3, 1] : tensor<2x2x2x1xf32> -> tensor<2x2x1x2xf32>
    %7 = rlx.reshape %6 shape = [2, 1, 4] : tensor<2x2x1x2xf32> -> tensor<2x1x4xf32>
    %8 = rlx.matmul %7, %5 : tensor<2x1x4xf32>, tensor<1x2x4x6xf32> -> tensor<1x2x1x6xf32>
    %9 = rlx.reshape %8 shape = [1, 2, 3, 2] : tensor<1x2x1x6xf32> -> tensor<1x2x3x2xf32>
    func.return %9 : tensor<1x2x3x2xf32>
  }
}
