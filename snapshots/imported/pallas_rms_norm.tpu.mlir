module @jit_rms_norm attributes {jax.uses_shape_polymorphism = true, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<?x128xf32>, %arg1: tensor<128xf32>) -> (tensor<?x128xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %c_0 = stablehlo.constant dense<-1> : tensor<i32>
    %c_1 = stablehlo.constant dense<8> : tensor<i32>
    %c_2 = stablehlo.constant dense<1> : tensor<i32>
    %0 = stablehlo.get_dimension_size %arg0, dim = 0 : (tensor<?x128xf32>) -> tensor<i32>
    %1 = stablehlo.compare GE, %0, %c_2, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.custom_call @shape_assertion(%1, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the polymorphic shapes specification. Expected value >= 1 for dimension variable 'B'. Using the following polymorphic shapes specifications: args[0].shape = (B, 128). Obtained dimension variables: 'B' = {0} from specification 'B' for dimension args[0].shape[0] (= {0}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>) -> ()
    %2:2 = call @divmod_0(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %3 = stablehlo.multiply %2#0, %c_1 : tensor<i32>
    %4 = stablehlo.convert %0 : tensor<i32>
    %5 = stablehlo.multiply %4, %c_0 : tensor<i32>
    %6 = stablehlo.add %3, %5 : tensor<i32>
    %7 = stablehlo.compare EQ, %6, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %8:2 = call @divmod_0(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %9 = stablehlo.multiply %8#0, %c_1 : tensor<i32>
    %10 = stablehlo.convert %0 : tensor<i32>
    %11 = stablehlo.multiply %10, %c_0 : tensor<i32>
    %12 = stablehlo.add %9, %11 : tensor<i32>
    stablehlo.custom_call @shape_assertion(%7, %12, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the symbolic shape constraint 8*floordiv(B, 8) == B. Expected '8*floordiv(B, 8) - B' to be equal to 0, but found {0}.  Using the following polymorphic shapes specifications: args[0].shape = (B, 128). Obtained dimension variables: 'B' = {1} from specification 'B' for dimension args[0].shape[0] (= {1}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>, tensor<i32>) -> ()
    %13:2 = call @divmod_0(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %14 = stablehlo.compare EQ, %13#1, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %15:2 = call @divmod_0(%0, %c_1) : (tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    stablehlo.custom_call @shape_assertion(%14, %15#1, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the symbolic shape constraint mod(B, 8) == 0. Expected 'mod(B, 8)' to be equal to 0, but found {0}.  Using the following polymorphic shapes specifications: args[0].shape = (B, 128). Obtained dimension variables: 'B' = {1} from specification 'B' for dimension args[0].shape[0] (= {1}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>, tensor<i32>) -> ()
    %16 = call @_wrapped_jax_export_main(%0, %arg0, %arg1) : (tensor<i32>, tensor<?x128xf32>, tensor<128xf32>) -> tensor<?x128xf32>
    return %16 : tensor<?x128xf32>
  }
  func.func private @_wrapped_jax_export_main(%arg0: tensor<i32> {jax.global_constant = "B"}, %arg1: tensor<?x128xf32>, %arg2: tensor<128xf32>) -> (tensor<?x128xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<128> : tensor<1xi32>
    %c_0 = stablehlo.constant dense<8> : tensor<i32>
    %0 = stablehlo.reshape %arg2 : (tensor<128xf32>) -> tensor<1x128xf32>
    %1:2 = call @divmod(%arg0, %arg0, %c_0) : (tensor<i32>, tensor<i32>, tensor<i32>) -> (tensor<i32>, tensor<i32>)
    %2 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %3 = stablehlo.concatenate %2, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %4 = stablehlo.custom_call @tpu_custom_call(%1#0, %arg1, %0, %3) {backend_config = "{\22custom_call_config\22: {\22body\22: \22<mosaic body: see pallas_rms_norm.mosaic.mlir>\22, \22serialization_format\22: 1, \22needs_layout_passes\22: true}}", indices_of_shape_operands = dense<3> : tensor<1xi64>, kernel_name = "_rms_norm_kernel", mhlo.frontend_attributes = {kernel_metadata = "{}"}, operand_layouts = [dense<> : tensor<0xindex>, dense<[1, 0]> : tensor<2xindex>, dense<[1, 0]> : tensor<2xindex>, dense<0> : tensor<1xindex>], result_layouts = [dense<[1, 0]> : tensor<2xindex>]} : (tensor<i32>, tensor<?x128xf32>, tensor<1x128xf32>, tensor<2xi32>) -> tensor<?x128xf32>
    return %4 : tensor<?x128xf32>
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
  func.func private @divmod_0(%arg0: tensor<i32> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}) -> (tensor<i32>, tensor<i32>) {
    %0 = stablehlo.convert %arg0 : tensor<i32>
    %1 = call @floor_divide_1(%0, %arg1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    %2 = call @remainder_3(%0, %arg1) : (tensor<i32>, tensor<i32>) -> tensor<i32>
    return %1, %2 : tensor<i32>, tensor<i32>
  }
  func.func private @floor_divide_1(%arg0: tensor<i32> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}) -> tensor<i32> {
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
    %8 = call @_where_2(%6, %7, %0) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
    return %8 : tensor<i32>
  }
  func.func private @_where_2(%arg0: tensor<i1> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}, %arg2: tensor<i32> {jax.global_constant = ""}) -> tensor<i32> {
    %0 = stablehlo.select %arg0, %arg1, %arg2 : tensor<i1>, tensor<i32>
    return %0 : tensor<i32>
  }
  func.func private @remainder_3(%arg0: tensor<i32> {jax.global_constant = ""}, %arg1: tensor<i32> {jax.global_constant = ""}) -> tensor<i32> {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %c_0 = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.compare EQ, %arg1, %c_0, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    %1 = call @_where_2(%0, %c, %arg1) : (tensor<i1>, tensor<i32>, tensor<i32>) -> tensor<i32>
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
