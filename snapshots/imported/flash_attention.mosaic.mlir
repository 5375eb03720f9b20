// kernel _flash_attention_kernel
module @_flash_attention_kernel attributes {stable_mosaic.version = 15 : i64} {
  func.func @_flash_attention_kernel(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: i32, %arg4: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, %arg5: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, %arg6: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, %arg7: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, %arg8: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, %arg9: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, %arg10: memref<1x1x128x128xf32, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<arbitrary>], iteration_bounds = array<i64: 1, 2, 2, 2>, scalar_prefetch = 0 : i64, scratch_operands = 3 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @transform_0, window_bounds = array<i64: 1, 1, 128, 128>}, {transform_indices = @transform_1, window_bounds = array<i64: 1, 1, 128, 128>}, {transform_indices = @transform_2, window_bounds = array<i64: 1, 1, 128, 128>}, {transform_indices = @transform_3, window_bounds = array<i64: 1, 1, 128, 128>}]} {
    %c0_i32 = arith.constant 0 : i32
    %0 = arith.cmpi eq, %arg3, %c0_i32 : i32
    %1 = arith.extui %0 : i1 to i32
    %c0_i32_0 = arith.constant 0 : i32
    %2 = arith.cmpi ne, %1, %c0_i32_0 : i32
    scf.if %2 {
      %cst_53 = arith.constant 0xFF800000 : f32
      %63 = vector.broadcast %cst_53 : f32 to vector<128x128xf32>
      %c0_54 = arith.constant 0 : index
      %c0_55 = arith.constant 0 : index
      %c0_56 = arith.constant 0 : index
      %c0_57 = arith.constant 0 : index
      %64 = vector.load %arg8[%c0_54, %c0_55, %c0_56, %c0_57] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
      %65 = vector.shape_cast %64 : vector<1x1x128x128xf32> to vector<128x128xf32>
      %66 = vector.shape_cast %63 : vector<128x128xf32> to vector<1x1x128x128xf32>
      tpu.vector_store %arg8[%c0_54, %c0_55, %c0_56, %c0_57], %66 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
      %cst_58 = arith.constant 0.000000e+00 : f32
      %67 = vector.broadcast %cst_58 : f32 to vector<128x128xf32>
      %c0_59 = arith.constant 0 : index
      %c0_60 = arith.constant 0 : index
      %c0_61 = arith.constant 0 : index
      %c0_62 = arith.constant 0 : index
      %68 = vector.load %arg9[%c0_59, %c0_60, %c0_61, %c0_62] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
      %69 = vector.shape_cast %68 : vector<1x1x128x128xf32> to vector<128x128xf32>
      %70 = vector.shape_cast %67 : vector<128x128xf32> to vector<1x1x128x128xf32>
      tpu.vector_store %arg9[%c0_59, %c0_60, %c0_61, %c0_62], %70 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
      %cst_63 = arith.constant 0.000000e+00 : f32
      %71 = vector.broadcast %cst_63 : f32 to vector<128x128xf32>
      %c0_64 = arith.constant 0 : index
      %c0_65 = arith.constant 0 : index
      %c0_66 = arith.constant 0 : index
      %c0_67 = arith.constant 0 : index
      %72 = vector.load %arg10[%c0_64, %c0_65, %c0_66, %c0_67] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
      %73 = vector.shape_cast %72 : vector<1x1x128x128xf32> to vector<128x128xf32>
      %74 = vector.shape_cast %71 : vector<128x128xf32> to vector<1x1x128x128xf32>
      tpu.vector_store %arg10[%c0_64, %c0_65, %c0_66, %c0_67], %74 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
    } else {
    }
    %c0_i32_1 = arith.constant 0 : i32
    %c128_i32 = arith.constant 128 : i32
    %3 = arith.muli %c0_i32_1, %c128_i32 : i32
    %c0_i32_2 = arith.constant 0 : i32
    %4 = arith.addi %c0_i32_2, %3 : i32
    %c0 = arith.constant 0 : index
    %c0_3 = arith.constant 0 : index
    %c0_4 = arith.constant 0 : index
    %c0_5 = arith.constant 0 : index
    %5 = vector.load %arg8[%c0, %c0_3, %c0_4, %c0_5] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %6 = vector.shape_cast %5 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %c0_6 = arith.constant 0 : index
    %c0_7 = arith.constant 0 : index
    %c0_8 = arith.constant 0 : index
    %c0_9 = arith.constant 0 : index
    %7 = vector.load %arg9[%c0_6, %c0_7, %c0_8, %c0_9] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %8 = vector.shape_cast %7 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %c0_10 = arith.constant 0 : index
    %c0_11 = arith.constant 0 : index
    %c0_12 = arith.constant 0 : index
    %c0_13 = arith.constant 0 : index
    %9 = vector.load %arg4[%c0_10, %c0_11, %c0_12, %c0_13] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %10 = vector.shape_cast %9 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %c0_14 = arith.constant 0 : index
    %c0_15 = arith.constant 0 : index
    %11 = arith.index_cast %4 : i32 to index
    %c0_16 = arith.constant 0 : index
    %12 = vector.load %arg5[%c0_14, %c0_15, %11, %c0_16] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %13 = vector.shape_cast %12 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %cst = arith.constant dense<0.000000e+00> : vector<128x128xf32>
    %14 = tpu.matmul %10, %13, %cst {dimension_numbers = #tpu.dot_dimension_numbers<[1], [1], [0], [0], [0, 0, 1, 0], [], []>, transpose_lhs_hint = false} : vector<128x128xf32>, vector<128x128xf32>, vector<128x128xf32> -> vector<128x128xf32>
    %cst_17 = arith.constant 0.0883883461 : f32
    %15 = vector.broadcast %cst_17 : f32 to vector<128x128xf32>
    %16 = arith.mulf %14, %15 : vector<128x128xf32>
    %cst_18 = arith.constant dense<0xFF800000> : vector<128xf32>
    %17 = vector.multi_reduction <maximumf>, %16, %cst_18 [1] : vector<128x128xf32> to vector<128xf32>
    %18 = vector.shape_cast %17 : vector<128xf32> to vector<128x1xf32>
    %19 = vector.broadcast %18 : vector<128x1xf32> to vector<128x128xf32>
    %20 = arith.maximumf %6, %19 : vector<128x128xf32>
    %21 = arith.subf %16, %20 : vector<128x128xf32>
    %22 = math.exp %21 : vector<128x128xf32>
    %23 = arith.subf %6, %20 : vector<128x128xf32>
    %24 = math.exp %23 : vector<128x128xf32>
    %25 = arith.mulf %24, %8 : vector<128x128xf32>
    %cst_19 = arith.constant dense<0.000000e+00> : vector<128xf32>
    %26 = vector.multi_reduction <add>, %22, %cst_19 [1] : vector<128x128xf32> to vector<128xf32>
    %27 = vector.shape_cast %26 : vector<128xf32> to vector<128x1xf32>
    %28 = vector.broadcast %27 : vector<128x1xf32> to vector<128x128xf32>
    %29 = arith.addf %28, %25 : vector<128x128xf32>
    %c0_20 = arith.constant 0 : index
    %c0_21 = arith.constant 0 : index
    %c0_22 = arith.constant 0 : index
    %c0_23 = arith.constant 0 : index
    %30 = vector.load %arg9[%c0_20, %c0_21, %c0_22, %c0_23] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %31 = vector.shape_cast %30 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %32 = vector.shape_cast %29 : vector<128x128xf32> to vector<1x1x128x128xf32>
    tpu.vector_store %arg9[%c0_20, %c0_21, %c0_22, %c0_23], %32 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
    %c0_24 = arith.constant 0 : index
    %c0_25 = arith.constant 0 : index
    %c0_26 = arith.constant 0 : index
    %c0_27 = arith.constant 0 : index
    %33 = vector.load %arg8[%c0_24, %c0_25, %c0_26, %c0_27] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %34 = vector.shape_cast %33 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %35 = vector.shape_cast %20 : vector<128x128xf32> to vector<1x1x128x128xf32>
    tpu.vector_store %arg8[%c0_24, %c0_25, %c0_26, %c0_27], %35 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
    %cst_28 = arith.constant 0.000000e+00 : f32
    %36 = vector.broadcast %cst_28 : f32 to vector<128x128xf32>
    %37 = arith.cmpf oeq, %29, %36 : vector<128x128xf32>
    %cst_29 = arith.constant 1.000000e+00 : f32
    %38 = vector.broadcast %cst_29 : f32 to vector<128x128xf32>
    %39 = arith.divf %38, %29 : vector<128x128xf32>
    %cst_30 = arith.constant 1.000000e+00 : f32
    %40 = vector.broadcast %cst_30 : f32 to vector<128x128xf32>
    %41 = arith.select %37, %40, %39 : vector<128x128xi1>, vector<128x128xf32>
    %c0_31 = arith.constant 0 : index
    %c0_32 = arith.constant 0 : index
    %c0_33 = arith.constant 0 : index
    %c0_34 = arith.constant 0 : index
    %42 = vector.load %arg10[%c0_31, %c0_32, %c0_33, %c0_34] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %43 = vector.shape_cast %42 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %44 = arith.mulf %25, %41 : vector<128x128xf32>
    %45 = arith.mulf %43, %44 : vector<128x128xf32>
    %c0_35 = arith.constant 0 : index
    %c0_36 = arith.constant 0 : index
    %c0_37 = arith.constant 0 : index
    %c0_38 = arith.constant 0 : index
    %46 = vector.load %arg10[%c0_35, %c0_36, %c0_37, %c0_38] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %47 = vector.shape_cast %46 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %48 = vector.shape_cast %45 : vector<128x128xf32> to vector<1x1x128x128xf32>
    tpu.vector_store %arg10[%c0_35, %c0_36, %c0_37, %c0_38], %48 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
    %c0_39 = arith.constant 0 : index
    %c0_40 = arith.constant 0 : index
    %49 = arith.index_cast %4 : i32 to index
    %c0_41 = arith.constant 0 : index
    %50 = vector.load %arg6[%c0_39, %c0_40, %49, %c0_41] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %51 = vector.shape_cast %50 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %cst_42 = arith.constant dense<0.000000e+00> : vector<128x128xf32>
    %52 = tpu.matmul %22, %51, %cst_42 {dimension_numbers = #tpu.dot_dimension_numbers<[1], [0], [0], [1], [0, 0, 1, 1], [], []>, transpose_lhs_hint = false} : vector<128x128xf32>, vector<128x128xf32>, vector<128x128xf32> -> vector<128x128xf32>
    %c0_43 = arith.constant 0 : index
    %c0_44 = arith.constant 0 : index
    %c0_45 = arith.constant 0 : index
    %c0_46 = arith.constant 0 : index
    %53 = vector.load %arg10[%c0_43, %c0_44, %c0_45, %c0_46] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %54 = vector.shape_cast %53 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %55 = arith.mulf %52, %41 : vector<128x128xf32>
    %56 = arith.addf %54, %55 : vector<128x128xf32>
    %c0_47 = arith.constant 0 : index
    %c0_48 = arith.constant 0 : index
    %c0_49 = arith.constant 0 : index
    %c0_50 = arith.constant 0 : index
    %57 = vector.load %arg10[%c0_47, %c0_48, %c0_49, %c0_50] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
    %58 = vector.shape_cast %57 : vector<1x1x128x128xf32> to vector<128x128xf32>
    %59 = vector.shape_cast %56 : vector<128x128xf32> to vector<1x1x128x128xf32>
    tpu.vector_store %arg10[%c0_47, %c0_48, %c0_49, %c0_50], %59 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
    %c1_i32 = arith.constant 1 : i32
    %c1_i32_51 = arith.constant 1 : i32
    %60 = arith.cmpi eq, %arg3, %c1_i32_51 : i32
    %61 = arith.extui %60 : i1 to i32
    %c0_i32_52 = arith.constant 0 : i32
    %62 = arith.cmpi ne, %61, %c0_i32_52 : i32
    scf.if %62 {
      %c0_53 = arith.constant 0 : index
      %c0_54 = arith.constant 0 : index
      %c0_55 = arith.constant 0 : index
      %c0_56 = arith.constant 0 : index
      %63 = vector.load %arg10[%c0_53, %c0_54, %c0_55, %c0_56] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
      %64 = vector.shape_cast %63 : vector<1x1x128x128xf32> to vector<128x128xf32>
      %c0_57 = arith.constant 0 : index
      %c0_58 = arith.constant 0 : index
      %c0_59 = arith.constant 0 : index
      %c0_60 = arith.constant 0 : index
      %65 = vector.load %arg7[%c0_57, %c0_58, %c0_59, %c0_60] : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>
      %66 = vector.shape_cast %65 : vector<1x1x128x128xf32> to vector<128x128xf32>
      %67 = vector.shape_cast %64 : vector<128x128xf32> to vector<1x1x128x128xf32>
      tpu.vector_store %arg7[%c0_57, %c0_58, %c0_59, %c0_60], %67 {strides = array<i32>} : memref<1x1x128x128xf32, #tpu.memory_space<vmem>>, vector<1x1x128x128xf32>, 
    } else {
    }
    return
  }
  func.func @transform_0(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: i32) -> (i32, i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %arg2, %c0_i32 : i32, i32, i32, i32
  }
  func.func @transform_1(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: i32) -> (i32, i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %arg3, %c0_i32 : i32, i32, i32, i32
  }
  func.func @transform_2(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: i32) -> (i32, i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %arg3, %c0_i32 : i32, i32, i32, i32
  }
  func.func @transform_3(%arg0: i32, %arg1: i32, %arg2: i32, %arg3: i32) -> (i32, i32, i32, i32) {
    %c0_i32 = arith.constant 0 : i32
    %c0_i32_0 = arith.constant 0 : i32
    return %arg0, %arg1, %arg2, %c0_i32 : i32, i32, i32, i32
  }
}

