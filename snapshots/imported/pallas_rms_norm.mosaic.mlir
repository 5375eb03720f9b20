// kernel _rms_norm_kernel
module @_rms_norm_kernel attributes {stable_mosaic.version = 15 : i64} {
  func.func @_rms_norm_kernel(%arg0: i32, %arg1: memref<8x128xf32, #tpu.memory_space<vmem>>, %arg2: memref<1x128xf32, #tpu.memory_space<vmem>>, %arg3: memref<8x128xf32, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<arbitrary>], iteration_bounds = array<i64: -9223372036854775808>, scalar_prefetch = 0 : i64, scratch_operands = 0 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @transform_0, window_bounds = array<i64: 8, 128>}, {pipeline_mode = #tpu.pipeline_mode<synchronous>, transform_indices = @transform_1, window_bounds = array<i64: 1, 128>}, {transform_indices = @transform_2, window_bounds = array<i64: 8, 128>}]} {
    %c0 = arith.constant 0 : index
    %c0_0 = arith.constant 0 : index
    %0 = vector.load %arg1[%c0, %c0_0] : memref<8x128xf32, #tpu.memory_space<vmem>>, vector<8x128xf32>
    %1 = arith.mulf %0, %0 : vector<8x128xf32>
    %cst = arith.constant dense<0.000000e+00> : vector<8xf32>
    %2 = vector.multi_reduction <add>, %1, %cst [1] : vector<8x128xf32> to vector<8xf32>
    %3 = vector.shape_cast %2 : vector<8xf32> to vector<8x1xf32>
    %cst_1 = arith.constant 1.280000e+02 : f32
    %4 = vector.broadcast %cst_1 : f32 to vector<8x1xf32>
    %5 = arith.divf %3, %4 : vector<8x1xf32>
    %cst_2 = arith.constant 9.99999997E-7 : f32
    %6 = vector.broadcast %cst_2 : f32 to vector<8x1xf32>
    %7 = arith.addf %5, %6 : vector<8x1xf32>
    %8 = math.rsqrt %7 : vector<8x1xf32>
    %9 = vector.broadcast %8 : vector<8x1xf32> to vector<8x128xf32>
    %10 = arith.mulf %0, %9 : vector<8x128xf32>
    %c0_3 = arith.constant 0 : index
    %c0_4 = arith.constant 0 : index
    %11 = vector.load %arg2[%c0_3, %c0_4] : memref<1x128xf32, #tpu.memory_space<vmem>>, vector<1x128xf32>
    %12 = vector.broadcast %11 : vector<1x128xf32> to vector<8x128xf32>
    %13 = arith.mulf %10, %12 : vector<8x128xf32>
    %c0_5 = arith.constant 0 : index
    %c0_6 = arith.constant 0 : index
    %14 = vector.load %arg3[%c0_5, %c0_6] : memref<8x128xf32, #tpu.memory_space<vmem>>, vector<8x128xf32>
    tpu.vector_store %arg3[%c0_5, %c0_6], %13 {strides = array<i32>} : memref<8x128xf32, #tpu.memory_space<vmem>>, vector<8x128xf32>, 
    return
  }
  func.func @transform_0(%arg0: i32) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %c0_i32 : i32, i32
  }
  func.func @transform_1(%arg0: i32) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    %c0_i32_1 = arith.constant 0 : i32
    return %c0_i32, %c0_i32_0 : i32, i32
  }
  func.func @transform_2(%arg0: i32) -> (i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %c0_i32 : i32, i32
  }
}

