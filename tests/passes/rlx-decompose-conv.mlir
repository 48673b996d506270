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
    %1 = rlx.reshape %w shape = [5, 3] : tensor<5x3x1x1xf32> -> tensor<5x3xf32>
    %2 = rlx.matmul %1, %0 : tensor<5x3xf32>, tensor<2x3x16xf32> -> tensor<2x5x16xf32>
    %3 = rlx.reshape %2 shape = [2, 5, 4, 4] : tensor<2x5x16xf32> -> tensor<2x5x4x4xf32>
    func.return %3 : tensor<2x5x4x4xf32>
  }
}
// -----

// RUN: rlx-decompose-conv
// A 2x1 kernel, stride 2, padded, 2 groups: pad, one gather of the windows' pixels at
// constant indices (K ordered (c, i, j), the weight's order), one grouped GEMM.
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
    %1 = rlx.reshape %0 shape = [1, 72] : tensor<1x4x6x3xf32> -> tensor<1x72xf32>
    %2 = rlx.constant dense<[[[[[0, 2], [6, 8], [12, 14]]], [[[3, 5], [9, 11], [15, 17]]]], [[[[18, 20], [24, 26], [30, 32]]], [[[21, 23], [27, 29], [33, 35]]]], [[[[36, 38], [42, 44], [48, 50]]], [[[39, 41], [45, 47], [51, 53]]]], [[[[54, 56], [60, 62], [66, 68]]], [[[57, 59], [63, 65], [69, 71]]]]]> : tensor<4x2x1x3x2xi32>
    %3 = rlx.gather %1[%2] axis = 1 : tensor<1x72xf32>, tensor<4x2x1x3x2xi32> -> tensor<1x4x2x1x3x2xf32>
    %4 = rlx.reshape %3 shape = [1, 2, 4, 6] : tensor<1x4x2x1x3x2xf32> -> tensor<1x2x4x6xf32>
    %5 = rlx.reshape %w shape = [2, 1, 4] : tensor<2x2x2x1xf32> -> tensor<2x1x4xf32>
    %6 = rlx.matmul %5, %4 : tensor<2x1x4xf32>, tensor<1x2x4x6xf32> -> tensor<1x2x1x6xf32>
    %7 = rlx.reshape %6 shape = [1, 2, 3, 2] : tensor<1x2x1x6xf32> -> tensor<1x2x3x2xf32>
    func.return %7 : tensor<1x2x3x2xf32>
  }
}
