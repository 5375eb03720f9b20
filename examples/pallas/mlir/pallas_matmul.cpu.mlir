module @jit_matmul attributes {jax.uses_shape_polymorphism = false, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<256x256xf32>, %arg1: tensor<256x256xf32>) -> (tensor<256x256xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<true> : tensor<i1>
    %c_0 = stablehlo.constant dense<1> : tensor<i32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %c_1 = stablehlo.constant dense<256> : tensor<i32>
    %c_2 = stablehlo.constant dense<128> : tensor<i32>
    %c_3 = stablehlo.constant dense<0> : tensor<i32>
    %c_4 = stablehlo.constant dense<2> : tensor<i32>
    %cst_5 = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %0 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<256x256xf32>
    %1 = stablehlo.broadcast_in_dim %cst_5, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
    %2 = stablehlo.multiply %c_4, %c_4 : tensor<i32>
    %3 = stablehlo.multiply %2, %c_4 : tensor<i32>
    %4:9 = stablehlo.while(%iterArg = %3, %iterArg_6 = %c_3, %iterArg_7 = %c_3, %iterArg_8 = %c_3, %iterArg_9 = %c_3, %iterArg_10 = %arg0, %iterArg_11 = %arg1, %iterArg_12 = %0, %iterArg_13 = %1) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<256x256xf32>, tensor<256x256xf32>, tensor<256x256xf32>, tensor<128x128xf32>
    cond {
      %5 = stablehlo.convert %iterArg : tensor<i32>
      %6 = stablehlo.compare LT, %iterArg_6, %5, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %6 : tensor<i1>
    } do {
      %5 = stablehlo.multiply %c_2, %iterArg_7 : tensor<i32>
      %6 = stablehlo.multiply %c_2, %iterArg_9 : tensor<i32>
      %7 = stablehlo.multiply %c_2, %iterArg_9 : tensor<i32>
      %8 = stablehlo.multiply %c_2, %iterArg_8 : tensor<i32>
      %9 = stablehlo.multiply %c_2, %iterArg_7 : tensor<i32>
      %10 = stablehlo.multiply %c_2, %iterArg_8 : tensor<i32>
      %11 = stablehlo.compare LT, %5, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %12 = stablehlo.add %5, %c_1 : tensor<i32>
      %13 = stablehlo.select %11, %12, %5 : tensor<i1>, tensor<i32>
      %14 = stablehlo.compare LT, %6, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %15 = stablehlo.add %6, %c_1 : tensor<i32>
      %16 = stablehlo.select %14, %15, %6 : tensor<i1>, tensor<i32>
      %17 = stablehlo.dynamic_slice %iterArg_10, %13, %16, sizes = [128, 128] : (tensor<256x256xf32>, tensor<i32>, tensor<i32>) -> tensor<128x128xf32>
      %18 = stablehlo.compare LT, %7, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %19 = stablehlo.add %7, %c_1 : tensor<i32>
      %20 = stablehlo.select %18, %19, %7 : tensor<i1>, tensor<i32>
      %21 = stablehlo.compare LT, %8, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %22 = stablehlo.add %8, %c_1 : tensor<i32>
      %23 = stablehlo.select %21, %22, %8 : tensor<i1>, tensor<i32>
      %24 = stablehlo.dynamic_slice %iterArg_11, %20, %23, sizes = [128, 128] : (tensor<256x256xf32>, tensor<i32>, tensor<i32>) -> tensor<128x128xf32>
      %25 = stablehlo.compare LT, %9, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %26 = stablehlo.add %9, %c_1 : tensor<i32>
      %27 = stablehlo.select %25, %26, %9 : tensor<i1>, tensor<i32>
      %28 = stablehlo.compare LT, %10, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %29 = stablehlo.add %10, %c_1 : tensor<i32>
      %30 = stablehlo.select %28, %29, %10 : tensor<i1>, tensor<i32>
      %31 = stablehlo.dynamic_slice %iterArg_12, %27, %30, sizes = [128, 128] : (tensor<256x256xf32>, tensor<i32>, tensor<i32>) -> tensor<128x128xf32>
      %32 = stablehlo.compare EQ, %iterArg_9, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %33 = stablehlo.convert %32 : (tensor<i1>) -> tensor<i32>
      %34 = "stablehlo.case"(%33) ({
        stablehlo.return %iterArg_13 : tensor<128x128xf32>
      }, {
        %74 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<128x128xf32>
        stablehlo.return %74 : tensor<128x128xf32>
      }) : (tensor<i32>) -> tensor<128x128xf32>
      %35 = stablehlo.dot_general %17, %24, contracting_dims = [1] x [0] : (tensor<128x128xf32>, tensor<128x128xf32>) -> tensor<128x128xf32>
      %36 = stablehlo.add %34, %35 : tensor<128x128xf32>
      %37 = stablehlo.compare EQ, %iterArg_9, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %38 = stablehlo.convert %37 : (tensor<i1>) -> tensor<i32>
      %39 = "stablehlo.case"(%38) ({
        stablehlo.return %31 : tensor<128x128xf32>
      }, {
        stablehlo.return %36 : tensor<128x128xf32>
      }) : (tensor<i32>) -> tensor<128x128xf32>
      %40 = stablehlo.compare LT, %5, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %41 = stablehlo.add %5, %c_1 : tensor<i32>
      %42 = stablehlo.select %40, %41, %5 : tensor<i1>, tensor<i32>
      %43 = stablehlo.compare LT, %6, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %44 = stablehlo.add %6, %c_1 : tensor<i32>
      %45 = stablehlo.select %43, %44, %6 : tensor<i1>, tensor<i32>
      %46 = stablehlo.dynamic_update_slice %iterArg_10, %17, %42, %45 : (tensor<256x256xf32>, tensor<128x128xf32>, tensor<i32>, tensor<i32>) -> tensor<256x256xf32>
      %47 = stablehlo.compare LT, %7, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %48 = stablehlo.add %7, %c_1 : tensor<i32>
      %49 = stablehlo.select %47, %48, %7 : tensor<i1>, tensor<i32>
      %50 = stablehlo.compare LT, %8, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %51 = stablehlo.add %8, %c_1 : tensor<i32>
      %52 = stablehlo.select %50, %51, %8 : tensor<i1>, tensor<i32>
      %53 = stablehlo.dynamic_update_slice %iterArg_11, %24, %49, %52 : (tensor<256x256xf32>, tensor<128x128xf32>, tensor<i32>, tensor<i32>) -> tensor<256x256xf32>
      %54 = stablehlo.compare LT, %9, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %55 = stablehlo.add %9, %c_1 : tensor<i32>
      %56 = stablehlo.select %54, %55, %9 : tensor<i1>, tensor<i32>
      %57 = stablehlo.compare LT, %10, %c_3, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %58 = stablehlo.add %10, %c_1 : tensor<i32>
      %59 = stablehlo.select %57, %58, %10 : tensor<i1>, tensor<i32>
      %60 = stablehlo.dynamic_update_slice %iterArg_12, %39, %56, %59 : (tensor<256x256xf32>, tensor<128x128xf32>, tensor<i32>, tensor<i32>) -> tensor<256x256xf32>
      %61 = stablehlo.add %iterArg_6, %c_0 : tensor<i32>
      %62 = stablehlo.add %iterArg_9, %c_0 : tensor<i32>
      %63 = func.call @_where(%c, %62, %iterArg_9) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %64 = stablehlo.compare EQ, %63, %c_4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %65 = func.call @_where_0(%64, %c_3, %63) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %66 = stablehlo.add %iterArg_8, %c_0 : tensor<i32>
      %67 = func.call @_where(%64, %66, %iterArg_8) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %68 = stablehlo.compare EQ, %67, %c_4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %69 = func.call @_where_0(%68, %c_3, %67) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %70 = stablehlo.add %iterArg_7, %c_0 : tensor<i32>
      %71 = func.call @_where(%68, %70, %iterArg_7) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %72 = stablehlo.compare EQ, %71, %c_4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %73 = func.call @_where_0(%72, %c_3, %71) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      stablehlo.return %iterArg, %61, %73, %69, %65, %46, %53, %60, %36 : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<256x256xf32>, tensor<256x256xf32>, tensor<256x256xf32>, tensor<128x128xf32>
    }
    return %4#7 : tensor<256x256xf32>
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
