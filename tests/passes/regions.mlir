// Golden tests of the regions pass and of cleanup inside regions (format: see
// canonicalize.mlir).

// -----

// RUN: regions
// loop-invariant ops (the transpose of a capture) move before the scan;
// the unused stacked ys are dropped from the scan and its body
builtin.module {
  func.func @hoist(%x: tensor<4x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x3xf32> {rlx.kind = "input", rlx.name = "w"}) -> tensor<3xf32> {
    %0 = rlx.slice %x starts = [0, 0] limits = [1, 3] strides = [1, 1] : tensor<4x3xf32> -> tensor<1x3xf32>
    %1 = rlx.reshape %0 shape = [3] : tensor<1x3xf32> -> tensor<3xf32>
    %2, %3 = "rlx.scan"(%1, %x, %w) <{length = 4 : i64, num_carry = 1 : i64, num_xs = 1 : i64}> ({
    ^bb0(%4: tensor<3xf32>, %5: tensor<3xf32>, %6: tensor<3x3xf32>):
      %7 = rlx.transpose %6 perm = [1, 0] : tensor<3x3xf32> -> tensor<3x3xf32>
      %8 = rlx.reshape %4 shape = [1, 3] : tensor<3xf32> -> tensor<1x3xf32>
      %9 = rlx.matmul %8, %7 : tensor<1x3xf32>, tensor<3x3xf32> -> tensor<1x3xf32>
      %10 = rlx.reshape %9 shape = [3] : tensor<1x3xf32> -> tensor<3xf32>
      %11 = rlx.add %10, %5 : tensor<3xf32>
      %12 = rlx.tanh %11 : tensor<3xf32>
      %13 = rlx.sum %12 axes = [0] : tensor<3xf32> -> tensor<f32>
      rlx.yield %12, %13 : tensor<3xf32>, tensor<f32>
    }) : (tensor<3xf32>, tensor<4x3xf32>, tensor<3x3xf32>) -> (tensor<3xf32>, tensor<4xf32>)
    func.return %2 : tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @hoist(%x: tensor<4x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x3xf32> {rlx.kind = "input", rlx.name = "w"}) -> tensor<3xf32> {
    %0 = rlx.slice %x starts = [0, 0] limits = [1, 3] strides = [1, 1] : tensor<4x3xf32> -> tensor<1x3xf32>
    %1 = rlx.reshape %0 shape = [3] : tensor<1x3xf32> -> tensor<3xf32>
    %2 = rlx.transpose %w perm = [1, 0] : tensor<3x3xf32> -> tensor<3x3xf32>
    %3 = "rlx.scan"(%1, %x, %2) <{length = 4 : i64, num_carry = 1 : i64, num_xs = 1 : i64}> ({
    ^bb0(%4: tensor<3xf32>, %5: tensor<3xf32>, %6: tensor<3x3xf32>):
      %7 = rlx.reshape %4 shape = [1, 3] : tensor<3xf32> -> tensor<1x3xf32>
      %8 = rlx.matmul %7, %6 : tensor<1x3xf32>, tensor<3x3xf32> -> tensor<1x3xf32>
      %9 = rlx.reshape %8 shape = [3] : tensor<1x3xf32> -> tensor<3xf32>
      %10 = rlx.add %9, %5 : tensor<3xf32>
      %11 = rlx.tanh %10 : tensor<3xf32>
      %12 = rlx.sum %11 axes = [0] : tensor<3xf32> -> tensor<f32>
      rlx.yield %11 : tensor<3xf32>
    }) : (tensor<3xf32>, tensor<4x3xf32>, tensor<3x3xf32>) -> tensor<3xf32>
    func.return %3 : tensor<3xf32>
  }
}

// -----

// RUN: regions
// an rlx.if on a constant predicate becomes the taken branch, inlined
builtin.module {
  func.func @fold_if(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3xf32> {
    %0 = rlx.constant dense<true> : tensor<i1>
    %1 = "rlx.if"(%0, %x) ({
    ^bb0(%2: tensor<3xf32>):
      %3 = rlx.exp %2 : tensor<3xf32>
      rlx.yield %3 : tensor<3xf32>
    }, {
    ^bb0(%4: tensor<3xf32>):
      %5 = rlx.mul %4, %4 : tensor<3xf32>
      rlx.yield %5 : tensor<3xf32>
    }) : (tensor<i1>, tensor<3xf32>) -> tensor<3xf32>
    func.return %1 : tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @fold_if(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3xf32> {
    %0 = rlx.constant dense<true> : tensor<i1>
    %1 = rlx.exp %x : tensor<3xf32>
    func.return %1 : tensor<3xf32>
  }
}

// -----

// RUN: cse,dce
// cse and dce walk into region bodies: the repeated mul/tanh merge
builtin.module {
  func.func @cse_in_body(%x: tensor<4x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3xf32> {
    %0 = rlx.slice %x starts = [0, 0] limits = [1, 3] strides = [1, 1] : tensor<4x3xf32> -> tensor<1x3xf32>
    %1 = rlx.reshape %0 shape = [3] : tensor<1x3xf32> -> tensor<3xf32>
    %2 = "rlx.scan"(%1, %x) <{length = 4 : i64, num_carry = 1 : i64, num_xs = 1 : i64}> ({
    ^bb0(%3: tensor<3xf32>, %4: tensor<3xf32>):
      %5 = rlx.mul %3, %4 : tensor<3xf32>
      %6 = rlx.tanh %5 : tensor<3xf32>
      %7 = rlx.mul %3, %4 : tensor<3xf32>
      %8 = rlx.tanh %7 : tensor<3xf32>
      %9 = rlx.add %6, %8 : tensor<3xf32>
      rlx.yield %9 : tensor<3xf32>
    }) : (tensor<3xf32>, tensor<4x3xf32>) -> tensor<3xf32>
    func.return %2 : tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @cse_in_body(%x: tensor<4x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> tensor<3xf32> {
    %0 = rlx.slice %x starts = [0, 0] limits = [1, 3] strides = [1, 1] : tensor<4x3xf32> -> tensor<1x3xf32>
    %1 = rlx.reshape %0 shape = [3] : tensor<1x3xf32> -> tensor<3xf32>
    %2 = "rlx.scan"(%1, %x) <{length = 4 : i64, num_carry = 1 : i64, num_xs = 1 : i64}> ({
    ^bb0(%3: tensor<3xf32>, %4: tensor<3xf32>):
      %5 = rlx.mul %3, %4 : tensor<3xf32>
      %6 = rlx.tanh %5 : tensor<3xf32>
      %7 = rlx.add %6, %6 : tensor<3xf32>
      rlx.yield %7 : tensor<3xf32>
    }) : (tensor<3xf32>, tensor<4x3xf32>) -> tensor<3xf32>
    func.return %2 : tensor<3xf32>
  }
}
