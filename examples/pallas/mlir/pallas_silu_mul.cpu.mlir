module @jit_silu_mul attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<16x256xf32>, %arg1: tensor<16x256xf32>) -> (tensor<16x256xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<true> : tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %cst = stablehlo.constant dense<1.000000e+00> : tensor<f32>
    %c_1 = stablehlo.constant dense<256> : tensor<i32>
    %c_2 = stablehlo.constant dense<16> : tensor<i32>
    %c_3 = stablehlo.constant dense<128> : tensor<i32>
    %c_4 = stablehlo.constant dense<8> : tensor<i32>
    %c_5 = stablehlo.constant dense<0> : tensor<i32>
    %c_6 = stablehlo.constant dense<2> : tensor<i32>
    %cst_7 = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst_7, dims = [] : (tensor<f32>) -> tensor<16x256xf32>
    %1 = stablehlo.multiply %c_6, %c_6 : tensor<i32>
    %2:7 = stablehlo.while(%iterArg = %1, %iterArg_8 = %c_5, %iterArg_9 = %c_5, %iterArg_10 = %c_5, %iterArg_11 = %arg0, %iterArg_12 = %arg1, %iterArg_13 = %0) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<16x256xf32>, tensor<16x256xf32>, tensor<16x256xf32>
    cond {
      %3 = stablehlo.convert %iterArg : tensor<i32>
      %4 = stablehlo.compare LT, %iterArg_8, %3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %4 : tensor<i1>
    } do {
      %3 = stablehlo.multiply %c_4, %iterArg_9 : tensor<i32>
      %4 = stablehlo.multiply %c_3, %iterArg_10 : tensor<i32>
      %5 = stablehlo.multiply %c_4, %iterArg_9 : tensor<i32>
      %6 = stablehlo.multiply %c_3, %iterArg_10 : tensor<i32>
      %7 = stablehlo.multiply %c_4, %iterArg_9 : tensor<i32>
      %8 = stablehlo.multiply %c_3, %iterArg_10 : tensor<i32>
      %9 = stablehlo.compare LT, %3, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %10 = stablehlo.add %3, %c_2 : tensor<i32>
      %11 = stablehlo.select %9, %10, %3 : tensor<i1>, tensor<i32>
      %12 = stablehlo.compare LT, %4, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %13 = stablehlo.add %4, %c_1 : tensor<i32>
      %14 = stablehlo.select %12, %13, %4 : tensor<i1>, tensor<i32>
      %15 = stablehlo.dynamic_slice %iterArg_11, %11, %14, sizes = [8, 128] : (tensor<16x256xf32>, tensor<i32>, tensor<i32>) -> tensor<8x128xf32>
      %16 = stablehlo.compare LT, %5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %17 = stablehlo.add %5, %c_2 : tensor<i32>
      %18 = stablehlo.select %16, %17, %5 : tensor<i1>, tensor<i32>
      %19 = stablehlo.compare LT, %6, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %20 = stablehlo.add %6, %c_1 : tensor<i32>
      %21 = stablehlo.select %19, %20, %6 : tensor<i1>, tensor<i32>
      %22 = stablehlo.dynamic_slice %iterArg_12, %18, %21, sizes = [8, 128] : (tensor<16x256xf32>, tensor<i32>, tensor<i32>) -> tensor<8x128xf32>
      %23 = stablehlo.negate %15 : tensor<8x128xf32>
      %24 = stablehlo.exponential %23 : tensor<8x128xf32>
      %25 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x128xf32>
      %26 = stablehlo.add %25, %24 : tensor<8x128xf32>
      %27 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x128xf32>
      %28 = stablehlo.divide %27, %26 : tensor<8x128xf32>
      %29 = stablehlo.multiply %15, %28 : tensor<8x128xf32>
      %30 = stablehlo.multiply %29, %22 : tensor<8x128xf32>
      %31 = stablehlo.compare LT, %3, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %32 = stablehlo.add %3, %c_2 : tensor<i32>
      %33 = stablehlo.select %31, %32, %3 : tensor<i1>, tensor<i32>
      %34 = stablehlo.compare LT, %4, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %35 = stablehlo.add %4, %c_1 : tensor<i32>
      %36 = stablehlo.select %34, %35, %4 : tensor<i1>, tensor<i32>
      %37 = stablehlo.dynamic_update_slice %iterArg_11, %15, %33, %36 : (tensor<16x256xf32>, tensor<8x128xf32>, tensor<i32>, tensor<i32>) -> tensor<16x256xf32>
      %38 = stablehlo.compare LT, %5, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %39 = stablehlo.add %5, %c_2 : tensor<i32>
      %40 = stablehlo.select %38, %39, %5 : tensor<i1>, tensor<i32>
      %41 = stablehlo.compare LT, %6, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %42 = stablehlo.add %6, %c_1 : tensor<i32>
      %43 = stablehlo.select %41, %42, %6 : tensor<i1>, tensor<i32>
      %44 = stablehlo.dynamic_update_slice %iterArg_12, %22, %40, %43 : (tensor<16x256xf32>, tensor<8x128xf32>, tensor<i32>, tensor<i32>) -> tensor<16x256xf32>
      %45 = stablehlo.compare LT, %7, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %46 = stablehlo.add %7, %c_2 : tensor<i32>
      %47 = stablehlo.select %45, %46, %7 : tensor<i1>, tensor<i32>
      %48 = stablehlo.compare LT, %8, %c_5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %49 = stablehlo.add %8, %c_1 : tensor<i32>
      %50 = stablehlo.select %48, %49, %8 : tensor<i1>, tensor<i32>
      %51 = stablehlo.dynamic_update_slice %iterArg_13, %30, %47, %50 : (tensor<16x256xf32>, tensor<8x128xf32>, tensor<i32>, tensor<i32>) -> tensor<16x256xf32>
      %52 = stablehlo.add %iterArg_8, %c_0 : tensor<i32>
      %53 = stablehlo.add %iterArg_10, %c_0 : tensor<i32>
      %54 = func.call @_where(%c, %53, %iterArg_10) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %55 = stablehlo.compare EQ, %54, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %56 = func.call @_where_0(%55, %c_5, %54) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %57 = stablehlo.add %iterArg_9, %c_0 : tensor<i32>
      %58 = func.call @_where(%55, %57, %iterArg_9) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %59 = stablehlo.compare EQ, %58, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %60 = func.call @_where_0(%59, %c_5, %58) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      stablehlo.return %iterArg, %52, %60, %56, %37, %44, %51 : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<16x256xf32>, tensor<16x256xf32>, tensor<16x256xf32>
    }
    return %2#6 : tensor<16x256xf32>
  }
  func.func private @_where(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @_where_0(%arg0: tensor<i1>, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = stablehlo.select %arg0, %0, %arg2 : tensor<i1>, tensor<i32>
    return %1 : tensor<i32>
  }
}
