// Golden tests of the rlx-vmap pass (format: see canonicalize.mlir).

// RUN: rlx-vmap{batched=x size=4}
// a batched lhs against an unbatched 2-D weight is one large matmul; the bias is
// shared and only broadcast; the unbatched output gains the batch axis too.
builtin.module {
  func.func @layer(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x5xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<5xf32> {rlx.kind = "param", rlx.name = "b"}) -> (tensor<2x5xf32>, tensor<5xf32>) {
    %0 = rlx.matmul %x, %w : tensor<2x3xf32>, tensor<3x5xf32> -> tensor<2x5xf32>
    %1 = rlx.broadcast_to %b shape = [2, 5] : tensor<5xf32> -> tensor<2x5xf32>
    %2 = rlx.add %0, %1 : tensor<2x5xf32>
    %3 = rlx.tanh %b : tensor<5xf32>
    func.return %2, %3 : tensor<2x5xf32>, tensor<5xf32>
  }
}
// CHECK:
builtin.module {
  func.func @layer(%x: tensor<4x2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %w: tensor<3x5xf32> {rlx.kind = "param", rlx.name = "w"}, %b: tensor<5xf32> {rlx.kind = "param", rlx.name = "b"}) -> (tensor<4x2x5xf32>, tensor<4x5xf32>) {
    %0 = rlx.reshape %x shape = [8, 3] : tensor<4x2x3xf32> -> tensor<8x3xf32>
    %1 = rlx.matmul %0, %w : tensor<8x3xf32>, tensor<3x5xf32> -> tensor<8x5xf32>
    %2 = rlx.reshape %1 shape = [4, 2, 5] : tensor<8x5xf32> -> tensor<4x2x5xf32>
    %3 = rlx.broadcast_to %b shape = [2, 5] : tensor<5xf32> -> tensor<2x5xf32>
    %4 = rlx.broadcast_to %3 shape = [4, 2, 5] : tensor<2x5xf32> -> tensor<4x2x5xf32>
    %5 = rlx.add %2, %4 : tensor<4x2x5xf32>
    %6 = rlx.tanh %b : tensor<5xf32>
    %7 = rlx.broadcast_to %6 shape = [4, 5] : tensor<5xf32> -> tensor<4x5xf32>
    func.return %5, %7 : tensor<4x2x5xf32>, tensor<4x5xf32>
  }
}
// -----

// RUN: rlx-vmap{batched=x,y size=2}
// both sides batched: a batched matmul; reductions shift their axes past the batch.
builtin.module {
  func.func @bmm(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %y: tensor<3x4xf32> {rlx.kind = "input", rlx.name = "y"}) -> tensor<4xf32> {
    %0 = rlx.matmul %x, %y : tensor<2x3xf32>, tensor<3x4xf32> -> tensor<2x4xf32>
    %1 = rlx.sum %0 axes = [0] : tensor<2x4xf32> -> tensor<4xf32>
    func.return %1 : tensor<4xf32>
  }
}
// CHECK:
builtin.module {
  func.func @bmm(%x: tensor<2x2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %y: tensor<2x3x4xf32> {rlx.kind = "input", rlx.name = "y"}) -> tensor<2x4xf32> {
    %0 = rlx.matmul %x, %y : tensor<2x2x3xf32>, tensor<2x3x4xf32> -> tensor<2x2x4xf32>
    %1 = rlx.sum %0 axes = [1] : tensor<2x2x4xf32> -> tensor<2x4xf32>
    func.return %1 : tensor<2x4xf32>
  }
}
// -----

// RUN: rlx-vmap{batched=i size=2}
// batched indices into a shared table: one gather, the batch axis moved to the front.
builtin.module {
  func.func @lookup(%t: tensor<3x5xf32> {rlx.kind = "param", rlx.name = "t"}, %i: tensor<4xi32> {rlx.kind = "input", rlx.name = "i"}) -> tensor<3x4xf32> {
    %0 = rlx.gather %t[%i] axis = 1 : tensor<3x5xf32>, tensor<4xi32> -> tensor<3x4xf32>
    func.return %0 : tensor<3x4xf32>
  }
}
// CHECK:
builtin.module {
  func.func @lookup(%t: tensor<3x5xf32> {rlx.kind = "param", rlx.name = "t"}, %i: tensor<2x4xi32> {rlx.kind = "input", rlx.name = "i"}) -> tensor<2x3x4xf32> {
    %0 = rlx.gather %t[%i] axis = 1 : tensor<3x5xf32>, tensor<2x4xi32> -> tensor<3x2x4xf32>
    %1 = rlx.transpose %0 perm = [1, 0, 2] : tensor<3x2x4xf32> -> tensor<2x3x4xf32>
    func.return %1 : tensor<2x3x4xf32>
  }
}
