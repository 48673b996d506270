// Golden tests of the constant-fold pass (format: see canonicalize.mlir).

// RUN: constant-fold,dce
// small results fold with the interpreter's rules; splat operands of elementwise
// and relayout ops fold to splats of any size; a large non-splat result does not.
builtin.module {
  func.func @fold(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<3xf32>, tensor<f32>, tensor<64x128xf32>, tensor<64x128xi1>, tensor<4097xf32>, tensor<3xf32>) {
    %0 = rlx.constant dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]> : tensor<3xf32>
    %1 = rlx.constant dense<2.000000e+00> : tensor<3xf32>
    %2 = rlx.mul %0, %1 : tensor<3xf32>
    %3 = rlx.sum %2 axes = [0] : tensor<3xf32> -> tensor<f32>
    %4 = rlx.add %x, %2 : tensor<3xf32>
    %5 = rlx.constant dense<5.000000e-01> : tensor<f32>
    %6 = rlx.broadcast_to %5 shape = [64, 128] : tensor<f32> -> tensor<64x128xf32>
    %7 = rlx.exp %6 : tensor<64x128xf32>
    %8 = rlx.gt %7, %6 : tensor<64x128xf32> -> tensor<64x128xi1>
    %9 = rlx.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>
    %10 = rlx.constant dense<0.000000e+00> : tensor<4095xf32>
    %11 = rlx.concat %9, %10, %9 axis = 0 : (tensor<2xf32>, tensor<4095xf32>, tensor<2xf32>) -> tensor<4099xf32>
    %12 = rlx.slice %11 starts = [0] limits = [4097] strides = [1] : tensor<4099xf32> -> tensor<4097xf32>
    %13 = rlx.constant dense<[0, 2, 1]> : tensor<3xi32>
    %14 = rlx.gather %0[%13] axis = 0 : tensor<3xf32>, tensor<3xi32> -> tensor<3xf32>
    func.return %4, %3, %7, %8, %12, %14 : tensor<3xf32>, tensor<f32>, tensor<64x128xf32>, tensor<64x128xi1>, tensor<4097xf32>, tensor<3xf32>
  }
}
// CHECK:
builtin.module {
  func.func @fold(%x: tensor<3xf32> {rlx.kind = "input", rlx.name = "x"}) -> (tensor<3xf32>, tensor<f32>, tensor<64x128xf32>, tensor<64x128xi1>, tensor<4097xf32>, tensor<3xf32>) {
    %0 = rlx.constant dense<[2.000000e+00, 4.000000e+00, 6.000000e+00]> : tensor<3xf32>
    %1 = rlx.constant dense<1.200000e+01> : tensor<f32>
    %2 = rlx.add %x, %0 : tensor<3xf32>
    %3 = rlx.constant dense<"0x4C09D33F"> : tensor<64x128xf32>
    %4 = rlx.constant dense<true> : tensor<64x128xi1>
    %5 = rlx.constant dense<[1.000000e+00, 2.000000e+00]> : tensor<2xf32>
    %6 = rlx.constant dense<"0x00000000"> : tensor<4095xf32>
    %7 = rlx.concat %5, %6, %5 axis = 0 : (tensor<2xf32>, tensor<4095xf32>, tensor<2xf32>) -> tensor<4099xf32>
    %8 = rlx.slice %7 starts = [0] limits = [4097] strides = [1] : tensor<4099xf32> -> tensor<4097xf32>
    %9 = rlx.constant dense<[1.000000e+00, 3.000000e+00, 2.000000e+00]> : tensor<3xf32>
    func.return %2, %1, %3, %4, %8, %9 : tensor<3xf32>, tensor<f32>, tensor<64x128xf32>, tensor<64x128xi1>, tensor<4097xf32>, tensor<3xf32>
  }
}
// -----

// RUN: constant-fold
// results holding inf or NaN are left to run time (their text would not parse back),
// and so is an out-of-range gather.
builtin.module {
  func.func @nofold() -> (tensor<2xf32>, tensor<2xf32>) {
    %0 = rlx.constant dense<[0.000000e+00, 1.000000e+00]> : tensor<2xf32>
    %1 = rlx.log %0 : tensor<2xf32>
    %2 = rlx.constant dense<[0, 7]> : tensor<2xi32>
    %3 = rlx.gather %0[%2] axis = 0 : tensor<2xf32>, tensor<2xi32> -> tensor<2xf32>
    func.return %1, %3 : tensor<2xf32>, tensor<2xf32>
  }
}
// CHECK:
builtin.module {
  func.func @nofold() -> (tensor<2xf32>, tensor<2xf32>) {
    %0 = rlx.constant dense<[0.000000e+00, 1.000000e+00]> : tensor<2xf32>
    %1 = rlx.log %0 : tensor<2xf32>
    %2 = rlx.constant dense<[0, 7]> : tensor<2xi32>
    %3 = rlx.gather %0[%2] axis = 0 : tensor<2xf32>, tensor<2xi32> -> tensor<2xf32>
    func.return %1, %3 : tensor<2xf32>, tensor<2xf32>
  }
}
// -----

// RUN: constant-fold
// a float sum/mean/max/min of a splat folds in closed form at any size (a dynamic mean's
// count, sum(ones), at every sampled size); an integer one of more than INPUT_LIMIT stays.
builtin.module {
  func.func @splatred() -> (tensor<f32>, tensor<1024xf32>, tensor<f64>, tensor<f32>, tensor<i32>) {
    %0 = rlx.constant dense<1.000000e+00> : tensor<2048x1024xf32>
    %1 = rlx.sum %0 axes = [0, 1] : tensor<2048x1024xf32> -> tensor<f32>
    %2 = rlx.constant dense<2.500000e-01> : tensor<2048x1024xf32>
    %3 = rlx.mean %2 axes = [0] : tensor<2048x1024xf32> -> tensor<1024xf32>
    %4 = rlx.constant dense<-3.000000e+00> : tensor<4096x512xf64>
    %5 = rlx.max %4 axes = [0, 1] : tensor<4096x512xf64> -> tensor<f64>
    %6 = rlx.sum %2 axes = [0, 1] : tensor<2048x1024xf32> -> tensor<f32>
    %7 = rlx.constant dense<1> : tensor<2048x1024xi32>
    %8 = rlx.sum %7 axes = [0, 1] : tensor<2048x1024xi32> -> tensor<i32>
    func.return %1, %3, %5, %6, %8 : tensor<f32>, tensor<1024xf32>, tensor<f64>, tensor<f32>, tensor<i32>
  }
}
// CHECK:
builtin.module {
  func.func @splatred() -> (tensor<f32>, tensor<1024xf32>, tensor<f64>, tensor<f32>, tensor<i32>) {
    %0 = rlx.constant dense<"0x0000803F"> : tensor<2048x1024xf32>
    %1 = rlx.constant dense<"0x0000004A"> : tensor<f32>
    %2 = rlx.constant dense<"0x0000803E"> : tensor<2048x1024xf32>
    %3 = rlx.constant dense<"0x0000803E"> : tensor<1024xf32>
    %4 = rlx.constant dense<"0x00000000000008C0"> : tensor<4096x512xf64>
    %5 = rlx.constant dense<-3.000000e+00> : tensor<f64>
    %6 = rlx.constant dense<5.242880e+05> : tensor<f32>
    %7 = rlx.constant dense<1> : tensor<2048x1024xi32>
    %8 = rlx.sum %7 axes = [0, 1] : tensor<2048x1024xi32> -> tensor<i32>
    func.return %1, %3, %5, %6, %8 : tensor<f32>, tensor<1024xf32>, tensor<f64>, tensor<f32>, tensor<i32>
  }
}
