module @jit_rms_norm attributes {jax.uses_shape_polymorphism = true, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<?x128xf32>, %arg1: tensor<128xf32>) -> (tensor<?x128xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<-1> : tensor<i32>
    %c_1 = stablehlo.constant dense<8> : tensor<i32>
    %c_2 = stablehlo.constant dense<1> : tensor<i32>
    %0 = stablehlo.get_dimension_size %arg0, dim = 0 : (tensor<?x128xf32>) -> tensor<i32>
    %1 = stablehlo.compare GE, %0, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.custom_call @shape_assertion(%1, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the polymorphic shapes specification. Expected value >= 1 for dimension variable 'B'. Using the following polymorphic shapes specifications: args[0].shape = (B, 128). Obtained dimension variables: 'B' = {0} from specification 'B' for dimension args[0].shape[0] (= {0}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>) -> ()
    %2:2 = call @divmod_1(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %3 = stablehlo.multiply %2#0, %c_1 : tensor<i32>
    %4 = stablehlo.convert %0 : tensor<i32>
    %5 = stablehlo.multiply %4, %c_0 : tensor<i32>
    %6 = stablehlo.add %3, %5 : tensor<i32>
    %7 = stablehlo.compare EQ, %6, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %8:2 = call @divmod_1(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %9 = stablehlo.multiply %8#0, %c_1 : tensor<i32>
    %10 = stablehlo.convert %0 : tensor<i32>
    %11 = stablehlo.multiply %10, %c_0 : tensor<i32>
    %12 = stablehlo.add %9, %11 : tensor<i32>
    stablehlo.custom_call @shape_assertion(%7, %12, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the symbolic shape constraint 8*floordiv(B, 8) == B. Expected '8*floordiv(B, 8) - B' to be equal to 0, but found {0}.  Using the following polymorphic shapes specifications: args[0].shape = (B, 128). Obtained dimension variables: 'B' = {1} from specification 'B' for dimension args[0].shape[0] (= {1}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>, tensor<i32>) -> ()
    %13:2 = call @divmod_1(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %14 = stablehlo.compare EQ, %13#1, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %15:2 = call @divmod_1(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    stablehlo.custom_call @shape_assertion(%14, %15#1, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the symbolic shape constraint mod(B, 8) == 0. Expected 'mod(B, 8)' to be equal to 0, but found {0}.  Using the following polymorphic shapes specifications: args[0].shape = (B, 128). Obtained dimension variables: 'B' = {1} from specification 'B' for dimension args[0].shape[0] (= {1}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>, tensor<i32>) -> ()
    %16 = call @_wrapped_jax_export_main(%0, %arg0, %arg1) : (tensor<i32>, tensor<?x128xf32>, tensor<128xf32>) -> tensor<?x128xf32>
    return %16 : tensor<?x128xf32>
  }
  func.func private @_wrapped_jax_export_main(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<?x128xf32>, %arg2: tensor<128xf32>) -> (tensor<?x128xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<1> : tensor<1xi32>
    %c_0 = stablehlo.constant dense<0> : tensor<1xi32>
    %c_1 = stablehlo.constant dense<true> : tensor<i1>
    %cst = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %cst_2 = stablehlo.constant dense<1.280000e+02> : tensor<f32>
    %cst_3 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %c_4 = stablehlo.constant dense<1> : tensor<i32>
    %c_5 = stablehlo.constant dense<-1> : tensor<i32>
    %c_6 = stablehlo.constant dense<0> : tensor<i32>
    %c_7 = stablehlo.constant dense<128> : tensor<1xi32>
    %c_8 = stablehlo.constant dense<128> : tensor<i32>
    %cst_9 = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %c_10 = stablehlo.constant dense<8> : tensor<i32>
    %0 = stablehlo.reshape %arg2 : (tensor<128xf32>) -> tensor<1x128xf32>
    %1:2 = call @divmod(%arg0, %arg0, %c_10) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %2 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %3 = stablehlo.concatenate %2, %c_7, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %4 = stablehlo.dynamic_broadcast_in_dim %cst_9, %3, dims = [] : (tensor<f32>, tensor<2xi32>) -> tensor<?x128xf32>
    %5 = call @_pad(%arg0, %arg1, %cst_9) : (tensor<i32>, tensor<?x128xf32>, tensor<f32>) -> tensor<?x128xf32>
    %6 = call @_pad(%arg0, %4, %cst_9) : (tensor<i32>, tensor<?x128xf32>, tensor<f32>) -> tensor<?x128xf32>
    %7:7 = stablehlo.while(%iterArg = %1#0, %iterArg_11 = %1#0, %iterArg_12 = %c_6, %iterArg_13 = %c_6, %iterArg_14 = %5, %iterArg_15 = %0, %iterArg_16 = %6) : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<?x128xf32>, tensor<1x128xf32>, tensor<?x128xf32>
    cond {
      %13 = stablehlo.convert %iterArg : tensor<i32>
      %14 = stablehlo.compare LT, %iterArg_12, %13, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      stablehlo.return %14 : tensor<i1>
    } do {
      %13 = stablehlo.multiply %c_10, %iterArg_13 : tensor<i32>
      %14 = stablehlo.multiply %c_10, %iterArg_13 : tensor<i32>
      %15 = stablehlo.convert %arg0 : tensor<i32>
      %16 = stablehlo.add %15, %c_5 : tensor<i32>
      %17:2 = func.call @divmod_0(%arg0, %16, %c_10) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
      %18 = stablehlo.multiply %17#0, %c_10 : tensor<i32>
      %19 = stablehlo.add %18, %c_10 : tensor<i32>
      %20 = stablehlo.convert %19 : tensor<i32>
      %21 = stablehlo.compare LT, %13, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %22 = stablehlo.add %13, %20 : tensor<i32>
      %23 = stablehlo.select %21, %22, %13 : tensor<i1>, tensor<i32>
      %24 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %25 = stablehlo.add %c_6, %c_8 : tensor<i32>
      %26 = stablehlo.select %24, %25, %c_6 : tensor<i1>, tensor<i32>
      %27 = stablehlo.dynamic_slice %iterArg_14, %23, %26, sizes = [8, 128] : (tensor<?x128xf32>, tensor<i32>, tensor<i32>) -> tensor<8x128xf32>
      %28 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %29 = stablehlo.add %c_6, %c_4 : tensor<i32>
      %30 = stablehlo.select %28, %29, %c_6 : tensor<i1>, tensor<i32>
      %31 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %32 = stablehlo.add %c_6, %c_8 : tensor<i32>
      %33 = stablehlo.select %31, %32, %c_6 : tensor<i1>, tensor<i32>
      %34 = stablehlo.dynamic_slice %iterArg_15, %30, %33, sizes = [1, 128] : (tensor<1x128xf32>, tensor<i32>, tensor<i32>) -> tensor<1x128xf32>
      %35 = stablehlo.convert %arg0 : tensor<i32>
      %36 = stablehlo.add %35, %c_5 : tensor<i32>
      %37:2 = func.call @divmod_0(%arg0, %36, %c_10) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
      %38 = stablehlo.multiply %27, %27 : tensor<8x128xf32>
      %39 = stablehlo.reduce(%38 init: %cst_3) applies stablehlo.add across dimensions = [1] : (tensor<8x128xf32>, tensor<f32>) -> tensor<8xf32>
      %40 = stablehlo.broadcast_in_dim %39, dims = [0] : (tensor<8xf32>) -> tensor<8x1xf32>
      %41 = stablehlo.broadcast_in_dim %cst_2, dims = [] : (tensor<f32>) -> tensor<8x1xf32>
      %42 = stablehlo.divide %40, %41 : tensor<8x1xf32>
      %43 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<8x1xf32>
      %44 = stablehlo.add %42, %43 : tensor<8x1xf32>
      %45 = stablehlo.rsqrt %44 : tensor<8x1xf32>
      %46 = stablehlo.broadcast_in_dim %45, dims = [0, 1] : (tensor<8x1xf32>) -> tensor<8x128xf32>
      %47 = stablehlo.multiply %27, %46 : tensor<8x128xf32>
      %48 = stablehlo.broadcast_in_dim %34, dims = [0, 1] : (tensor<1x128xf32>) -> tensor<8x128xf32>
      %49 = stablehlo.multiply %47, %48 : tensor<8x128xf32>
      %50 = stablehlo.convert %arg0 : tensor<i32>
      %51 = stablehlo.add %50, %c_5 : tensor<i32>
      %52:2 = func.call @divmod_0(%arg0, %51, %c_10) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
      %53 = stablehlo.multiply %52#0, %c_10 : tensor<i32>
      %54 = stablehlo.add %53, %c_10 : tensor<i32>
      %55 = stablehlo.convert %54 : tensor<i32>
      %56 = stablehlo.compare LT, %13, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %57 = stablehlo.add %13, %55 : tensor<i32>
      %58 = stablehlo.select %56, %57, %13 : tensor<i1>, tensor<i32>
      %59 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %60 = stablehlo.add %c_6, %c_8 : tensor<i32>
      %61 = stablehlo.select %59, %60, %c_6 : tensor<i1>, tensor<i32>
      %62 = stablehlo.dynamic_update_slice %iterArg_14, %27, %58, %61 : (tensor<?x128xf32>, tensor<8x128xf32>, tensor<i32>, tensor<i32>) -> tensor<?x128xf32>
      %63 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %64 = stablehlo.add %c_6, %c_4 : tensor<i32>
      %65 = stablehlo.select %63, %64, %c_6 : tensor<i1>, tensor<i32>
      %66 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %67 = stablehlo.add %c_6, %c_8 : tensor<i32>
      %68 = stablehlo.select %66, %67, %c_6 : tensor<i1>, tensor<i32>
      %69 = stablehlo.dynamic_update_slice %iterArg_15, %34, %65, %68 : (tensor<1x128xf32>, tensor<1x128xf32>, tensor<i32>, tensor<i32>) -> tensor<1x128xf32>
      %70 = stablehlo.convert %arg0 : tensor<i32>
      %71 = stablehlo.add %70, %c_5 : tensor<i32>
      %72:2 = func.call @divmod_0(%arg0, %71, %c_10) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
      %73 = stablehlo.multiply %72#0, %c_10 : tensor<i32>
      %74 = stablehlo.add %73, %c_10 : tensor<i32>
      %75 = stablehlo.convert %74 : tensor<i32>
      %76 = stablehlo.compare LT, %14, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %77 = stablehlo.add %14, %75 : tensor<i32>
      %78 = stablehlo.select %76, %77, %14 : tensor<i1>, tensor<i32>
      %79 = stablehlo.compare LT, %c_6, %c_6, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %80 = stablehlo.add %c_6, %c_8 : tensor<i32>
      %81 = stablehlo.select %79, %80, %c_6 : tensor<i1>, tensor<i32>
      %82 = stablehlo.dynamic_update_slice %iterArg_16, %49, %78, %81 : (tensor<?x128xf32>, tensor<8x128xf32>, tensor<i32>, tensor<i32>) -> tensor<?x128xf32>
      %83 = stablehlo.add %iterArg_12, %c_4 : tensor<i32>
      %84 = stablehlo.add %iterArg_13, %c_4 : tensor<i32>
      %85 = func.call @_where(%arg0, %c_1, %84, %iterArg_13) : (tensor<i32>, tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      %86 = stablehlo.convert %iterArg_11 : tensor<i32>
      %87 = stablehlo.compare EQ, %86, %85, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %88 = func.call @_where_1(%arg0, %87, %c_6, %85) : (tensor<i32>, tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
      stablehlo.return %iterArg, %iterArg_11, %83, %88, %62, %69, %82 : tensor<i32>, tensor<i32>, tensor<i32>, tensor<i32>, tensor<?x128xf32>, tensor<1x128xf32>, tensor<?x128xf32>
    }
    %8 = stablehlo.concatenate %c_0, %c_0, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %9 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %10 = stablehlo.concatenate %9, %c_7, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %11 = stablehlo.concatenate %c, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %12 = stablehlo.real_dynamic_slice %7#6, %8, %10, %11 : (tensor<?x128xf32>, tensor<2xi32>, tensor<2xi32>, tensor<2xi32>) -> tensor<?x128xf32>
    return %12 : tensor<?x128xf32>
  }
  func.func private @divmod(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<i32>, %arg2: tensor<i32>) -> (tensor<i32>, tensor<i32>) {
    %0 = stablehlo.convert %arg1 : tensor<i32>
    %1 = call @floor_divide(%arg0, %0, %arg2) : (tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = call @remainder(%arg0, %0, %arg2) : (tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<i32>
    return %1, %2 : tensor<i32>, tensor<i32>
  }
  func.func private @floor_divide(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.divide %arg1, %arg2 : tensor<i32>
    %1 = stablehlo.sign %arg1 : tensor<i32>
    %2 = stablehlo.sign %arg2 : tensor<i32>
    %3 = stablehlo.compare NE, %1, %2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %4 = stablehlo.remainder %arg1, %arg2 : tensor<i32>
    %5 = stablehlo.compare NE, %4, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.and %3, %5 : tensor<i1>
    %7 = stablehlo.subtract %0, %c : tensor<i32>
    %8 = call @_where(%arg0, %6, %7, %0) : (tensor<i32>, tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    return %8 : tensor<i32>
  }
  func.func private @_where(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<i1>, %arg2: tensor<i32>, %arg3: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.select %arg1, %arg2, %arg3 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @remainder(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<i32>, %arg2: tensor<i32>) -> tensor<i32> {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.compare EQ, %arg2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %1 = call @_where(%arg0, %0, %c, %arg2) : (tensor<i32>, tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = stablehlo.remainder %arg1, %1 : tensor<i32>
    %3 = stablehlo.compare NE, %2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %4 = stablehlo.compare LT, %2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %5 = stablehlo.compare LT, %1, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.compare NE, %4, %5, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
    %7 = stablehlo.and %6, %3 : tensor<i1>
    %8 = stablehlo.add %2, %1 : tensor<i32>
    %9 = stablehlo.select %7, %8, %2 : tensor<i1>, tensor<i32>
    return %9 : tensor<i32>
  }
  func.func private @_pad(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<?x128xf32>, %arg2: tensor<f32>) -> tensor<?x128xf32> {
    %c = stablehlo.constant dense<8> : tensor<i32>
    %c_0 = stablehlo.constant dense<-1> : tensor<i32>
    %c_1 = stablehlo.constant dense<0> : tensor<1xi32>
    %0 = stablehlo.concatenate %c_1, %c_1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %1 = stablehlo.convert %arg0 : tensor<i32>
    %2 = stablehlo.add %1, %c_0 : tensor<i32>
    %3:2 = call @divmod_0(%arg0, %2, %c) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %4 = stablehlo.multiply %3#0, %c : tensor<i32>
    %5 = stablehlo.convert %arg0 : tensor<i32>
    %6 = stablehlo.multiply %5, %c_0 : tensor<i32>
    %7 = stablehlo.add %4, %6 : tensor<i32>
    %8 = stablehlo.add %7, %c : tensor<i32>
    %9 = stablehlo.reshape %8 : (tensor<i32>) -> tensor<1xi32>
    %10 = stablehlo.concatenate %9, %c_1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %11 = stablehlo.concatenate %c_1, %c_1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %12 = stablehlo.dynamic_pad %arg1, %arg2, %0, %10, %11 : (tensor<?x128xf32>, tensor<f32>, tensor<2xi32>, tensor<2xi32>, tensor<2xi32>) -> tensor<?x128xf32>
    return %12 : tensor<?x128xf32>
  }
  func.func private @divmod_0(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<i32>, %arg2: tensor<i32>) -> (tensor<i32>, tensor<i32>) {
    %0 = call @floor_divide(%arg0, %arg1, %arg2) : (tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %1 = call @remainder(%arg0, %arg1, %arg2) : (tensor<i32>, tensor<i32>, tensor<i32>) -> tensor<i32>
    return %0, %1 : tensor<i32>, tensor<i32>
  }
  func.func private @_where_1(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<i1>, %arg2: tensor<i32>, %arg3: tensor<i32>) -> tensor<i32> {
    %0 = stablehlo.convert %arg2 : tensor<i32>
    %1 = stablehlo.select %arg1, %0, %arg3 : tensor<i1>, tensor<i32>
    return %1 : tensor<i32>
  }
  func.func private @divmod_1(%arg0: tensor<i32> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}) -> (tensor<i32>, tensor<i32>) {
    %0 = stablehlo.convert %arg0 : tensor<i32>
    %1 = call @floor_divide_2(%0, %arg1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = call @remainder_4(%0, %arg1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    return %1, %2 : tensor<i32>, tensor<i32>
  }
  func.func private @floor_divide_2(%arg0: tensor<i32> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}) -> tensor<i32> {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.divide %arg0, %arg1 : tensor<i32>
    %1 = stablehlo.sign %arg0 : tensor<i32>
    %2 = stablehlo.sign %arg1 : tensor<i32>
    %3 = stablehlo.compare NE, %1, %2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %4 = stablehlo.remainder %arg0, %arg1 : tensor<i32>
    %5 = stablehlo.compare NE, %4, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.and %3, %5 : tensor<i1>
    %7 = stablehlo.subtract %0, %c : tensor<i32>
    %8 = call @_where_3(%6, %7, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    return %8 : tensor<i32>
  }
  func.func private @_where_3(%arg0: tensor<i1> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}, %arg2: tensor<i32> {jax.global_constant = ""}) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @remainder_4(%arg0: tensor<i32> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}) -> tensor<i32> {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.compare EQ, %arg1, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %1 = call @_where_3(%0, %c, %arg1) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = stablehlo.remainder %arg0, %1 : tensor<i32>
    %3 = stablehlo.compare NE, %2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %4 = stablehlo.compare LT, %2, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %5 = stablehlo.compare LT, %1, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %6 = stablehlo.compare NE, %4, %5, UNSIGNED : (tensor<i1>, tensor<i1>) -> tensor<i1>
    %7 = stablehlo.and %6, %3 : tensor<i1>
    %8 = stablehlo.add %2, %1 : tensor<i32>
    %9 = stablehlo.select %7, %8, %2 : tensor<i1>, tensor<i32>
    return %9 : tensor<i32>
  }
}
