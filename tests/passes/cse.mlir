// Golden tests of the cse pass (format: see canonicalize.mlir).

// RUN: cse
// equal pure ops merge (same name, operands, properties, result type), equal
// constants merge; a different property or operand order keeps ops apart.
builtin.module {
  func.func @cse(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %y: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "y"}) -> (tensor<2x3xf32>, tensor<3xf32>, tensor<2xf32>, tensor<2x3xf32>) {
    %0 = rlx.mul %x, %y : tensor<2x3xf32>
    %1 = rlx.mul %x, %y : tensor<2x3xf32>
    %2 = rlx.mul %y, %x : tensor<2x3xf32>
    %3 = rlx.add %0, %1 : tensor<2x3xf32>
    %4 = rlx.add %3, %2 : tensor<2x3xf32>
    %5 = rlx.sum %x axes = [0] : tensor<2x3xf32> -> tensor<3xf32>
    %6 = rlx.sum %x axes = [0] : tensor<2x3xf32> -> tensor<3xf32>
    %7 = rlx.sum %x axes = [1] : tensor<2x3xf32> -> tensor<2xf32>
    %8 = rlx.add %5, %6 : tensor<3xf32>
    %9 = rlx.constant dense<2.000000e+00> : tensor<2x3xf32>
    %10 = rlx.constant dense<2.000000e+00> : tensor<2x3xf32>
    %11 = rlx.constant dense<3.000000e+00> : tensor<2x3xf32>
    %12 = rlx.mul %x, %9 : tensor<2x3xf32>
    %13 = rlx.mul %x, %10 : tensor<2x3xf32>
    %14 = rlx.mul %12, %13 : tensor<2x3xf32>
    %15 = rlx.mul %14, %11 : tensor<2x3xf32>
    func.return %4, %8, %7, %15 : tensor<2x3xf32>, tensor<3xf32>, tensor<2xf32>, tensor<2x3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @cse(%x: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "x"}, %y: tensor<2x3xf32> {rlx.kind = "input", rlx.name = "y"}) -> (tensor<2x3xf32>, tensor<3xf32>, tensor<2xf32>, tensor<2x3xf32>) {
    %0 = rlx.mul %x, %y : tensor<2x3xf32>
    %1 = rlx.mul %y, %x : tensor<2x3xf32>
    %2 = rlx.add %0, %0 : tensor<2x3xf32>
    %3 = rlx.add %2, %1 : tensor<2x3xf32>
    %4 = rlx.sum %x axes = [0] : tensor<2x3xf32> -> tensor<3xf32>
    %5 = rlx.sum %x axes = [1] : tensor<2x3xf32> -> tensor<2xf32>
    %6 = rlx.add %4, %4 : tensor<3xf32>
    %7 = rlx.constant dense<2.000000e+00> : tensor<2x3xf32>
    %8 = rlx.constant dense<3.000000e+00> : tensor<2x3xf32>
    %9 = rlx.mul %x, %7 : tensor<2x3xf32>
    %10 = rlx.mul %9, %9 : tensor<2x3xf32>
    %11 = rlx.mul %10, %8 : tensor<2x3xf32>
    func.return %3, %6, %5, %11 : tensor<2x3xf32>, tensor<3xf32>, tensor<2xf32>, tensor<2x3xf32>
  }
}
