module @jit_rms_norm_rows attributes {jax.uses_shape_polymorphism = true, mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<?x512xf32>, %arg1: tensor<512xf32>) -> (tensor<?x512xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<1> : tensor<i32>
    %0 = stablehlo.get_dimension_size %arg0, dim = 0 : (tensor<?x512xf32>) -> tensor<i32>
    %1 = stablehlo.compare GE, %0, %c, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.custom_call @shape_assertion(%1, %0) {api_version = 2 : i32, error_message = "Input shapes do not match the polymorphic shapes specification. Expected value >= 1 for dimension variable 'b'. Using the following polymorphic shapes specifications: args[0].shape = (b, 512). Obtained dimension variables: 'b' = {0} from specification 'b' for dimension args[0].shape[0] (= {0}), . Please see https://docs.jax.dev/en/latest/501/shape-polymorphism.html#shape-assertion-errors for more details.", has_side_effect = true} : (tensor<i1>, tensor<i32>) -> ()
    %2 = call @_wrapped_jax_export_main(%0, %arg0, %arg1) : (tensor<i32>, tensor<?x512xf32>, tensor<512xf32>) -> tensor<?x512xf32>
    return %2 : tensor<?x512xf32>
  }
  func.func private @_wrapped_jax_export_main(%arg0: tensor<i32> {jax.global_constant = "b"}, %arg1: tensor<?x512xf32>, %arg2: tensor<512xf32>) -> (tensor<?x512xf32> {jax.result_info = "result"}) {
    %c = stablehlo.constant dense<512> : tensor<1xi32>
    %cst = stablehlo.constant dense<9.99999997E-7> : tensor<f32>
    %cst_0 = stablehlo.constant dense<5.120000e+02> : tensor<f32>
    %c_1 = stablehlo.constant dense<1> : tensor<1xi32>
    %cst_2 = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %0 = stablehlo.multiply %arg1, %arg1 : tensor<?x512xf32>
    %1 = stablehlo.reduce(%0 init: %cst_2) applies stablehlo.add across dimensions = [1] : (tensor<?x512xf32>, tensor<f32>) -> tensor<?xf32>
    %2 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %3 = stablehlo.concatenate %2, %c_1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %4 = stablehlo.dynamic_broadcast_in_dim %1, %3, dims = [0] : (tensor<?xf32>, tensor<2xi32>) -> tensor<?x1xf32>
    %5 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %6 = stablehlo.concatenate %5, %c_1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %7 = stablehlo.dynamic_broadcast_in_dim %cst_0, %6, dims = [] : (tensor<f32>, tensor<2xi32>) -> tensor<?x1xf32>
    %8 = stablehlo.divide %4, %7 : tensor<?x1xf32>
    %9 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %10 = stablehlo.concatenate %9, %c_1, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %11 = stablehlo.dynamic_broadcast_in_dim %cst, %10, dims = [] : (tensor<f32>, tensor<2xi32>) -> tensor<?x1xf32>
    %12 = stablehlo.add %8, %11 : tensor<?x1xf32>
    %13 = stablehlo.rsqrt %12 : tensor<?x1xf32>
    %14 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %15 = stablehlo.concatenate %14, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %16 = stablehlo.dynamic_broadcast_in_dim %13, %15, dims = [0, 1] : (tensor<?x1xf32>, tensor<2xi32>) -> tensor<?x512xf32>
    %17 = stablehlo.multiply %arg1, %16 : tensor<?x512xf32>
    %18 = stablehlo.broadcast_in_dim %arg2, dims = [1] : (tensor<512xf32>) -> tensor<1x512xf32>
    %19 = stablehlo.reshape %arg0 : (tensor<i32>) -> tensor<1xi32>
    %20 = stablehlo.concatenate %19, %c, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %21 = stablehlo.dynamic_broadcast_in_dim %18, %20, dims = [0, 1] : (tensor<1x512xf32>, tensor<2xi32>) -> tensor<?x512xf32>
    %22 = stablehlo.multiply %17, %21 : tensor<?x512xf32>
    return %22 : tensor<?x512xf32>
  }
}
