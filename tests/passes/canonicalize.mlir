// Golden tests of the canonicalize pass. Format: cases separated by a line
// holding only the separator `// -- ---` (without the space); each case has a
// `// RUN: <pipeline>` line, the input module, a line `// CHECK:` and the expected
// module. tests/test_cleanup.py runs them; RLXC_UPDATE_GOLDEN=1 rewrites CHECK.

// RUN: canonicalize
// x+0, 0+x, x-0, x*1, 1*x, x/1 all fold to x; the constants stay until dce.
builtin.module {
  func.func @identities(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
    %0 = rlx.constant dense<0.000000e+00> : tensor<3xf32>
    %1 = rlx.constant dense<1.000000e+00> : tensor<3xf32>
    %2 = rlx.add %x, %0 : tensor<3xf32>
    %3 = rlx.add %0, %x : tensor<3xf32>
    %4 = rlx.sub %x, %0 : tensor<3xf32>
    %5 = rlx.mul %x, %1 : tensor<3xf32>
    %6 = rlx.mul %1, %x : tensor<3xf32>
    %7 = rlx.div %x, %1 : tensor<3xf32>
    func.return %2, %3, %4, %5, %6, %7 : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @identities(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
    %0 = rlx.constant dense<0.000000e+00> : tensor<3xf32>
    %1 = rlx.constant dense<1.000000e+00> : tensor<3xf32>
    func.return %x, %x, %x, %x, %x, %x : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
  }
}
// -----

// RUN: canonicalize,dce
// x*0 -> 0 only for provably finite x: an integer tensor or a finite constant.
// A runtime float input may be inf or NaN (constants holding inf: test_cleanup.py).
builtin.module {
  func.func @times_zero(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %i: tensor<3xi32> {rlx.kind = "input", rlx.name = "i"}) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xi32>) {
    %0 = rlx.constant dense<0.000000e+00> : tensor<3xf32>
    %1 = rlx.constant dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]> : tensor<3xf32>
    %2 = rlx.constant dense<0> : tensor<3xi32>
    %4 = rlx.mul %x, %0 : tensor<3xf32>
    %5 = rlx.mul %0, %1 : tensor<3xf32>
    %6 = rlx.mul %i, %2 : tensor<3xi32>
    func.return %4, %5, %6 : tensor<3xf32>, tensor<3xf32>, tensor<3xi32>
  }
}
// CHECK:
builtin.module {
  func.func @times_zero(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %i: tensor<3xi32> {rlx.kind = "input", rlx.name = "i"}) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xi32>) {
    %0 = rlx.constant dense<0.000000e+00> : tensor<3xf32>
    %1 = rlx.constant dense<0> : tensor<3xi32>
    %2 = rlx.mul %x, %0 : tensor<3xf32>
    func.return %2, %0, %1 : tensor<3xf32>, tensor<3xf32>, tensor<3xi32>
  }
}
// -----

// RUN: canonicalize,dce
// neg(neg x) -> x; stop_gradient(stop_gradient x) -> stop_gradient x; select(c, x, x) -> x.
builtin.module {
  func.func @involutions(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %c: tensor<3xi1> {rlx.kind = "input", rlx.name = "c"}) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
    %0 = rlx.neg %x : tensor<3xf32>
    %1 = rlx.neg %0 : tensor<3xf32>
    %2 = rlx.neg %1 : tensor<3xf32>
    %3 = rlx.stop_gradient %x : tensor<3xf32>
    %4 = rlx.stop_gradient %3 : tensor<3xf32>
    %5 = rlx.select %c, %x, %x : tensor<3xi1>, tensor<3xf32>
    func.return %1, %2, %4, %5 : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @involutions(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}, %c: tensor<3xi1> {rlx.kind = "input", rlx.name = "c"}) -> (tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) {
    %0 = rlx.neg %x : tensor<3xf32>
    %1 = rlx.stop_gradient %x : tensor<3xf32>
    func.return %x, %0, %1, %x : tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>
  }
}
// -----

// RUN: canonicalize,dce
// transpose of transpose composes its perms; an identity perm disappears.
builtin.module {
  func.func @transposes(%x: tensor<2x3x4xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<3x2x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>) {
    %0 = rlx.transpose %x perm = [1, 2, 0] : tensor<2x3x4xf32> -> tensor<3x4x2xf32>
    %1 = rlx.transpose %0 perm = [0, 2, 1] : tensor<3x4x2xf32> -> tensor<3x2x4xf32>
    %2 = rlx.transpose %0 perm = [2, 0, 1] : tensor<3x4x2xf32> -> tensor<2x3x4xf32>
    %3 = rlx.transpose %x perm = [0, 1, 2] : tensor<2x3x4xf32> -> tensor<2x3x4xf32>
    func.return %1, %2, %3 : tensor<3x2x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>
  }
}
// CHECK:
builtin.module {
  func.func @transposes(%x: tensor<2x3x4xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<3x2x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>) {
    %0 = rlx.transpose %x perm = [1, 0, 2] : tensor<2x3x4xf32> -> tensor<3x2x4xf32>
    func.return %0, %x, %x : tensor<3x2x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>
  }
}
// -----

// RUN: canonicalize,dce
// reshape of reshape and broadcast_to of broadcast_to start from the source;
// to the operand's own type they disappear, as does a cast to the same type.
builtin.module {
  func.func @chains(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %v: tensor<3xf32> {rlx.kind = "input", rlx.name = "v"}) -> (tensor<3x2xf32>, tensor<2x3xf32>, tensor<5x4x3xf32>, tensor<3xf32>, tensor<2x3xf32>) {
    %0 = rlx.reshape %x shape = [6] : tensor<2x3xf32> -> tensor<6xf32>
    %1 = rlx.reshape %0 shape = [3, 2] : tensor<6xf32> -> tensor<3x2xf32>
    %2 = rlx.reshape %0 shape = [2, 3] : tensor<6xf32> -> tensor<2x3xf32>
    %3 = rlx.broadcast_to %v shape = [4, 3] : tensor<3xf32> -> tensor<4x3xf32>
    %4 = rlx.broadcast_to %3 shape = [5, 4, 3] : tensor<4x3xf32> -> tensor<5x4x3xf32>
    %5 = rlx.broadcast_to %v shape = [3] : tensor<3xf32> -> tensor<3xf32>
    %6 = rlx.cast %x : tensor<2x3xf32> -> tensor<2x3xf32>
    func.return %1, %2, %4, %5, %6 : tensor<3x2xf32>, tensor<2x3xf32>, tensor<5x4x3xf32>, tensor<3xf32>, tensor<2x3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @chains(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %v: tensor<3xf32> {rlx.kind = "input", rlx.name = "v"}) -> (tensor<3x2xf32>, tensor<2x3xf32>, tensor<5x4x3xf32>, tensor<3xf32>, tensor<2x3xf32>) {
    %0 = rlx.reshape %x shape = [3, 2] : tensor<2x3xf32> -> tensor<3x2xf32>
    %1 = rlx.broadcast_to %v shape = [5, 4, 3] : tensor<3xf32> -> tensor<5x4x3xf32>
    func.return %0, %x, %1, %v, %x : tensor<3x2xf32>, tensor<2x3xf32>, tensor<5x4x3xf32>, tensor<3xf32>, tensor<2x3xf32>
  }
}
// -----

// RUN: canonicalize,dce
// a sum over no axes is the identity; a reduction over size-1 axes is a reshape
// (nothing with keepdims); a full slice, a zero pad and a one-input concat vanish.
builtin.module {
  func.func @trivial(%x: tensor<2x1x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>) {
    %0 = rlx.sum %x axes = [] : tensor<2x1x3xf32> -> tensor<2x1x3xf32>
    %1 = rlx.mean %x axes = [1] keepdims : tensor<2x1x3xf32> -> tensor<2x1x3xf32>
    %2 = rlx.max %x axes = [1] : tensor<2x1x3xf32> -> tensor<2x3xf32>
    %3 = rlx.slice %x starts = [0, 0, 0] limits = [2, 1, 3] strides = [1, 1, 1] : tensor<2x1x3xf32> -> tensor<2x1x3xf32>
    %4 = rlx.pad %x low = [0, 0, 0] high = [0, 0, 0] : tensor<2x1x3xf32> -> tensor<2x1x3xf32>
    %5 = rlx.concat %x axis = 2 : (tensor<2x1x3xf32>) -> tensor<2x1x3xf32>
    %6 = rlx.sum %x axes = [0] : tensor<2x1x3xf32> -> tensor<1x3xf32>
    %7 = rlx.sum %x axes = [1] : tensor<2x1x3xf32> -> tensor<2x3xf32>
    func.return %0, %1, %2, %3, %4, %5, %7 : tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @trivial(%x: tensor<2x1x3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>) {
    %0 = rlx.reshape %x shape = [2, 3] : tensor<2x1x3xf32> -> tensor<2x3xf32>
    %1 = rlx.reshape %x shape = [2, 3] : tensor<2x1x3xf32> -> tensor<2x3xf32>
    func.return %x, %x, %0, %x, %x, %x, %1 : tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x1x3xf32>, tensor<2x3xf32>
  }
}
